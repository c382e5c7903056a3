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
#include <unordered_map>

#include "base/progress.h"
#include "mpi/mpi_channel.h"
#include "engine/plan.h"
#include "engine/cuts.h"
#include "engine/hybrid.h"
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
    int64_t adaptive = 0, certify_steps = -1;  // the queries not settled searched again (the ranks agree which)
    // Modes bm25 and hybrid (the query texts follow): k above is the MaxSim search's (hybrid:
    // max(k, lexical_candidates)), final_k the fused list's.
    int64_t mode = 0, fusion = 0, lexical_candidates = 0, final_k = 0;
    double bm25_weight = 0;
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

// Every query's texts of a batch, or of a whole search: each a length and its bytes.
std::string encode_texts(const std::vector<std::string>& texts) {
    std::string b;
    for (const std::string& t : texts) {
        put(&b, uint64_t(t.size()));
        put(&b, t.data(), t.size());
    }
    return b;
}

bool decode_texts(const std::string& b, int64_t n, std::vector<std::string>* texts) {
    texts->clear();
    size_t at = 0;
    for (int64_t i = 0; i < n; ++i) {
        uint64_t len = 0;
        if (b.size() - at < sizeof(len)) return false;
        std::memcpy(&len, b.data() + at, sizeof(len));
        at += sizeof(len);
        if (b.size() - at < len) return false;
        texts->emplace_back(b.data() + at, size_t(len));
        at += size_t(len);
    }
    return at == b.size();
}

// Per query, internal ids: a count and the ids.
std::string encode_ids(const std::vector<std::vector<int64_t>>& ids) {
    std::string b;
    put(&b, int32_t(0));
    for (const auto& q : ids) {
        put(&b, uint32_t(q.size()));
        put(&b, q.data(), q.size() * sizeof(int64_t));
    }
    return b;
}

