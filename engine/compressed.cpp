// Copyright TileMaxSim authors. The compressed-scoring stage: codes (or centroids only) of each
// query's candidates, on the shard's GPU or the host (engine/shard_searcher.h).
#include "engine/shard_searcher.h"

#include <algorithm>
#include <vector>

#include "kernels/maxsim.h"

namespace tms::engine {

// Compressed (or centroid-only) scores of p's candidates into p.scores, on the GPU when the
// shard's codes live there.
Status ShardSearcher::code_scores(const kernels::CodeMaxSimParams& p, bool centroids_only) const {
    if (gpu_codes()) {
        std::vector<float> out;
        TMS_RETURN_IF_ERROR(p_->dev->CodeScore(p.queries, p.n_queries, p.q_stride, p.query_lens, p.cand_offsets,
                                               p.cand_docs, centroids_only, &out));
        std::copy(out.begin(), out.end(), p.scores);
        return Status::OK();
    }
    kernels::CodeMaxSimParams c = p;
    if (centroids_only) c.n_code_bytes = 0;
    return kernels::code_maxsim_cpu(c);
}

Status ShardSearcher::ListScores(const float* qf, const QueryBatch& q, const float* cs, const Lists& l,
                                 bool centroids_only, std::vector<float>* scores) const {
    scores->resize(l.docs.size());
    kernels::CodeMaxSimParams cp;
    cp.queries = qf;
    cp.n_queries = q.n_queries;
    cp.q_stride = q.q_tokens;
    cp.dim = q.dim;
    cp.query_lens = q.lengths;
    cp.centroid_scores = cs;
    cp.n_centroids = p_->data.model.n_centroids;
    cp.token_centroids = p_->data.token_centroids.data();
    cp.doc_offsets = p_->data.doc_offsets.data();
    cp.n_docs = info_.n_docs;
    cp.codes = p_->data.codes.data();
    cp.n_code_bytes = p_->data.model.n_code_bytes;
    cp.codebook = p_->data.model.codebook.data();
    cp.token_scales = p_->scales.empty() ? nullptr : p_->scales.data();
    cp.cand_offsets = l.off.data();
    cp.cand_docs = l.docs.data();
    cp.scores = scores->data();
    return code_scores(cp, centroids_only);
}

Status ShardSearcher::CompressedStage(const QueryBatch& q, int keep, SegmentCall* c) const {
    std::unique_lock<std::mutex> gpu_lock = LockDevice(c);
    keep = int(std::min<int64_t>(keep, std::max<int64_t>(1, info_.n_docs)));
    Lists& l = c->lists;
    if (c->on_gpu && c->alone) {
        // The lists PruneStage left on the device (with its query rows and centroid scores):
        // only their `keep` best come back.
        return p_->dev->ScoreCandidatesTop(keep, &l.off, &l.docs, &l.scores);
    }
    if (c->on_gpu) {
        Lists top;
        TMS_RETURN_IF_ERROR(p_->dev->ScoreLists(q.data, q.dtype, q.n_queries, q.q_tokens, q.lengths, l.off.data(),
                                                l.docs.data(), keep, &top.off, &top.docs, &top.scores, c->ticket));
        l = std::move(top);
        return Status::OK();
    }
    TMS_RETURN_IF_ERROR(ListScores(HostF32(q, &c->qconv), q, c->cs.data(), l, /*centroids_only=*/false, &l.scores));
    return select_top(q.n_queries, keep, &l);
}

}  // namespace tms::engine
