// Copyright TileMaxSim authors. The on-disk format of a store: its column families, chunk and vector-reference
// values, IVF lists and id lists, and their encoders and decoders.
#pragma once

#include <rocksdb/slice.h>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "index/model.h"
#include "index/store/coding.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

inline const std::vector<std::string> kColumnFamilies = {"default", "meta",    "model", "ivf",
                                                         "docs",    "vectors", "ids",   "deleted"};
enum Cf { kDefault = 0, kMeta, kModel, kIvf, kDocs, kVectors, kIds, kDeleted };
constexpr uint32_t kChunkMagic = 0x544d5331;  // "TMS1"

// The fp16 vectors of a store (format 5) live beside its RocksDB files in one flat file, in
// token order; each chunk's entry in the vectors family is a sealed reference to its bytes there
// (magic, offset, length, CRC-32C of the bytes). The bulk of an index's bytes thus bypasses
// RocksDB's memtables and blob files, and is read straight into place.
constexpr const char* kVectorsFile = "vectors.f16";
constexpr uint32_t kVectorRefMagic = 0x544d5652;  // "TMVR"
constexpr int kInlineVectorsFormat = 3;           // vectors inside the vectors family, read only

struct VectorRef {
    uint64_t offset = 0, bytes = 0;
    uint32_t crc = 0;
};

// Calls emit(id) for each id of a sealed ids value (payload already checked), in order.
template <typename Emit>
Status for_each_id(const std::string& what, const rocksdb::Slice& v, Emit emit) {
    Reader r(what, v.data(), v.size() - 4);
    while (!r.done()) {
        uint64_t len = 0;
        TMS_RETURN_IF_ERROR(r.varint(&len));
        const char* p = r.pos();
        TMS_RETURN_IF_ERROR(r.skip(len));
        TMS_RETURN_IF_ERROR(emit(std::string_view(p, len)));
    }
    return Status::OK();
}

/// A chunk's vectors-family value: where its bytes are in the vectors file, sealed.
std::string encode_vector_ref(const VectorRef& r);
/// A sealed ids value -> exactly `n` ids into out[0..n).
Status decode_ids(const std::string& what, const rocksdb::Slice& v, size_t n, std::string* out);
/// The meta family's "stats" value of a store.
std::string info_json(const IndexInfo& info, const IndexModel& m, int chunk_docs, int64_t first_doc);
/// An IVF list: count, then doc-id deltas, varints, sealed.
std::string encode_ivf(const std::vector<int32_t>& list);
std::string encode_floats(const std::vector<float>& v);
std::string ids_key(int64_t chunk);
std::string encode_ids(const std::string* ids, size_t n);
std::string encode_chunk(int64_t first_doc, const int64_t* lens, int64_t n, const uint32_t* cids, const uint8_t* codes,
                         int64_t n_tok, int n_code_bytes);
Status decode_ivf(const std::string& what, const std::string& v, int64_t lo, int64_t hi, std::vector<int32_t>* out);

}  // namespace tms::index
