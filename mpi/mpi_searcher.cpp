// Copyright TileMaxSim authors. MpiSearcher: scatter-gather search over MPI (mpi_searcher.h).
// Every collective is non-blocking and waited on with a deadline. Per batch: the queries arrive
// (broadcast from rank 0, prefixed by a go / stop word), each rank searches its shards and encodes
// its hits (or its error) as bytes, the sizes then the bytes are gathered on rank 0, which posts
// the next batch's broadcast before it decodes and merges this one.
#include "mpi/mpi_searcher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "base/progress.h"
#include "mpi/mpi_channel.h"
#include "engine/plan.h"
#include "engine/cuts.h"
#include "tilemaxsim/index_builder.h"

namespace tms {
namespace {

using Clock = std::chrono::steady_clock;

// The batch-independent request, broadcast once from rank 0.
struct Setup {
    int64_t ok = 1;  // 0: rank 0's input was refused (every rank returns its message)
    int64_t n_queries = 0, q_tokens = 0, dim = 0, dtype = 0, has_lengths = 0, batch = 0;
    int64_t k = 0, exhaustive = 0, nprobe = 0, ncandidates = 0, rerank = 0, pruning = 0, max_batch_queries = 0;
    int64_t has_filter = 0, has_allow = 0, direct_max = -1;  // the filter's text follows; an allow set is refused
};
static_assert(sizeof(Setup) % sizeof(int64_t) == 0);

constexpr int64_t kGo = 1, kStop = 0;

void put(std::string* b, const void* p, size_t n) { b->append(static_cast<const char*>(p), n); }
template <class T>
void put(std::string* b, T v) {
    put(b, &v, sizeof(v));
}

// A rank's answer to one batch: status code (0: ok) and message, or per query its hits.
std::string encode(const Status& st, const std::vector<std::vector<SearchHit>>& hits) {
    std::string b;
    put(&b, int32_t(st.code()));
    if (!st.ok()) {
        put(&b, st.message().data(), st.message().size());
        return b;
    }
    for (const auto& q : hits) {
        put(&b, uint32_t(q.size()));
        for (const SearchHit& h : q) {
            put(&b, int64_t(h.internal_id));
            put(&b, h.score);
            put(&b, uint32_t(h.doc_id.size()));
            put(&b, h.doc_id.data(), h.doc_id.size());
        }
    }
    return b;
}

// Decodes one rank's answer of nq queries; an error answer comes back as its Status.
Status decode(const char* p, size_t n, int nq, std::vector<std::vector<SearchHit>>* hits) {
    const char* end = p + n;
    auto get = [&](void* v, size_t len) {
        if (size_t(end - p) < len) return false;
        std::memcpy(v, p, len);
        p += len;
        return true;
    };
    int32_t code = 0;
    if (!get(&code, 4)) return Status::Internal("a truncated answer");
    if (code != 0) return Status(Status::Code(code), std::string(p, end));
    hits->assign(size_t(nq), {});
    for (int q = 0; q < nq; ++q) {
        uint32_t c = 0;
        if (!get(&c, 4)) return Status::Internal("a truncated answer");
        auto& r = (*hits)[size_t(q)];
        r.resize(c);
        for (SearchHit& h : r) {
            int64_t id = 0;
            uint32_t len = 0;
            if (!get(&id, 8) || !get(&h.score, 4) || !get(&len, 4) || size_t(end - p) < len) {
                return Status::Internal("a truncated answer");
            }
            h.internal_id = id;
            h.doc_id.assign(p, len);
            p += len;
        }
    }
    return Status::OK();
}

// The cuts of a search over the ranks (SearchCuts): each rank's best keys (or its error) go to
// rank 0, which finds each query's keep-th best over all of them and broadcasts it (or the
// failed ranks' first error, "rank R: ...").
class MpiCuts final : public SearchCuts {
public:
    MpiCuts(mpi::Channel* ch, int64_t n_docs, int n_centroids) : ch_(ch), n_docs_(n_docs), n_centroids_(n_centroids) {}
    int64_t n_docs() const override { return n_docs_; }
    int n_centroids() const override { return n_centroids_; }
    /// A cut failed (on some rank): its status is already every rank's, worded.
    bool failed() const { return failed_; }