Status decode_ids(const std::string& b, int nq, std::vector<std::vector<int64_t>>* ids) {
    const char* p = b.data();
    const char* end = p + b.size();
    int32_t code = 0;
    if (end - p < 4) return Status::Internal("a truncated answer");
    std::memcpy(&code, p, 4);
    p += 4;
    if (code != 0) return Status(Status::Code(code), std::string(p, end));
    ids->assign(size_t(nq), {});
    for (auto& q : *ids) {
        uint32_t c = 0;
        if (end - p < 4) return Status::Internal("a truncated answer");
        std::memcpy(&c, p, 4);
        p += 4;
        if (size_t(end - p) < c * sizeof(int64_t)) return Status::Internal("a truncated answer");
        q.resize(c);
        std::memcpy(q.data(), p, c * sizeof(int64_t));
        p += c * sizeof(int64_t);
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

// Modes bm25 and hybrid of one batch, as one Searcher runs them (engine/searcher.cpp,
// SearchText): every rank reads the whole index's text index, so a document's BM25 score is the
// same on every rank, and each rank returns the best of its own documents. bm25: *mine is this
// rank's lexical best (`lo`: mode bm25), merged by rank 0 as a search's hits are. hybrid: each rank's
// lexical best and its share of the MaxSim search (`o`, the cuts agreed) go to rank 0, which
// merges each (*lexical, *maxsim) and sends every rank their union; *mine is then this rank's
// exact scores of the union's documents it holds (none when the index's vectors are not
// loaded: the MaxSim hits' own scores are fused). *agreed: the error returned is every rank's
// already (rank 0 reports it as it is).
Status text_round(mpi::Channel* ch, const Searcher* local, const QueryBatch& qb, const SearchOptions& o,
                  const SearchOptions& lo, bool hybrid, bool exact, int64_t n_docs, int n_centroids,
                  std::vector<std::vector<SearchHit>>* mine, std::vector<std::vector<SearchHit>>* lexical,
                  std::vector<std::vector<SearchHit>>* maxsim, bool* agreed, double* cut_s) {
    const int n = qb.n_queries;
    *agreed = false;
    mine->assign(size_t(n), {});
    if (!hybrid) return local ? local->Search(qb, lo, mine) : Status::OK();
    std::vector<std::vector<SearchHit>> both(static_cast<size_t>(n)), ms(static_cast<size_t>(n));
    Status st = local ? local->Search(qb, lo, &both) : Status::OK();
    MpiCuts cuts(ch, n_docs, n_centroids);
    const Status mst = SearchWithCuts(local, qb, o, &cuts, &ms);
    *cut_s += cuts.seconds();
    if (cuts.failed()) {
        *agreed = true;
        return mst;
    }
    if (st.ok()) st = mst;
    both.resize(size_t(2 * n));
    std::move(ms.begin(), ms.end(), both.begin() + n);
    std::vector<std::string> all;
    Status verdict = ch->Gather(encode(st, both), &all);
    std::string reply;
    if (ch->rank() == 0 && verdict.ok()) {
        std::vector<std::vector<std::vector<SearchHit>>> lp(all.size()), mp(all.size());
        for (size_t r = 0; r < all.size() && verdict.ok(); ++r) {
            std::vector<std::vector<SearchHit>> got;
            const Status dst = decode(all[r].data(), all[r].size(), 2 * n, &got);
            if (!dst.ok()) {
                verdict = Status(dst.code(), "rank " + std::to_string(r) + ": " + dst.message());
                break;
            }
            lp[r].assign(std::make_move_iterator(got.begin()), std::make_move_iterator(got.begin() + n));
            mp[r].assign(std::make_move_iterator(got.begin() + n), std::make_move_iterator(got.end()));
        }
        if (verdict.ok()) {
            MergeHits(&lp, n, lo.k, lexical);
            MergeHits(&mp, n, o.k, maxsim);
            std::vector<std::vector<int64_t>> ids(static_cast<size_t>(n));
            for (int i = 0; i < n; ++i) {
                for (const SearchHit& h : (*lexical)[size_t(i)]) ids[size_t(i)].push_back(h.internal_id);
                for (const SearchHit& h : (*maxsim)[size_t(i)]) ids[size_t(i)].push_back(h.internal_id);
            }
            reply = encode_ids(ids);
        }
    }
    if (ch->rank() == 0 && !verdict.ok()) {
        reply.clear();
        put(&reply, int32_t(verdict.code()));
        put(&reply, verdict.message().data(), verdict.message().size());
    }
    TMS_RETURN_IF_ERROR(ch->Broadcast(&reply));
    std::vector<std::vector<int64_t>> ids;
    const Status ust = decode_ids(reply, n, &ids);
    if (!ust.ok()) {
        *agreed = true;
        return ust;
    }
    if (!exact || !local) return Status::OK();
    // The union's documents this rank holds.
    for (auto& q : ids) {
        q.erase(std::remove_if(q.begin(), q.end(),
                               [&](int64_t d) {
                                   for (const ShardPlacement& p : local->placement())
                                       if (d >= p.first_doc && d < p.first_doc + p.n_docs) return false;
                                   return true;
                               }),
                q.end());
    }
    return local->Rerank(qb, ids, 0, mine);
}

// Rank 0, hybrid: each query's fused best k (engine::FuseRankings, as one Searcher fuses) of
// the merged lexical list and the MaxSim scores: with `exact`, the ranks' exact scores of the
// union (parts[r][q]: rank r's of query q, each document held by one rank); else the merged
// MaxSim hits' own.
void fuse(const std::vector<std::vector<SearchHit>>& lexical, const std::vector<std::vector<SearchHit>>& maxsim,
          const std::vector<std::vector<std::vector<SearchHit>>>& parts, bool exact, int n, const SearchOptions& lo,
          int k, std::vector<std::vector<SearchHit>>* out) {
    out->assign(size_t(n), {});
    for (int i = 0; i < n; ++i) {
        engine::Scored ms, lex;
        std::unordered_map<int64_t, const std::string*> names;
        const auto take = [&](const std::vector<SearchHit>& hits, engine::Scored* into) {
            for (const SearchHit& h : hits) {
                if (into) into->push_back({h.internal_id, h.score});
                names.emplace(h.internal_id, &h.doc_id);
            }
        };
        take(lexical[size_t(i)], &lex);
        take(maxsim[size_t(i)], exact ? nullptr : &ms);
        for (const auto& part : parts) take(part[size_t(i)], exact ? &ms : nullptr);
        for (const auto& [d, sc] : engine::FuseRankings(ms, lex, lo.fusion, lo.bm25_weight, k))
            (*out)[size_t(i)].push_back({*names.at(d), d, sc});
    }
}

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
        s->tune_ = est.ok() && !s->estimate_.points.empty();
    }
    TMS_RETURN_IF_ERROR(s->ch_->Agree(st));
    // Hybrid search scores its candidates exactly when every rank's shards have their vectors loaded.
    int64_t exact = 1;
    if (s->local_) {
        for (const ShardPlacement& p : s->local_->placement()) exact = exact && p.vectors != VectorTier::kNone;
    }
    s->ch_->AllReduce(&exact, 1, MPI_MIN, "agreeing whether the vectors are loaded");
    s->exact_ = exact != 0;
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
    Status refused;  // rank 0: why its request is refused
    if (rank_ == 0) {
        // Hybrid's MaxSim search returns the best max(k, lexical_candidates), as in one process.
        SearchOptions po = opts;
        if (opts.mode == SearchMode::kHybrid) po.k = std::max(opts.k, opts.lexical_candidates);
        po.certify = false;  // SearchWithCuts does not certify: the plan is the estimate's
        const SearchOptions t = PlanSearch(tune_ ? &estimate_ : nullptr, live_docs_, vectors_,
                                           local_ ? local_->device() : Device::kCpu, po);
        if (opts.mode != SearchMode::kMaxSim &&
            (!opts.query_texts || int64_t(opts.query_texts->size()) != q.n_queries)) {
            refused = Status::InvalidArgument(
                "query texts: " + std::to_string(opts.query_texts ? opts.query_texts->size() : 0) + " for " +
                std::to_string(q.n_queries) + " queries (one text per query)");
        }
        su.mode = int64_t(opts.mode);
        su.fusion = int64_t(opts.fusion);
        su.lexical_candidates = opts.lexical_candidates;
        su.bm25_weight = opts.bm25_weight;
        su.final_k = opts.k;
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
        su.adaptive = t.adaptive;
        su.certify_steps = t.certify_steps;
        su.has_allow = t.allow != nullptr;
        su.ok = refused.ok() && batch > 0 && q.n_queries >= 0 && q.q_tokens > 0 && q.dim > 0 &&
                (q.n_queries == 0 || q.data);
    }
    MPI_Request r;
    MPI_Ibcast(&su, int(sizeof(Setup) / sizeof(int64_t)), MPI_INT64_T, 0, ch_->comm(), &r);
    ch_->Wait(&r, "broadcasting the search");
    if (!su.ok) {
        if (!refused.ok()) return refused.WithContext("MpiSearcher");
        return Status::InvalidArgument("MpiSearcher: rank 0's queries or batch size are invalid");
    }
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
    o.adaptive = su.adaptive != 0;
    o.certify_steps = int(su.certify_steps);
    if (su.has_filter) {  // every rank filters by its own copy of the index's metadata: the same set
        o.filter = rank_ == 0 ? opts.filter : std::string();
        TMS_RETURN_IF_ERROR(ch_->Broadcast(&o.filter));
    }
    const int64_t nq = su.n_queries;
    // Modes bm25 and hybrid: every query's text, and the options of the lexical search.
    const SearchMode mode = SearchMode(su.mode);
    std::vector<std::string> texts;
    SearchOptions lo = o;
    if (mode != SearchMode::kMaxSim) {
        std::string blob = rank_ == 0 ? encode_texts(*opts.query_texts) : std::string();
        TMS_RETURN_IF_ERROR(ch_->Broadcast(&blob));
        if (!decode_texts(blob, nq, &texts)) return Status::Internal("MpiSearcher: the query texts arrived truncated");
        lo.mode = SearchMode::kBm25;
        lo.k = int(mode == SearchMode::kHybrid ? su.k : su.final_k);
        lo.fusion = Fusion(su.fusion);
        lo.bm25_weight = su.bm25_weight;
        lo.lexical_candidates = int(su.lexical_candidates);
    }
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
        Status st;
        std::vector<std::vector<SearchHit>> lexical, maxsim;  // rank 0, hybrid: merged
        if (mode == SearchMode::kMaxSim) {
            // Every rank takes part in the search's cuts, holding shards or not.
            MpiCuts cuts(ch_.get(), n_docs_, n_centroids_);
            st = SearchWithCuts(local_.get(), qb, o, &cuts, &mine);
            // A failed cut's error is every rank's already, worded with the failing rank.
            if (rank_ == 0 && cuts.failed() && pending.ok()) pending = st;
            stats_.cut_s += cuts.seconds();
        } else {
            lo.query_texts = std::make_shared<const std::vector<std::string>>(texts.begin() + i * su.batch,
                                                                              texts.begin() + i * su.batch + n);
            bool agreed = false;
            st = text_round(ch_.get(), local_.get(), qb, o, lo, mode == SearchMode::kHybrid, exact_, n_docs_,
                            n_centroids_, &mine, &lexical, &maxsim, &agreed, &stats_.cut_s);
            if (rank_ == 0 && agreed && pending.ok()) pending = st;
        }
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
            if (mode == SearchMode::kHybrid) {
                fuse(lexical, maxsim, parts, exact_, n, lo, int(su.final_k), &merged);
            } else {
                MergeHits(&parts, n, mode == SearchMode::kBm25 ? lo.k : o.k, &merged);
            }
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
