// Copyright TileMaxSim authors. Encoders and decoders of a store's values.

#include <nlohmann/json.hpp>

#include "index/store/format.h"

namespace tms::index {

std::string encode_vector_ref(const VectorRef& r) {
    std::string v;
    put1<uint32_t>(&v, kVectorRefMagic);
    put1<uint64_t>(&v, r.offset);
    put1<uint64_t>(&v, r.bytes);
    put1<uint32_t>(&v, r.crc);
    seal(&v);
    return v;
}

// A sealed ids value -> exactly `n` ids into out[0..n).
Status decode_ids(const std::string& what, const rocksdb::Slice& v, size_t n, std::string* out) {
    size_t i = 0;
    TMS_RETURN_IF_ERROR(for_each_id(what, v, [&](std::string_view id) {
        if (i == n) return Status::Corruption(what + ": more ids than documents");
        out[i++].assign(id);
        return Status::OK();
    }));
    if (i != n) return Status::Corruption(what + ": value truncated");
    return Status::OK();
}

// `first_doc`: the global id of a shard's first document (0 for an unsharded index).
std::string info_json(const IndexInfo& info, const IndexModel& m, int chunk_docs, int64_t first_doc) {
    nlohmann::json j;
    if (first_doc != 0) j["first_doc"] = first_doc;
    j["n_docs"] = info.n_docs;
    j["n_tokens"] = info.n_tokens;
    j["dim"] = info.dim;
    j["n_centroids"] = info.n_centroids;
    j["codec"] = info.codec;
    j["pq_m"] = m.pq_m;
    j["pq_nbits"] = m.pq_nbits;
    j["residual_nbits"] = m.residual_nbits;
    j["n_code_bytes"] = m.n_code_bytes;
    if (m.unit_norm) j["unit_norm"] = true;
    j["has_vectors"] = info.has_vectors;
    j["n_chunks"] = info.n_chunks;
    j["n_deleted"] = info.n_deleted;
    j["chunk_docs"] = chunk_docs;
    return j.dump();
}

std::string encode_ivf(const std::vector<int32_t>& list) {
    std::string s;
    int64_t prev = 0;
    put_varint(&s, static_cast<uint64_t>(list.size()));
    for (int32_t d : list) {
        put_varint(&s, static_cast<uint64_t>(d - prev));
        prev = d;
    }
    seal(&s);
    return s;
}

std::string encode_floats(const std::vector<float>& v) {
    std::string s;
    put(&s, v.data(), v.size());
    seal(&s);
    return s;
}

// Key of a chunk's external ids in the ids family.
std::string ids_key(int64_t chunk) { return "c:" + be64(static_cast<uint64_t>(chunk)); }

// The external ids of one chunk's documents: varint length + bytes each (CRC-sealed).
std::string encode_ids(const std::string* ids, size_t n) {
    std::string s;
    size_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += ids[i].size() + 2;
    s.reserve(bytes + 4);
    for (size_t i = 0; i < n; ++i) {
        put_varint(&s, ids[i].size());
        s += ids[i];
    }
    seal(&s);
    return s;
}

// One stored chunk: header, doc lengths, token centroids, codes (CRC-sealed).
std::string encode_chunk(int64_t first_doc, const int64_t* lens, int64_t n, const uint32_t* cids, const uint8_t* codes,
                         int64_t n_tok, int n_code_bytes) {
    std::string s;
    put1<uint32_t>(&s, kChunkMagic);
    put1<uint64_t>(&s, static_cast<uint64_t>(first_doc));
    put1<uint32_t>(&s, static_cast<uint32_t>(n));
    for (int64_t i = 0; i < n; ++i) put1<uint32_t>(&s, static_cast<uint32_t>(lens[i]));
    put(&s, cids, n_tok);
    put(&s, codes, size_t(n_tok) * n_code_bytes);
    seal(&s);
    return s;
}

// A delta + varint doc-id list (encode_ivf), every id checked to be in [lo, hi); appended to *out.
Status decode_ivf(const std::string& what, const std::string& v, int64_t lo, int64_t hi, std::vector<int32_t>* out) {
    Reader r(what, v);
    uint64_t n;
    TMS_RETURN_IF_ERROR(r.varint(&n));
    if (n > v.size()) return Status::Corruption(what + ": bad list length");  // >= 1 byte an entry
    const size_t base = out->size();
    out->resize(base + n);
    int32_t* dst = out->data() + base;
    const auto* p = reinterpret_cast<const uint8_t*>(r.pos());
    const auto* end = reinterpret_cast<const uint8_t*>(v.data() + v.size());
    int64_t prev = 0;
    for (uint64_t i = 0; i < n; ++i) {
        uint64_t delta = 0;
        int shift = 0;
        for (;;) {
            if (p == end || shift > 63) return Status::Corruption(what + ": varint truncated");
            const uint8_t b = *p++;
            delta |= uint64_t(b & 0x7f) << shift;
            if (!(b & 0x80)) break;
            shift += 7;
        }
        prev += static_cast<int64_t>(delta);
        if (prev < lo || prev >= hi) return Status::Corruption(what + ": document id out of range");
        dst[i] = static_cast<int32_t>(prev);
    }
    if (p != end) return Status::Corruption(what + ": trailing bytes");
    return Status::OK();
}

}  // namespace tms::index
