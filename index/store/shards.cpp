// Copyright TileMaxSim authors. Shards: how many, which documents each, and a sharded index read as one.

#include <algorithm>
#include <cstdio>

#include "index/store/shards.h"
#include "kernels/cpu/parallel_copy.h"

namespace tms::index {

int ResolveShardCount(int requested, int64_t n_tokens) {
    if (requested > 0) return requested;
    return int(std::clamp<int64_t>((n_tokens + kTokensPerShard - 1) / kTokensPerShard, 1, kMaxShards));
}

std::vector<int64_t> SplitShards(const std::vector<int64_t>& doclens, int shards) {
    const int64_t n = static_cast<int64_t>(doclens.size());
    shards = int(std::clamp<int64_t>(shards, 1, std::max<int64_t>(1, n)));
    int64_t total = 0;
    for (int64_t l : doclens) total += l;
    std::vector<int64_t> out;
    int64_t doc = 0, tok = 0;
    for (int s = 1; s < shards; ++s) {
        // The first document past s / shards of the tokens starts the next shard; every shard
        // keeps at least one document.
        const int64_t goal = int64_t(double(total) * s / shards);
        const int64_t start = doc;
        while (doc < n - (shards - s) && (doc == start || tok < goal)) tok += doclens[doc++];
        out.push_back(doc - start);
    }
    out.push_back(n - doc);
    return out;
}

std::string ShardDirName(int shard) {
    char b[32];
    std::snprintf(b, sizeof(b), "shard-%04d", shard);
    return b;
}

IndexInfo SumShardInfos(const std::vector<IndexData>& shards) {
    IndexInfo info = shards.at(0).info;
    info.n_docs = info.n_tokens = info.n_chunks = info.n_deleted = 0;
    info.shards.clear();
    for (const IndexData& s : shards) {
        info.n_docs += s.info.n_docs;
        info.n_tokens += s.info.n_tokens;
        info.n_chunks += s.info.n_chunks;
        info.n_deleted += s.info.n_deleted;
        info.shards.push_back(s.info.shards.at(0));
    }
    return info;
}

namespace {
// dst[at ..) = src (the copies of ConcatShards are gigabytes: on several threads).
template <class T>
void append_parallel(const PodVector<T>& src, int64_t at, PodVector<T>* dst) {
    kernels::ParallelMemcpy(dst->data() + at, src.data(), src.size() * sizeof(T));
}
}  // namespace

void ConcatShards(std::vector<IndexData>* shards, IndexData* d, std::vector<PodVector<uint16_t>>* vector_parts) {
    std::vector<IndexData>& v = *shards;
    if (vector_parts) vector_parts->clear();
    if (v.size() == 1) {
        *d = std::move(v[0]);
        if (vector_parts) vector_parts->push_back(std::move(d->vectors));
        shards->clear();
        return;
    }
    *d = IndexData();
    d->model = v[0].model;
    d->info = SumShardInfos(v);
    d->first_doc = v[0].first_doc;
    int64_t tokens = 0, vec = 0, code_bytes = 0;
    for (const IndexData& s : v) {
        tokens += int64_t(s.token_centroids.size());
        code_bytes += int64_t(s.codes.size());
        vec += int64_t(s.vectors.size());
    }
    // Sized once and filled shard by shard, each shard's arrays freed as soon as they are
    // copied: the resident peak is the whole plus one shard, not twice the whole.
    d->token_centroids.resize(size_t(tokens));
    d->codes.resize(size_t(code_bytes));
    if (!vector_parts) d->vectors.resize(size_t(vec));
    d->doc_offsets.assign(1, 0);
    int64_t at_tok = 0, at_code = 0, at_vec = 0;
    for (IndexData& s : v) {
        const int64_t t0 = d->doc_offsets.back();
        for (size_t i = 1; i < s.doc_offsets.size(); ++i) d->doc_offsets.push_back(t0 + s.doc_offsets[i]);
        for (const VectorFileSpan& f : s.vector_files) d->vector_files.push_back({at_tok + f.token0, f.file});
        append_parallel(s.token_centroids, at_tok, &d->token_centroids);
        append_parallel(s.codes, at_code, &d->codes);
        at_tok += int64_t(s.token_centroids.size());
        at_code += int64_t(s.codes.size());
        if (vector_parts) {
            vector_parts->push_back(std::move(s.vectors));
        } else {
            append_parallel(s.vectors, at_vec, &d->vectors);
            at_vec += int64_t(s.vectors.size());
        }
        d->doc_ids.insert(d->doc_ids.end(), std::make_move_iterator(s.doc_ids.begin()),
                          std::make_move_iterator(s.doc_ids.end()));
        d->deleted.insert(d->deleted.end(), s.deleted.begin(), s.deleted.end());
        PodVector<uint32_t>().swap(s.token_centroids);
        PodVector<uint8_t>().swap(s.codes);
        PodVector<uint16_t>().swap(s.vectors);
    }
    // IVF lists: each centroid's lists of the shards in order (ids ascend across shards, which
    // are consecutive document ranges from v[0].first_doc).
    const int K = d->model.n_centroids;
    d->ivf_offsets.assign(K + 1, 0);
    for (int k = 0; k < K; ++k) {
        int64_t len = 0;
        for (const IndexData& s : v) len += s.ivf_offsets[k + 1] - s.ivf_offsets[k];
        d->ivf_offsets[k + 1] = d->ivf_offsets[k] + len;
    }
    d->ivf_docs.resize(d->ivf_offsets.back());
#pragma omp parallel for schedule(dynamic, 64)
    for (int k = 0; k < K; ++k) {
        int64_t w = d->ivf_offsets[k];
        for (const IndexData& s : v) {
            const int32_t base = static_cast<int32_t>(s.first_doc - d->first_doc);
            for (int64_t e = s.ivf_offsets[k]; e < s.ivf_offsets[k + 1]; ++e) d->ivf_docs[w++] = base + s.ivf_docs[e];
        }
    }
    shards->clear();
}

}  // namespace tms::index