    /// Seconds spent in cuts.
    double seconds() const { return seconds_; }

    Status Cut(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best,
               std::vector<CutKey>* cut) override {
        const auto t0 = Clock::now();
        const Status st = Exchange(keep, mine, best, cut);
        seconds_ += SecondsSince(t0);
        return st;
    }

private:
    Status Exchange(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best,
                    std::vector<CutKey>* cut) {
        const size_t nq = best.size();
        std::string blob;
        put(&blob, int32_t(mine.code()));
        if (!mine.ok()) {
            put(&blob, mine.message().data(), mine.message().size());
        } else {
            size_t bytes = 4;
            for (const auto& b : best) bytes += 4 + b.size() * sizeof(CutKey);
            blob.reserve(bytes);
            for (const auto& b : best) {
                put(&blob, uint32_t(b.size()));
                put(&blob, b.data(), b.size() * sizeof(CutKey));
            }
        }
        std::vector<std::string> all;
        Status verdict = ch_->Gather(blob, &all);
        std::string reply;
        if (ch_->rank() == 0 && verdict.ok()) {
            std::vector<std::vector<CutKey>> merged(nq);
            for (size_t r = 0; r < all.size() && verdict.ok(); ++r) {
                const char* p = all[r].data();
                const char* end = p + all[r].size();
                int32_t code = 0;
                std::memcpy(&code, p, 4);
                p += 4;
                if (code != 0) {
                    verdict = Status(Status::Code(code), "rank " + std::to_string(r) + ": " + std::string(p, end));
                    break;
                }
                for (size_t q = 0; q < nq; ++q) {
                    uint32_t c = 0;
                    std::memcpy(&c, p, 4);
                    p += 4;
                    const size_t at = merged[q].size();
                    merged[q].resize(at + c);
                    std::memcpy(merged[q].data() + at, p, c * sizeof(CutKey));
                    p += c * sizeof(CutKey);
                }
            }
            if (verdict.ok()) {
                put(&reply, int32_t(0));
                for (auto& m : merged) {
                    CutKey at{-INFINITY, std::numeric_limits<int64_t>::max()};  // fewer than keep: keep all
                    if (m.size() >= size_t(keep)) {
                        std::nth_element(m.begin(), m.begin() + (keep - 1), m.end(), CutKeyBetter);
                        at = m[size_t(keep - 1)];
                    }
                    put(&reply, at);
                }
            }
        }
        if (ch_->rank() == 0 && !verdict.ok()) {
            reply.clear();
            put(&reply, int32_t(verdict.code()));
            put(&reply, verdict.message().data(), verdict.message().size());
        }
        if (!verdict.ok() && ch_->rank() != 0) reply.clear();
        TMS_RETURN_IF_ERROR(ch_->Broadcast(&reply));
        int32_t code = 0;
        std::memcpy(&code, reply.data(), 4);
        if (code != 0) {
            failed_ = true;
            return Status(Status::Code(code), reply.substr(4));
        }
        cut->resize(nq);
        std::memcpy(cut->data(), reply.data() + 4, nq * sizeof(CutKey));
        return Status::OK();
    }

    mpi::Channel* ch_;
    int64_t n_docs_;
    int n_centroids_;
    bool failed_ = false;
    double seconds_ = 0;
};

}  // namespace

MpiSearcher::~MpiSearcher() = default;

Status MpiSearcher::Open(MPI_Comm comm, const SearcherOptions& opts, const std::string& path,
                         std::unique_ptr<MpiSearcher>* out, double timeout_s) {
    if (!(timeout_s > 0)) return Status::InvalidArgument("MpiSearcher: timeout must be > 0");
    std::unique_ptr<MpiSearcher> s(new MpiSearcher());
    s->ch_ = std::make_unique<mpi::Channel>(comm, timeout_s);
    s->rank_ = s->ch_->rank();
    s->size_ = s->ch_->size();
    Status st = ReadIndexShardCount(path, &s->n_shards_);
    if (st.ok()) {
        // Consecutive shards per rank (the first n_shards % size ranks one more): one segment
        // each, searched as one (Searcher::Open joins a device's consecutive shards).
        const int base = s->n_shards_ / s->size_, extra = s->n_shards_ % s->size_;
        const int first = s->rank_ * base + std::min(s->rank_, extra);
        for (int sh = first; sh < first + base + (s->rank_ < extra ? 1 : 0); ++sh) s->mine_.push_back(sh);
        if (!s->mine_.empty()) {
            SearcherOptions o = opts;
            o.shards = s->mine_;
            st = Searcher::Open(o, path, &s->local_);
        }
    }
    // Rank 0 resolves the target recall for every rank, as one Searcher over the index would.
    if (st.ok() && s->rank_ == 0) {
        const Status est = ReadRecallEstimate(path, &s->estimate_);
        if (!est.ok() && est.code() != Status::Code::kNotFound) st = est;
        s->vectors_ =
            s->local_ && !s->local_->placement().empty() && s->local_->placement()[0].vectors != VectorTier::kNone;
        s->tune_ = est.ok() && s->vectors_ && !s->estimate_.points.empty();
    }
    TMS_RETURN_IF_ERROR(s->ch_->Agree(st));
    // The whole index's documents and centroids (they size the search's chunks on every rank).
    int64_t docs = s->local_ ? s->local_->info().n_docs : 0, cents = s->local_ ? s->local_->info().n_centroids : 0;
    s->ch_->AllReduce(&docs, 1, MPI_SUM, "summing the ranks' documents");
    int64_t live = s->local_ ? s->local_->info().n_docs - s->local_->info().n_deleted : 0;
    s->ch_->AllReduce(&live, 1, MPI_SUM, "summing the ranks' live documents");
    s->live_docs_ = live;
    s->ch_->AllReduce(&cents, 1, MPI_MAX, "sharing the centroid count");
    s->n_docs_ = docs;
    s->n_centroids_ = int(cents);
    *out = std::move(s);
    return Status::OK();
}

Status MpiSearcher::SearchBatches(
    const QueryBatch& q, int batch, const SearchOptions& opts,
    const std::function<Status(int64_t, std::vector<std::vector<SearchHit>>&)>& on_batch) {
    Setup su;
    if (rank_ == 0) {
        const SearchOptions t = PlanSearch(tune_ ? &estimate_ : nullptr, live_docs_, vectors_,
                                           local_ ? local_->device() : Device::kCpu, opts);
        su.n_queries = q.n_queries;
        su.q_tokens = q.q_tokens;
        su.dim = q.dim;
        su.dtype = int64_t(q.dtype);
        su.has_lengths = q.lengths != nullptr;
        su.batch = batch;
        su.k = t.k;
        su.exhaustive = t.exhaustive;
        su.nprobe = t.nprobe;
        su.ncandidates = t.ncandidates;
        su.rerank = t.rerank;
        su.pruning = int64_t(opts.pruning);
        su.max_batch_queries = t.max_batch_queries;
        su.has_filter = !t.filter.empty();
        su.direct_max = t.direct_max;
        su.has_allow = t.allow != nullptr;
        su.ok = batch > 0 && q.n_queries >= 0 && q.q_tokens > 0 && q.dim > 0 && (q.n_queries == 0 || q.data);
    }
    MPI_Request r;
    MPI_Ibcast(&su, int(sizeof(Setup) / sizeof(int64_t)), MPI_INT64_T, 0, ch_->comm(), &r);
    ch_->Wait(&r, "broadcasting the search");
    if (!su.ok) return Status::InvalidArgument("MpiSearcher: rank 0's queries or batch size are invalid");
    if (su.has_allow) {
        return Status::NotSupported(
            "MpiSearcher: an allow set (internal ids) is not sent to the ranks; filter by "
            "metadata (SearchOptions::filter), which every rank evaluates alike");
    }
    SearchOptions o;
    o.target_recall = 0;  // rank 0 planned the search for the whole index
    o.k = int(su.k);
    o.exhaustive = su.exhaustive != 0;
    o.nprobe = int(su.nprobe);
    o.ncandidates = int(su.ncandidates);
    o.rerank = int(su.rerank);
    o.pruning = Pruning(su.pruning);
    o.max_batch_queries = int(su.max_batch_queries);
    o.direct_max = su.direct_max;
    if (su.has_filter) {  // every rank filters by its own copy of the index's metadata: the same set
        o.filter = rank_ == 0 ? opts.filter : std::string();
        TMS_RETURN_IF_ERROR(ch_->Broadcast(&o.filter));
    }
    const int64_t nq = su.n_queries;
    std::vector<int32_t> lens;
    if (su.has_lengths) {
        lens.resize(size_t(nq));
        if (rank_ == 0) std::copy(q.lengths, q.lengths + nq, lens.begin());
        MPI_Ibcast(lens.data(), int(nq), MPI_INT32_T, 0, ch_->comm(), &r);
        ch_->Wait(&r, "broadcasting the query lengths");
    }
    const DType dtype = DType(su.dtype);
    const size_t row_bytes = size_t(su.q_tokens) * size_t(su.dim) * size_t(DTypeSize(dtype));
    const int64_t nb = (nq + su.batch - 1) / su.batch;
    // Two buffers: the next batch arrives in one while this one is searched from the other.
    // Each starts with the go / stop word.
    const size_t max_rows = size_t(std::min<int64_t>(su.batch, std::max<int64_t>(nq, 1)));
    if (max_rows * row_bytes > size_t(1) << 30) {
        return Status::InvalidArgument("MpiSearcher: a batch of more than 1 GiB of queries; use a smaller batch");
    }
    std::vector<uint8_t> bufs[2];
    for (auto& b : bufs) b.resize(sizeof(int64_t) + max_rows * row_bytes);
    auto batch_rows = [&](int64_t i) { return std::min<int64_t>(su.batch, nq - i * su.batch); };
    auto post = [&](int64_t i, int64_t word, MPI_Request* req) {
        std::vector<uint8_t>& b = bufs[i % 2];
        const size_t bytes = size_t(batch_rows(i)) * row_bytes;
        if (rank_ == 0) {
            std::memcpy(b.data(), &word, sizeof(word));
            if (word == kGo)
                std::memcpy(b.data() + sizeof(word),
                            static_cast<const uint8_t*>(q.data) + size_t(i * su.batch) * row_bytes, bytes);
        }
        MPI_Ibcast(b.data(), int(sizeof(int64_t) + bytes), MPI_BYTE, 0, ch_->comm(), req);
    };
    if (nb == 0) return Status::OK();
    MPI_Request next = MPI_REQUEST_NULL;
    auto t = Clock::now();
    post(0, kGo, &next);
    ch_->Wait(&next, "broadcasting a batch");
    stats_.broadcast_s += SecondsSince(t);
    Status pending;  // rank 0: an error that ends the search after this batch
    for (int64_t i = 0; i < nb; ++i) {
        const std::vector<uint8_t>& b = bufs[i % 2];
        int64_t word = 0;
        std::memcpy(&word, b.data(), sizeof(word));
        if (word != kGo) break;  // rank 0 stopped the search: its reason follows
        const int n = int(batch_rows(i));
        // This rank's answer: its shards' hits, or its error.
        t = Clock::now();
        std::vector<std::vector<SearchHit>> mine(static_cast<size_t>(n));
        QueryBatch qb;
        qb.data = b.data() + sizeof(int64_t);
        qb.dtype = dtype;
        qb.n_queries = n;
        qb.q_tokens = int(su.q_tokens);
        qb.dim = int(su.dim);
        qb.lengths = su.has_lengths ? lens.data() + i * su.batch : nullptr;
        // Every rank takes part in the search's cuts, holding shards or not.
        MpiCuts cuts(ch_.get(), n_docs_, n_centroids_);
        Status st = SearchWithCuts(local_.get(), qb, o, &cuts, &mine);
        // A failed cut's error is every rank's already, worded with the failing rank.
        if (rank_ == 0 && cuts.failed() && pending.ok()) pending = st;
        stats_.cut_s += cuts.seconds();
        if (rank_ == 0 && !pending.ok()) st = pending;
        const std::string blob = encode(st, mine);
        stats_.search_s += SecondsSince(t);
        t = Clock::now();
        std::vector<std::string> answers;
        const Status gst = ch_->Gather(blob, &answers);
        if (!gst.ok() && pending.ok()) pending = Status(gst.code(), "MpiSearcher: " + gst.message());
        stats_.gather_s += SecondsSince(t);
        // Rank 0 decodes: any rank's error stops the search (the next batch goes out as a stop).
        std::vector<std::vector<std::vector<SearchHit>>> parts;
        t = Clock::now();
        if (rank_ == 0 && gst.ok()) {
            parts.resize(size_t(size_));
            for (int k = 0; k < size_; ++k) {
                Status dst = decode(answers[size_t(k)].data(), answers[size_t(k)].size(), n, &parts[size_t(k)]);
                if (!dst.ok() && pending.ok())
                    pending = Status(dst.code(), "rank " + std::to_string(k) + ": " + dst.message());
            }
        }
        stats_.merge_s += SecondsSince(t);
        if (i + 1 < nb) post(i + 1, pending.ok() ? kGo : kStop, &next);
        if (rank_ == 0 && pending.ok()) {
            t = Clock::now();
            std::vector<std::vector<SearchHit>> merged;
            MergeHits(&parts, n, o.k, &merged);
            stats_.merge_s += SecondsSince(t);
            pending = on_batch(i * su.batch, merged);
        }
        ++stats_.batches;
        if (i + 1 < nb) {
            t = Clock::now();
            ch_->Wait(&next, "broadcasting a batch");
            stats_.broadcast_s += SecondsSince(t);
        }
    }
    return ch_->ShareRoot(pending);  // rank 0's verdict (the first error of any rank) is everyone's
}

Status MpiSearcher::Search(const QueryBatch& q, const SearchOptions& opts,
                           std::vector<std::vector<SearchHit>>* results) {
    results->clear();
    return SearchBatches(q, std::max(1, q.n_queries), opts, [&](int64_t, std::vector<std::vector<SearchHit>>& hits) {
        *results = std::move(hits);
        return Status::OK();
    });
}

namespace {

class MpiBuildGroup final : public BuildGroup {
public:
    MpiBuildGroup(MPI_Comm comm, double timeout_s) : ch_(comm, timeout_s) {}
    int rank() const override { return ch_.rank(); }
    int size() const override { return ch_.size(); }
    Status Broadcast(std::string* bytes) override { return ch_.Broadcast(bytes); }
    Status Agree(const Status& mine) override { return ch_.Agree(mine); }

private:
    mpi::Channel ch_;
};

}  // namespace

std::unique_ptr<BuildGroup> MakeMpiBuildGroup(MPI_Comm comm, double timeout_s) {
    return std::make_unique<MpiBuildGroup>(comm, timeout_s);
}

}  // namespace tms
