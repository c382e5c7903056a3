// Copyright TileMaxSim authors. The public Searcher: an index's shards opened and placed on
// devices (each device's consecutive shards one segment, engine/shard_set.h), the vectors' tier,
// options and filters resolved, and concurrent callers gathered into one batch. The search
// itself is the shard set's (engine/pipeline.cpp, engine/exhaustive.cpp).
#include "tilemaxsim/searcher.h"

#include "tilemaxsim/estimate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <future>
#include <iterator>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <omp.h>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "engine/backend.h"
#include "engine/plan.h"
#include "engine/gpu_shard.h"
#include "engine/hybrid.h"
#include "engine/vector_rows.h"
#include "kernels/cuda/gpu_context.h"
#include "index/index_data.h"
#include "index/store/index_reader.h"
#include "index/store/shards.h"
#include "index/metadata/metadata.h"
#include "base/memory.h"
#include "base/progress.h"
#include "kernels/candidates.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"
#include "kernels/threads.h"
#include "engine/shard_searcher.h"
#include "engine/shard_set.h"

namespace tms {
namespace {

// VectorTier::kAuto's shares: an index goes on the GPU when codes, lists and vectors take at
// most kGpuShare of each GPU's free memory (the rest is left to per-search buffers); vectors
// stay in host memory when they take at most kHostShare of the host's available memory.
constexpr double kGpuShare = 0.80;
constexpr double kHostShare = 0.60;

using engine::Allowed;
using engine::check_finite;
using engine::chunk_queries;
using engine::Clock;
using engine::kMaxWidenedProbes;
using engine::Lists;
using engine::QueryCopy;
using engine::shard_bytes;
using engine::ShardSearcher;
using engine::validate_search;

// The public Searcher over its shard set.
class ShardedSearcher final : public Searcher {
public:
    const IndexInfo& info() const override { return info_; }
    Device device() const override { return device_; }
    const std::vector<ShardPlacement>& placement() const override { return placement_; }
    Status Search(const QueryBatch& q, const SearchOptions& given, std::vector<std::vector<SearchHit>>* results,
                  SearchTimings* timings) const override {
        kernels::SetThreads();  // the caller's thread runs the parallel regions
        if (given.mode != SearchMode::kMaxSim) return SearchText(q, given, results, timings);
        TMS_RETURN_IF_ERROR(check_finite(q));
        const SearchOptions opts = Plan(given);
        // Per-query sets name queries by their place in the caller's batch: they go alone.
        const bool per_query = opts.allow && opts.allow->rows > 1;
        if (gather_ && !per_query && q.n_queries > 0 && q.n_queries < kGatherMax) {
            TMS_RETURN_IF_ERROR(validate_search(info_, q, opts));  // a bad request fails alone
            TMS_RETURN_IF_ERROR(Gathered(q, opts, results, timings));
        } else {
            TMS_RETURN_IF_ERROR(SearchShards(q, opts, results, timings));
        }
        if (sample_) sample_->Add(q);
        // A query of no tokens matches nothing (its MaxSim would be 0 for every document).
        for (int i = 0; q.lengths && i < q.n_queries; ++i)
            if (q.lengths[i] == 0) (*results)[size_t(i)].clear();
        return Status::OK();
    }

    // Modes kBm25 and kHybrid: BM25 over the metadata's text index, each query restricted to its
    // allowed live documents; hybrid fuses it with the MaxSim search (engine/hybrid.h).
    Status SearchText(const QueryBatch& q, const SearchOptions& given, std::vector<std::vector<SearchHit>>* results,
                      SearchTimings* timings) const {
        const auto t0 = Clock::now();
        const int nq = q.n_queries;
        if (!given.query_texts || int64_t(given.query_texts->size()) != nq) {
            return Status::InvalidArgument(
                "query texts: " + std::to_string(given.query_texts ? given.query_texts->size() : 0) + " for " +
                std::to_string(nq) + " queries (one text per query)");
        }
        if (given.k <= 0) return Status::InvalidArgument("k must be > 0, got " + std::to_string(given.k));
        if (!(given.bm25_weight >= 0 && given.bm25_weight <= 1)) {
            return Status::InvalidArgument("bm25_weight must be in [0, 1], got " + std::to_string(given.bm25_weight));
        }
        if (given.lexical_candidates < 1 || given.lexical_candidates > 100000) {
            return Status::InvalidArgument("lexical_candidates must be in [1, 100000], got " +
                                           std::to_string(given.lexical_candidates));
        }
        if (!metadata_ || !metadata_->has_text()) {
            return Status::NotSupported(std::string(SearchModeName(given.mode)) +
                                        ": this index has no text (build it with a text field: tms index "
                                        "--metadata FILE --text-field NAME)");
        }
        SearchOptions o;
        std::optional<Allowed> allowed;
        TMS_RETURN_IF_ERROR(Resolve(q, given, &o, &allowed));
        // The live documents (this searcher's deletions are fixed: built once), and each query's
        // allowed ones among them.
        // Bits over every id of the index (a searcher of some shards holds ids up to id_end(),
        // and the text index's rows cover the whole index's).
        const int64_t n = std::max(id_end(), metadata_->n_docs()), words = DocSet::Words(n);
        std::call_once(live_once_, [&] {
            live_.assign(size_t(words), 0u);
            for (size_t s = 0; s < shards_.size(); ++s) {
                const engine::ShardSearcher& sg = shards_.segment(s);
                const int64_t first = sg.data().first_doc;
                for (int64_t i = 0; i < sg.info().n_docs; ++i)
                    if (!sg.deleted()[size_t(i)]) live_[size_t((first + i) / 32)] |= 1u << ((first + i) % 32);
            }
        });
        const std::vector<uint32_t>& live = live_;
        const bool hybrid = given.mode == SearchMode::kHybrid;
        const int n_lex = hybrid ? std::max(given.k, given.lexical_candidates) : given.k;
        std::vector<engine::Scored> lexical(static_cast<size_t>(nq));
        const auto rank_lexically = [&]() -> Status {
            std::vector<uint32_t> row;
            for (int i = 0; i < nq; ++i) {
                const uint32_t* bits = live.data();
                if (allowed) {
                    const uint32_t* a = allowed->set->Row(allowed->row(i));
                    const int64_t aw = std::min(words, DocSet::Words(allowed->set->n_docs));
                    row.assign(size_t(words), 0u);
                    for (int64_t w = 0; w < aw; ++w) row[size_t(w)] = a[w] & live[size_t(w)];
                    bits = row.data();
                }
                TMS_RETURN_IF_ERROR(
                    metadata_->Lexical((*given.query_texts)[size_t(i)], n_lex, bits, &lexical[size_t(i)]));
            }
            return Status::OK();
        };
        if (!hybrid) TMS_RETURN_IF_ERROR(rank_lexically());
        std::vector<engine::Scored> maxsim(static_cast<size_t>(nq));
        if (hybrid) {
            SearchOptions ms = given;
            ms.mode = SearchMode::kMaxSim;
            ms.query_texts = nullptr;
            ms.k = n_lex;
            std::vector<std::vector<SearchHit>> found;
            // BM25 (SQLite, one host thread) runs while the MaxSim search does (on the GPU, or
            // the other cores), so that hybrid search costs about the slower of the two.
            std::future<Status> lexical_done = std::async(std::launch::async, rank_lexically);
            const Status mst = Search(q, ms, &found, nullptr);
            const Status lst = lexical_done.get();
            TMS_RETURN_IF_ERROR(mst);
            TMS_RETURN_IF_ERROR(lst);
            // The union, scored by exact MaxSim where the vectors are loaded (BM25's documents
            // the MaxSim search did not reach included); else the MaxSim hits' own scores.
            std::vector<std::vector<int64_t>> both(static_cast<size_t>(nq));
            for (int i = 0; i < nq; ++i) {
                for (const SearchHit& h : found[size_t(i)]) both[size_t(i)].push_back(h.internal_id);
                for (const auto& [d, sc] : lexical[size_t(i)]) both[size_t(i)].push_back(d);
            }
            if (shards_.CheckExact().ok()) {
                TMS_RETURN_IF_ERROR(Rerank(q, both, 0, &found));
            }
            for (int i = 0; i < nq; ++i)
                for (const SearchHit& h : found[size_t(i)]) maxsim[size_t(i)].push_back({h.internal_id, h.score});
        }
        results->assign(size_t(nq), {});
        for (int i = 0; i < nq; ++i) {
            const engine::Scored top = hybrid ? engine::FuseRankings(maxsim[size_t(i)], lexical[size_t(i)],
                                                                     given.fusion, given.bm25_weight, given.k)
                                              : lexical[size_t(i)];
            for (const auto& [d, sc] : top) {
                int32_t local = 0;
                const engine::ShardSearcher* sg = shards_.Find(d, &local);
                if (sg) (*results)[size_t(i)].push_back({sg->data().doc_ids[size_t(local)], d, sc});
            }
        }
        if (timings) {
            *timings = SearchTimings();
            timings->total = SecondsSince(t0);
        }
        return Status::OK();
    }

    // The ids of this searcher's documents are below it: info_.n_docs when it holds every shard;
    // a searcher of some shards (SearcherOptions::shards) holds ids of the whole index's range.
    int64_t id_end() const {
        int64_t end = info_.n_docs;
        for (const ShardPlacement& p : placement_) end = std::max(end, p.first_doc + p.n_docs);
        return end;
    }

    SearchOptions Plan(const SearchOptions& given) const override {
        // The index's measured settings for the target recall (with the vectors it was measured with).
        return PlanSearch(tune_ ? &estimate_ : nullptr, info_.n_docs - info_.n_deleted, vectors_, device_, given);
    }

    // Concurrent callers' small batches, gathered (SearcherOptions::gather): each request waits
    // in `pending_`; the first one not served leads: it waits its window (gather_us), then for
    // the gathered search in flight to end (or the batch to fill), takes the requests of its
    // shape and options and searches them as one batch. One gathered search runs at a time, so
    // callers arriving during it make the next batch; a lone caller starts at once. Each wait
    // is woken alone (a request's own condition, the leader's): with many callers a shared
    // condition would wake every waiter at every arrival.
    static constexpr int kGatherMax = 256;  // requests of this many queries or more go alone
    struct Request {
        const QueryBatch* q;
        const SearchOptions* opts;
        std::vector<std::vector<SearchHit>>* out;
        SearchTimings* timings;
        Status st;
        bool taken = false;  // in a leader's batch (done once that batch is searched)
        bool done = false;
        std::condition_variable cv;  // taken, done, or this request is to lead
    };
    static bool same_shape(const Request& a, const Request& b) {
        const SearchOptions &x = *a.opts, &y = *b.opts;
        return a.q->q_tokens == b.q->q_tokens && a.q->dtype == b.q->dtype && a.q->dim == b.q->dim &&
               (a.q->lengths == nullptr) == (b.q->lengths == nullptr) && x.k == y.k && x.exhaustive == y.exhaustive &&
               x.nprobe == y.nprobe && x.ncandidates == y.ncandidates && x.rerank == y.rerank &&
               x.pruning == y.pruning && x.max_batch_queries == y.max_batch_queries && x.allow == y.allow &&
               x.filter == y.filter && x.direct_max == y.direct_max && x.certify == y.certify &&
               x.certify_steps == y.certify_steps && x.adaptive == y.adaptive;
    }

    Status Gathered(const QueryBatch& q, const SearchOptions& opts, std::vector<std::vector<SearchHit>>* results,
                    SearchTimings* timings) const {
        Request me{&q, &opts, results, timings, Status::OK(), false, false, {}};
        std::unique_lock<std::mutex> lock(gather_mu_);
        pending_.push_back(&me);
        if (leading_) leader_cv_.notify_one();  // a leader waiting for a full batch counts it
        while (!me.done) {
            if (leading_ || me.taken) {  // another thread gathers, or searches this request
                me.cv.wait(lock);
                continue;
            }
            // This thread serves a batch: of the oldest pending request's shape (its own is pending,
            // so pending_ is not empty).
            leading_ = true;
            auto full = [&] {
                int n = 0;
                for (const Request* r : pending_) n += r->q->n_queries;
                return n >= kGatherMax;
            };
            if (gather_us_ > 0) leader_cv_.wait_until(lock, Clock::now() + std::chrono::microseconds(gather_us_), full);
            leader_cv_.wait(lock, [&] { return !running_ || full(); });
            std::vector<Request*> batch;
            int n = 0;
            const Request* oldest = pending_.front();
            for (auto it = pending_.begin(); it != pending_.end();) {
                if (same_shape(**it, *oldest) && n + (*it)->q->n_queries <= kGatherMax) {
                    n += (*it)->q->n_queries;
                    (*it)->taken = true;
                    batch.push_back(*it);
                    it = pending_.erase(it);
                } else {
                    ++it;
                }
            }
            leading_ = false;
            ++running_;
            for (Request* r : pending_) {  // the oldest other request leads the ones left
                if (r == &me) continue;
                r->cv.notify_one();
                break;
            }
            lock.unlock();
            RunGathered(batch, n);
            lock.lock();
            --running_;
            for (Request* r : batch) {
                r->done = true;
                r->cv.notify_one();
            }
            leader_cv_.notify_one();  // a leader waiting for this search to end
        }
        return me.st;
    }

    // One search of the requests' queries, copied side by side; each gets its own results.
    void RunGathered(const std::vector<Request*>& batch, int n) const {
        if (batch.size() == 1) {  // alone: its own queries, no copy
            Request* r = batch.front();
            SearchTimings t;
            r->st = SearchShards(*r->q, *r->opts, r->out, &t);
            if (r->timings) *r->timings = t;
            return;
        }
        QueryCopy all(*batch.front()->q, n);
        for (const Request* r : batch) all.Append(*r->q, 0, r->q->n_queries);
        std::vector<std::vector<SearchHit>> res;
        SearchTimings t;
        const Status st = SearchShards(all.batch(), *batch.front()->opts, &res, &t);
        size_t at = 0;
        for (Request* r : batch) {
            r->st = st;
            if (st.ok()) {
                r->out->assign(std::make_move_iterator(res.begin() + at),
                               std::make_move_iterator(res.begin() + at + r->q->n_queries));
            }
            if (r->timings) {  // the batch's times, which it shared; its own queries' certificates
                *r->timings = t;
                const auto own = [&](std::vector<uint8_t>* v) {
                    if (!v->empty())
                        *v = std::vector<uint8_t>(v->begin() + ptrdiff_t(at),
                                                  v->begin() + ptrdiff_t(at) + r->q->n_queries);
                };
                own(&r->timings->certified);
                own(&r->timings->depth);
            }
            at += size_t(r->q->n_queries);
        }
    }

    Status Filter(const std::string& where, DocSet* out) const override {
        if (!metadata_) {
            return Status::NotSupported("filter: this index has no metadata (index or add documents with --metadata)");
        }
        DocSet d(metadata_->n_docs());  // the whole index's documents (its ids)
        int64_t count = 0;
        TMS_RETURN_IF_ERROR(metadata_->Filter(where, &d.bits, &count));
        *out = std::move(d);
        return Status::OK();
    }

    Status Metadata(const std::vector<int64_t>& docs, const std::vector<std::string>& fields,
                    std::vector<std::string>* objects) const override {
        if (!metadata_) return Status::NotSupported("metadata: this index has no metadata");
        return metadata_->Rows(docs, fields, objects);
    }

    // The documents a search may return: opts.allow and opts.filter together (null when
    // neither is set), with *o the options the search runs with (nprobe widened for them).
    Status Resolve(const QueryBatch& q, const SearchOptions& opts, SearchOptions* o,
                   std::optional<Allowed>* out) const {
        *o = opts;
        out->reset();
        if (!opts.allow && opts.filter.empty()) return Status::OK();
        const int64_t end = id_end();
        std::shared_ptr<DocSet> set;
        if (!opts.filter.empty()) {
            set = std::make_shared<DocSet>();
            TMS_RETURN_IF_ERROR(Filter(opts.filter, set.get()));
        }
        if (opts.allow) {
            const DocSet& a = *opts.allow;
            if (a.n_docs < end || a.rows < 1 || (a.rows > 1 && a.rows != q.n_queries) ||
                a.bits.size() != size_t(a.rows) * size_t(DocSet::Words(a.n_docs))) {
                return Status::InvalidArgument(
                    "allow: a set of " + std::to_string(a.rows) + " rows over " + std::to_string(a.n_docs) +
                    " documents (" + std::to_string(a.bits.size()) + " words) for " + std::to_string(q.n_queries) +
                    " queries over " + std::to_string(end) + " documents; want 1 or " + std::to_string(q.n_queries) +
                    " rows of Words(n_docs) words");
            }
            if (!set) {
                set = std::const_pointer_cast<DocSet>(opts.allow);  // read only below
            } else {                                                // both: the filter's row and each of allow's
                auto both = std::make_shared<DocSet>(std::min(a.n_docs, set->n_docs), a.rows);
                const int64_t words = DocSet::Words(both->n_docs);
                for (int r = 0; r < a.rows; ++r)
                    for (int64_t w = 0; w < words; ++w)
                        both->bits[size_t(r) * size_t(words) + size_t(w)] = a.Row(r)[w] & set->Row(0)[w];
                if (both->n_docs % 32) {
                    for (int r = 0; r < a.rows; ++r)
                        both->bits[size_t(r + 1) * size_t(words) - 1] &= (1u << (both->n_docs % 32)) - 1u;
                }
                set = std::move(both);
            }
        }
        // Per row: a query allowed no more than direct_max documents (SearchOptions) scores
        // them all; every row widens its probing and rerank for its share (WidenForAllowed). The
        // batch runs as its widest row needs.
        const int64_t n = std::max<int64_t>(1, set->n_docs);
        const int64_t keeps = std::max<int64_t>({opts.ncandidates, opts.rerank, opts.k});
        const double widest = double(q.q_tokens) * kMaxWidenedProbes * double(n) / std::max(1, n_centroids());
        const double direct_max = opts.direct_max >= 0 ? double(opts.direct_max) : std::max(widest, kDirectMinDocs);
        auto direct = std::make_shared<std::vector<char>>(size_t(set->rows), 0);
        auto narrow = std::make_shared<std::vector<char>>(size_t(set->rows), 0);
        for (int r = 0; r < set->rows; ++r) {
            const int64_t c = set->Count(r);
            (*narrow)[size_t(r)] = 2 * c <= n;
            (*direct)[size_t(r)] = c <= keeps || double(c) <= direct_max;
            engine::WidenForAllowed(opts, c, n, (*direct)[size_t(r)], o);
        }
        Allowed al;
        al.set = set;
        al.direct_rows = direct;
        al.narrow_rows = narrow;
        *out = std::move(al);
        return Status::OK();
    }
    // Scoring this many allowed documents for every query of a batch of 256 takes ~65 ms on
    // one GPU, and probing finds a narrow filter's documents poorly where they cluster in topics
    // (a 5% filter of 1M synthetic documents, 131,072 centroids: recall@10 0.36 probing, above
    // 0.99 scoring all): the default direct_max never goes below it, whatever the centroid
    // count makes the widest probing cost.
    static constexpr double kDirectMinDocs = 65536;

    Status SearchShards(const QueryBatch& q, const SearchOptions& opts_in, std::vector<std::vector<SearchHit>>* results,
                        SearchTimings* timings) const {
        SearchOptions opts;
        std::optional<Allowed> allowed;
        TMS_RETURN_IF_ERROR(Resolve(q, opts_in, &opts, &allowed));
        const Allowed* al = allowed ? &*allowed : nullptr;
        if (!opts.exhaustive) {
            TMS_RETURN_IF_ERROR(validate_search(info_, q, opts));
            // Capped by the index's size, as ShardSearcher::Search caps them.
            const int64_t n_docs = std::max<int64_t>(1, info_.n_docs);
            opts.k = int(std::min<int64_t>(opts.k, n_docs));
            opts.rerank = int(std::min<int64_t>(opts.rerank, n_docs));
        }
        return shards_.Search(q, opts, al, info_.n_docs, n_centroids(), nullptr, Status::OK(), results, timings);
    }

    Status Rerank(const QueryBatch& q, const std::vector<std::vector<int64_t>>& candidates, int k,
                  std::vector<std::vector<SearchHit>>* results) const override {
        kernels::SetThreads();  // the caller's thread runs the parallel regions
        TMS_RETURN_IF_ERROR(validate_search(info_, q, SearchOptions{}));  // the queries' shape and lengths
        if (int64_t(candidates.size()) != q.n_queries) {
            return Status::InvalidArgument(std::to_string(candidates.size()) + " candidate lists for " +
                                           std::to_string(q.n_queries) + " queries");
        }
        if (k < 0) return Status::InvalidArgument("k must be >= 0, got " + std::to_string(k));
        TMS_RETURN_IF_ERROR(shards_.CheckExact());
        TMS_RETURN_IF_ERROR(check_finite(q));
        const int nq = q.n_queries;
        // Each query's candidates, once each, ascending (so that each shard's are contiguous).
        std::vector<std::vector<int64_t>> cand(static_cast<size_t>(nq));
        for (int i = 0; i < nq; ++i) {
            cand[size_t(i)] = candidates[size_t(i)];
            auto& c = cand[size_t(i)];
            std::sort(c.begin(), c.end());
            c.erase(std::unique(c.begin(), c.end()), c.end());
            if (!c.empty() && (c.front() < 0 || c.back() >= id_end())) {
                return Status::InvalidArgument("query " + std::to_string(i) + ": candidate id " +
                                               std::to_string(c.front() < 0 ? c.front() : c.back()) + " outside [0, " +
                                               std::to_string(id_end()) + ")");
            }
        }
        TMS_RETURN_IF_ERROR(shards_.Rerank(q, cand, k, results));
        for (int i = 0; q.lengths && i < nq; ++i)
            if (q.lengths[i] == 0) (*results)[size_t(i)].clear();  // a query of no tokens matches nothing
        return Status::OK();
    }

    Status DocumentVectors(const std::vector<int64_t>& docs, std::vector<std::vector<uint16_t>>* rows) const override {
        rows->assign(docs.size(), {});
        for (size_t i = 0; i < docs.size(); ++i) {
            int32_t local = 0;
            const ShardSearcher* sh = shards_.Find(docs[i], &local);
            if (!sh) return Status::InvalidArgument("document " + std::to_string(docs[i]) + " is not in the index");
            TMS_RETURN_IF_ERROR(sh->DocRows(local, &(*rows)[i]));
        }
        return Status::OK();
    }

    void FindDocs(const std::vector<std::string>& doc_ids, std::vector<int64_t>* internal_ids) const override {
        // The segments opened whole: their ids as placed (shared by the searchers refreshed from
        // this one); the added segments': this searcher's own. A document deleted since it was
        // placed is looked for among the added ones (a replace's new version) and else absent.
        const size_t n_base = shards_.size() - added_.size();
        const auto fill = [&](size_t s0, size_t s1, bool placed, std::unordered_map<std::string, int64_t>* m) {
            for (size_t s = s0; s < s1; ++s) {
                const engine::ShardSearcher& sg = shards_.segment(s);
                const std::vector<char>& del = placed ? sg.data().deleted : sg.deleted();
                const index::IndexData& d = sg.data();
                for (int64_t i = 0; i < d.info.n_docs; ++i)
                    if (!del[size_t(i)]) m->emplace(d.doc_ids[size_t(i)], d.first_doc + i);
            }
        };
        std::call_once(base_ids_->once, [&] { fill(0, n_base, true, &base_ids_->ids); });
        std::call_once(added_ids_once_, [&] { fill(n_base, shards_.size(), false, &added_ids_); });
        internal_ids->resize(doc_ids.size());
        for (size_t i = 0; i < doc_ids.size(); ++i) {
            int64_t& out = (*internal_ids)[i];
            out = -1;
            if (const auto a = added_ids_.find(doc_ids[i]); a != added_ids_.end()) {
                out = a->second;
            } else if (const auto b = base_ids_->ids.find(doc_ids[i]); b != base_ids_->ids.end()) {
                int32_t local = 0;
                if (shards_.Find(b->second, &local)) out = b->second;  // (null: deleted since)
            }
        }
    }

    int n_centroids() const { return shards_.n_centroids(); }

    Status Refresh(std::unique_ptr<Searcher>* out, bool* whole) const override;

    Status Explain(const QueryBatch& q, const std::vector<std::vector<int64_t>>& docs,
                   std::vector<std::vector<Explanation>>* out) const override {
        TMS_RETURN_IF_ERROR(validate_search(info_, q, SearchOptions{}));
        TMS_RETURN_IF_ERROR(check_finite(q));
        if (int64_t(docs.size()) != q.n_queries) {
            return Status::InvalidArgument("explain: " + std::to_string(docs.size()) + " document lists for " +
                                           std::to_string(q.n_queries) + " queries");
        }
        std::vector<float> conv;
        const float* qf = q.n_queries > 0 ? engine::HostF32(q, &conv) : nullptr;
        const int dim = q.dim;
        out->assign(docs.size(), {});
        std::vector<uint16_t> half;
        std::vector<float> rows;
        for (int i = 0; i < q.n_queries; ++i) {
            const int len = q.lengths ? q.lengths[i] : q.q_tokens;
            std::vector<std::vector<std::pair<int32_t, int32_t>>> spans;
            TMS_RETURN_IF_ERROR(DocSpans(docs[size_t(i)], &spans));
            for (size_t k = 0; k < docs[size_t(i)].size(); ++k) {
                const int64_t d = docs[size_t(i)][k];
                int32_t local = 0;
                const engine::ShardSearcher* sg = d >= 0 && d < info_.n_docs ? shards_.Find(d, &local) : nullptr;
                if (!sg) {
                    return Status::InvalidArgument("explain: query " + std::to_string(i) + ": document " +
                                                   std::to_string(d) + " is not in the index (or deleted)");
                }
                Explanation e;
                e.doc = d;
                const Status st = sg->DocRows(local, &half);
                if (st.ok()) {
                    rows.resize(half.size());
                    for (size_t j = 0; j < half.size(); ++j) rows[j] = kernels::half_to_float(half[j]);
                } else if (st.code() == Status::Code::kNotSupported) {
                    sg->DecodedRows(local, &rows);
                    e.from_codes = true;
                } else {
                    return st;
                }
                const int64_t n = int64_t(rows.size()) / dim;
                for (int t = 0; t < len; ++t) {
                    const float* qt = qf + (size_t(i) * q.q_tokens + t) * dim;
                    float best = -INFINITY;
                    int32_t arg = -1;
                    for (int64_t r = 0; r < n; ++r) {
                        float s = 0;
                        for (int j = 0; j < dim; ++j) s += qt[j] * rows[size_t(r * dim + j)];
                        if (s > best) {
                            best = s;
                            arg = int32_t(r);
                        }
                    }
                    e.doc_tokens.push_back(arg);
                    e.similarities.push_back(best);
                    e.score += best;
                    if (!spans[k].empty() && arg >= 0 && size_t(arg) < spans[k].size())
                        e.spans.push_back(spans[k][size_t(arg)]);
                }
                if (e.spans.size() != e.doc_tokens.size()) e.spans.clear();
                (*out)[size_t(i)].push_back(std::move(e));
            }
        }
        return Status::OK();
    }

    // Each of `docs`' token spans (the metadata's spans column, checked when written), or none
    // where the index or the document keeps none.
    Status DocSpans(const std::vector<int64_t>& docs,
                    std::vector<std::vector<std::pair<int32_t, int32_t>>>* out) const {
        out->assign(docs.size(), {});
        if (!metadata_ || metadata_->spans_column().empty() || docs.empty()) return Status::OK();
        std::vector<int64_t> known;  // Rows takes ids below n_docs (Explain refuses the others)
        for (int64_t d : docs) known.push_back(d >= 0 && d < metadata_->n_docs() ? d : 0);
        std::vector<std::string> objects;
        TMS_RETURN_IF_ERROR(metadata_->Rows(known, {metadata_->spans_column()}, &objects));
        for (size_t k = 0; k < docs.size(); ++k) {
            const nlohmann::json o = nlohmann::json::parse(objects[k], nullptr, false);
            if (!o.is_object() || o.empty() || !o.begin()->is_string()) continue;
            const nlohmann::json a = nlohmann::json::parse(o.begin()->get<std::string>(), nullptr, false);
            if (!a.is_array()) continue;
            for (const nlohmann::json& p : a) {
                if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || !p[1].is_number_integer()) {
                    (*out)[k].clear();
                    break;
                }
                (*out)[k].push_back({p[0].get<int32_t>(), p[1].get<int32_t>()});
            }
        }
        return Status::OK();
    }

    ServedQueries Served() const override {
        ServedQueries out = sample_ ? sample_->Get() : ServedQueries();
        out.dim = info_.dim;  // (also of an empty sample)
        return out;
    }

    IndexInfo info_;
    std::unique_ptr<index::MetadataSnapshot> metadata_;  // null: the index has no metadata
    RecallEstimate estimate_;                            // the index's, when it has one
    bool tune_ = false;                                  // estimate_ has points (PlanSearch: whether they apply)
    bool vectors_ = false;                               // the vectors are loaded (exhaustive search can run)
    Device device_ = Device::kCpu;
    std::vector<ShardPlacement> placement_;
    bool gather_ = true;  // SearcherOptions::gather
    int gather_us_ = 0;   // SearcherOptions::gather_us
    mutable std::mutex gather_mu_;
    mutable std::condition_variable leader_cv_;  // the leader's: arrivals, the search in flight ended
    mutable std::vector<Request*> pending_;
    mutable bool leading_ = false;
    mutable int running_ = 0;  // gathered searches in flight (at most one)
    // FindDocs' lookups, each built at its first use: the ids of the segments opened whole
    // (shared with the searchers refreshed from this one), and of the added ones.
    struct IdMap {
        std::once_flag once;
        std::unordered_map<std::string, int64_t> ids;
    };
    std::shared_ptr<IdMap> base_ids_ = std::make_shared<IdMap>();
    mutable std::once_flag live_once_;  // SearchText's bitmap of the live documents, at its first use
    mutable std::vector<uint32_t> live_;
    mutable std::once_flag added_ids_once_;
    mutable std::unordered_map<std::string, int64_t> added_ids_;
    std::shared_ptr<QuerySample> sample_;  // SearcherOptions::record_into / record_queries
    engine::ShardSet shards_;              // the segments on their devices
    // For Refresh: how it was opened, each store as loaded (empty: some shards only), and the
    // segments of documents added since the index was opened whole (the last ones of shards_,
    // each the head store's documents from `start`, ascending).
    SearcherOptions opts_;
    std::string path_;
    VectorTier tier_ = VectorTier::kNone;
    std::vector<index::StoreMark> marks_;
    struct Added {
        index::StoreStart start;
        int64_t n_docs = 0, bytes = 0;
    };
    std::vector<Added> added_;
};

// Segments of added documents a refreshed searcher holds at most: as a binary counter's digits,
// a new segment absorbs the last ones that are no larger (each document is read again about
// log2 of the additions times), and past this many the last is absorbed anyway.
constexpr size_t kMaxAddedSegments = 8;

Status ShardedSearcher::Refresh(std::unique_ptr<Searcher>* out, bool* whole) const {
    if (whole) *whole = true;
    const auto open_whole = [&] {
        SearcherOptions o = opts_;
        o.record_into = sample_;  // the queries recorded so far stay
        return Searcher::Open(o, path_, out);
    };
    if (marks_.empty()) return open_whole();
    kernels::SetThreads(opts_.threads);
    const index::StoreStart loaded = marks_.back().end;
    // The added segments kept as they are (the first `keep`), and where the new one starts.
    size_t keep = added_.size();
    index::StoreStart from = loaded;
    index::IndexUpdate u;
    std::unique_ptr<index::MetadataSnapshot> meta;
    const auto choose_from = [&](int64_t head_docs) {
        int64_t reading = head_docs - loaded.doc;
        while (reading > 0 && keep > 0 && (added_[keep - 1].n_docs <= reading || keep >= kMaxAddedSegments)) {
            reading += added_[keep - 1].n_docs;
            from = added_[--keep].start;
        }
        return from;
    };
    TMS_RETURN_IF_ERROR(index::ReadIndexUpdate(path_, marks_, choose_from, tier_ != VectorTier::kNone, &u, &meta));
    if (u.rewritten) return open_whole();
    if (whole) *whole = false;
    auto s = std::make_unique<ShardedSearcher>();
    s->gather_ = gather_;
    s->gather_us_ = gather_us_;
    s->sample_ = sample_;
    s->base_ids_ = base_ids_;
    s->device_ = device_;
    s->opts_ = opts_;
    s->path_ = path_;
    s->tier_ = tier_;
    s->vectors_ = vectors_;
    s->marks_ = u.marks;
    s->metadata_ = std::move(meta);
    s->info_ = u.info;
    if (s->metadata_) {
        s->metadata_->SetLimits(opts_.filter_time_ms, opts_.filter_max_bytes);
        s->info_.metadata_rows = s->metadata_->rows();
        s->info_.metadata_columns = s->metadata_->columns();
    }
    // The segments kept, with every tombstone now; the new one placed where the head store is.
    std::vector<char> deleted(size_t(u.info.n_docs), 0);
    for (int64_t g : u.tombstones) deleted[size_t(g)] = 1;
    const size_t n_base = shards_.size() - added_.size(), n_kept = n_base + keep;
    for (size_t i = 0; i < n_kept; ++i) {
        const engine::ShardSearcher& sg = shards_.segment(i);
        const auto first = deleted.begin() + sg.data().first_doc;
        s->shards_.Add(sg.WithTombstones(std::vector<char>(first, first + sg.info().n_docs)));
    }
    std::vector<std::vector<size_t>> groups;
    size_t head_group = 0;
    for (const auto& g : shards_.by_device()) {
        std::vector<size_t> kept;
        for (size_t i : g) {
            if (i < n_kept) kept.push_back(i);
            if (i == n_base - 1) head_group = groups.size();
        }
        groups.push_back(std::move(kept));
    }
    s->added_.assign(added_.begin(), added_.begin() + ptrdiff_t(keep));
    ShardPlacement& head = (s->placement_ = placement_).back();
    for (size_t i = keep; i < added_.size(); ++i) head.bytes -= added_[i].bytes;
    if (u.added.info.n_docs > 0) {
        const int64_t bytes = shard_bytes(u.added, false);
        std::vector<index::IndexData> one(1);
        one[0] = std::move(u.added);
        std::vector<index::PodVector<uint16_t>> parts;
        const std::shared_ptr<kernels::GpuContext>& ctx = shards_.segment(n_base - 1).context();
        auto seg = std::make_unique<engine::ShardSearcher>(&one, ctx ? &parts : nullptr, opts_.stream_bytes);
        // Read into memory (a disk tier's rows come from the stores' files, which the added
        // documents' are not kept as): on a GPU, those stay in host memory.
        const VectorTier tier = tier_ == VectorTier::kDisk && ctx ? VectorTier::kHost : tier_;
        {  // the context's stream and scratch serve one caller at a time (a search holds them too)
            std::unique_lock<std::mutex> lock;
            if (ctx) lock = std::unique_lock<std::mutex>(ctx->mutex());
            TMS_RETURN_IF_ERROR(seg->Place(ctx, /*warm_up=*/false, tier, &parts));
        }
        groups[head_group].push_back(s->shards_.Add(std::move(seg)));
        s->added_.push_back({from, s->shards_.segment(s->shards_.size() - 1).info().n_docs, bytes});
        head.bytes += bytes;
    }
    for (auto& g : groups) s->shards_.AddDevice(std::move(g));
    head.n_docs = u.info.shards.back().n_docs;
    if (head.vectors != VectorTier::kNone) head.vector_bytes = u.info.shards.back().n_tokens * u.info.dim * 2;
    const Status est = ReadRecallEstimate(path_, &s->estimate_);
    if (!est.ok() && est.code() != Status::Code::kNotFound) return est;
    s->tune_ = est.ok() && !s->estimate_.points.empty();
    *out = std::move(s);
    return Status::OK();
}

// GPUs for the shards: opts.gpus (each present) or every visible one.
Status choose_gpus(const SearcherOptions& opts, std::vector<int>* gpus) {
    int n = 0;
    TMS_RETURN_IF_ERROR(engine::GpuDeviceCount(&n));
    gpus->clear();
    if (opts.gpus.empty()) {
        for (int g = 0; g < n; ++g) gpus->push_back(g);
        return Status::OK();
    }
    for (int g : opts.gpus) {
        if (g < 0 || g >= n) {
            return Status::InvalidArgument("GPU " + std::to_string(g) + " is not present (" + std::to_string(n) +
                                           " visible: " + (n ? "0-" + std::to_string(n - 1) : std::string("none")) +
                                           ")");
        }
        if (std::find(gpus->begin(), gpus->end(), g) != gpus->end()) {
            return Status::InvalidArgument("GPU " + std::to_string(g) + " is listed twice");
        }
        gpus->push_back(g);
    }
    return Status::OK();
}

// Shards in order onto the GPUs in order, cut where the running byte count passes each GPU's
// even share (a shard goes where its middle byte falls): each GPU holds consecutive shards,
// searched as one, and about the same bytes.
std::vector<int> place_by_size(const std::vector<int64_t>& bytes, const std::vector<int>& gpus) {
    int64_t total = 0;
    for (int64_t b : bytes) total += b;
    std::vector<int> out(bytes.size(), -1);
    const int64_t g = int64_t(gpus.size());
    int64_t before = 0;
    for (size_t s = 0; s < bytes.size(); ++s) {
        const double middle = double(before) + 0.5 * double(bytes[s]);
        const int64_t at =
            total > 0 ? int64_t(middle * double(g) / double(total)) : int64_t(s) * g / int64_t(bytes.size());
        out[s] = gpus[size_t(std::clamp<int64_t>(at, 0, g - 1))];
        before += bytes[s];
    }
    return out;
}

}  // namespace

Searcher::~Searcher() = default;

int64_t DocSet::Count(int r) const {
    int64_t n = 0;
    const uint32_t* row = Row(r);
    for (int64_t w = 0; w < Words(n_docs); ++w) n += __builtin_popcount(row[w]);
    return n;
}
SearchCuts::~SearchCuts() = default;

Status SearchWithCuts(const Searcher* searcher, const QueryBatch& q, const SearchOptions& opts, SearchCuts* cuts,
                      std::vector<std::vector<SearchHit>>* results, SearchTimings* timings) {
    if (cuts == nullptr) return Status::InvalidArgument("SearchWithCuts: no cuts");
    const auto* s = dynamic_cast<const ShardedSearcher*>(searcher);
    if (searcher && !s) return Status::InvalidArgument("SearchWithCuts: not a Searcher of this library");
    if (opts.exhaustive) {  // exact per participant: no cuts
        if (s) return s->Search(q, opts, results, timings);
        results->assign(size_t(std::max(q.n_queries, 0)), {});
        return Status::OK();
    }
    Status st;
    const engine::ShardSet none;
    SearchOptions o = opts;
    std::optional<Allowed> allowed;
    if (s) {
        st = validate_search(s->info_, q, opts);
        if (st.ok()) st = check_finite(q);
        if (st.ok()) st = s->Resolve(q, opts, &o, &allowed);
    }
    // Certification fits each query's bounds to its own reranked documents, which a spread
    // search holds in pieces: it would differ from one Searcher's (every participant alike).
    o.certify = false;
    TMS_RETURN_IF_ERROR((s ? s->shards_ : none)
                            .Search(q, o, allowed ? &*allowed : nullptr, cuts->n_docs(), cuts->n_centroids(), cuts, st,
                                    results, timings));
    for (int i = 0; q.lengths && i < q.n_queries; ++i)
        if (q.lengths[i] == 0) (*results)[size_t(i)].clear();  // a query of no tokens matches nothing
    return Status::OK();
}

namespace {

std::string gib(int64_t bytes) {
    char b[32];
    std::snprintf(b, sizeof b, "%.1f GiB", double(bytes) / double(int64_t(1) << 30));
    return b;
}

// The vectors' tier opts ask for, kAuto resolved, checked against the memory it needs (the
// opened shards' vectors; on GPUs with their codes and lists, spread evenly).
Status choose_tier(const SearcherOptions& opts, const std::string& path, Device device, const std::vector<int>& gpus,
                   VectorTier* out) {
    VectorTier want = opts.load_vectors ? opts.vectors : VectorTier::kNone;
    if (device == Device::kCpu && want == VectorTier::kGpu) want = VectorTier::kHost;  // as documented
    *out = VectorTier::kNone;
    if (want == VectorTier::kNone) return Status::OK();
    IndexInfo info;
    if (!index::ReadIndexInfo(path, &info).ok()) {
        // The whole index's metadata cannot be read (a subset of shards is opened where the
        // others are missing, or the index is damaged: the read that follows says so): the
        // vectors are read into memory, on the GPU for kAuto on a GPU, unmeasured.
        *out = want != VectorTier::kAuto ? want : device == Device::kGpu ? VectorTier::kGpu : VectorTier::kHost;
        return Status::OK();
    }
    if (!info.has_vectors) {
        if (want == VectorTier::kAuto) return Status::OK();
        return Status::NotSupported(std::string("vectors ") + VectorTierName(want) +
                                    ": this index has no stored vectors (rebuild with --keep-vectors)");
    }
    int64_t tokens = 0;
    for (size_t i = 0; i < info.shards.size(); ++i) {
        if (opts.shards.empty() || std::find(opts.shards.begin(), opts.shards.end(), int(i)) != opts.shards.end()) {
            tokens += info.shards[i].n_tokens;
        }
    }
    const int64_t vec = tokens * info.dim * 2;
    // Centroid ids and codes (the IVF lists are smaller), and the decoded tokens' scales.
    const int64_t codes = int64_t(double(tokens) * (info.code_bytes_per_token + (info.unit_norm ? 4 : 0)));
    const int64_t host_avail = HostAvailableMemory();
    int64_t gpu_free = 0;
    int free_gpu = -1;  // the GPU with the least free memory
    if (device == Device::kGpu) {
        for (int g : gpus) {
            int64_t f = 0;
            TMS_RETURN_IF_ERROR(engine::GpuFreeMemory(g, &f));
            if (free_gpu < 0 || f < gpu_free) {
                gpu_free = f;
                free_gpu = g;
            }
        }
    }
    const int64_t per_gpu = gpus.empty() ? 0 : (vec + codes) / int64_t(gpus.size());
    // kAuto leaves room (kGpuShare, kHostShare); an explicit tier needs only to fit.
    const auto gpu_fits = [&](double share) { return device == Device::kGpu && per_gpu <= share * double(gpu_free); };
    const auto host_fits = [&](double share) { return vec <= share * double(host_avail); };
    if (want == VectorTier::kAuto) {
        *out = gpu_fits(kGpuShare) ? VectorTier::kGpu : host_fits(kHostShare) ? VectorTier::kHost : VectorTier::kDisk;
        return Status::OK();
    }
    if (want == VectorTier::kGpu && !gpu_fits(0.95)) {
        return Status::ResourceExhausted("vectors gpu: " + gib(per_gpu) +
                                         " of vectors and codes per GPU do not fit in GPU " + std::to_string(free_gpu) +
                                         "'s " + gib(gpu_free) + " free; --vectors " +
                                         (host_fits(0.9) ? "host" : "disk") + " would hold them");
    }
    if (want == VectorTier::kHost && !host_fits(0.9)) {
        return Status::ResourceExhausted("vectors host: " + gib(vec) + " of vectors do not fit in the host's " +
                                         gib(host_avail) + " available; --vectors disk reads them from the index");
    }
    *out = want;
    return Status::OK();
}

}  // namespace

Status ResolveVectorTier(const SearcherOptions& opts, const std::string& path, VectorTier* out) {
    Device device;
    TMS_RETURN_IF_ERROR(engine::ResolveDevice(opts.device, &device));
    std::vector<int> gpus;
    if (device == Device::kGpu) TMS_RETURN_IF_ERROR(choose_gpus(opts, &gpus));
    return choose_tier(opts, path, device, gpus, out);
}

Status Searcher::Open(const SearcherOptions& opts, const std::string& path, std::unique_ptr<Searcher>* out) {
    if (opts.threads < 0 || opts.threads > kMaxThreads) {
        return Status::InvalidArgument("threads must be in [0, " + std::to_string(kMaxThreads) + "], got " +
                                       std::to_string(opts.threads));
    }
    if (opts.stream_bytes <= 0) {
        return Status::InvalidArgument("stream_bytes must be > 0, got " + std::to_string(opts.stream_bytes));
    }
    if (opts.filter_time_ms <= 0 || opts.filter_max_bytes <= 0) {
        return Status::InvalidArgument("filter_time_ms and filter_max_bytes must be > 0");
    }
    if (opts.gather_us < 0 || opts.gather_us > 1000000) {
        return Status::InvalidArgument("gather_us must be in [0, 1000000], got " + std::to_string(opts.gather_us));
    }
    auto s = std::make_unique<ShardedSearcher>();
    s->gather_ = opts.gather;
    s->gather_us_ = opts.gather_us;
    s->sample_ = opts.record_into          ? opts.record_into
                 : opts.record_queries > 0 ? std::make_shared<QuerySample>(opts.record_queries)
                                           : nullptr;
    kernels::SetThreads(opts.threads);
    kernels::SingleThreadedBlas();
    Trace trace = LoadTrace();
    TMS_RETURN_IF_ERROR(engine::ResolveDevice(opts.device, &s->device_));
    std::vector<int> gpus;
    if (s->device_ == Device::kGpu) TMS_RETURN_IF_ERROR(choose_gpus(opts, &gpus));
    trace.Mark("device");
    VectorTier tier;
    TMS_RETURN_IF_ERROR(choose_tier(opts, path, s->device_, gpus, &tier));
    trace.Mark("vector tier");
    std::vector<index::IndexData> data;
    // Vectors for the GPU stay in their files until they upload (read and copied at once, with
    // no host copy of the whole).
    const index::VectorLoad load = tier == VectorTier::kNone   ? index::VectorLoad::kNone
                                   : tier == VectorTier::kDisk ? index::VectorLoad::kFile
                                   : tier == VectorTier::kGpu  ? index::VectorLoad::kFileOrMemory
                                                               : index::VectorLoad::kMemory;
    TMS_RETURN_IF_ERROR(index::ReadIndexShards(path, load, opts.progress, &data, opts.shards, &s->metadata_));
    if (s->metadata_) s->metadata_->SetLimits(opts.filter_time_ms, opts.filter_max_bytes);
    trace.Mark("read (total)");
    s->opts_ = opts;
    s->opts_.progress = false;  // a refresh reads few documents, without bars
    s->path_ = path;
    s->tier_ = tier;
    if (opts.shards.empty()) {
        for (const index::IndexData& d : data)
            s->marks_.push_back({d.store_identity, {d.info.n_docs, d.info.n_tokens, d.info.n_chunks}});
    }
    s->info_ = index::SumShardInfos(data);
    if (s->metadata_) {  // as ReadIndexInfo says it (the rows of the documents the stores hold)
        s->info_.metadata_rows = s->metadata_->rows();
        s->info_.metadata_columns = s->metadata_->columns();
    }
    std::vector<int> numbers = opts.shards;  // the shards read, in shard order
    std::sort(numbers.begin(), numbers.end());
    numbers.erase(std::unique(numbers.begin(), numbers.end()), numbers.end());
    std::vector<int64_t> bytes;
    for (const auto& d : data) bytes.push_back(shard_bytes(d, tier == VectorTier::kGpu));
    const std::vector<int> where =
        s->device_ == Device::kGpu ? place_by_size(bytes, gpus) : std::vector<int>(data.size(), -1);
    for (size_t i = 0; i < data.size(); ++i) {
        ShardPlacement p;
        p.shard = opts.shards.empty() ? int(i) : numbers[i];
        p.device = s->device_;
        p.gpu = where[i];
        p.first_doc = data[i].first_doc;
        p.n_docs = data[i].info.n_docs;
        p.bytes = bytes[i];
        p.vectors = data[i].info.has_vectors ? tier : VectorTier::kNone;
        p.vector_bytes = p.vectors == VectorTier::kNone ? 0 : data[i].info.n_tokens * data[i].info.dim * 2;
        s->placement_.push_back(p);
    }
    // Segments: runs of consecutive shards on one device (a subset of the shards breaks runs
    // at its gaps), each concatenated into one ShardSearcher. On a GPU the vectors stay in
    // their shards' files (or arrays) until they are uploaded (no host copy of the whole).
    struct Segment {
        int gpu;
        std::vector<index::IndexData> shards;
    };
    std::vector<Segment> runs;
    for (size_t i = 0; i < data.size(); ++i) {
        const bool joins = opts.join_shards && i > 0 && where[i] == where[i - 1] &&
                           data[i].first_doc == data[i - 1].first_doc + data[i - 1].info.n_docs;
        if (!joins) runs.push_back({where[i], {}});
        runs.back().shards.push_back(std::move(data[i]));
    }
    data.clear();
    std::vector<std::vector<index::PodVector<uint16_t>>> vectors(runs.size());
    for (size_t r = 0; r < runs.size(); ++r) {
        s->shards_.Add(std::make_unique<ShardSearcher>(
            &runs[r].shards, s->device_ == Device::kGpu ? &vectors[r] : nullptr, opts.stream_bytes));
    }
    trace.Mark("segments");
    // One context per GPU, shared by its segments; GPUs are filled side by side (one thread each).
    if (s->device_ == Device::kGpu) {
        std::vector<std::shared_ptr<kernels::GpuContext>> ctx(gpus.size());
        std::vector<size_t> ctx_of;  // device group -> index into gpus
        for (size_t g = 0; g < gpus.size(); ++g) {
            std::vector<size_t> mine;
            for (size_t r = 0; r < runs.size(); ++r)
                if (runs[r].gpu == gpus[g]) mine.push_back(r);
            if (mine.empty()) continue;
            TMS_RETURN_IF_ERROR(engine::MakeGpuContext(gpus[g], &ctx[g]));
            s->shards_.AddDevice(mine);
            ctx_of.push_back(g);
        }
        const auto& groups = s->shards_.by_device();
        std::vector<Status> sts(groups.size());
        std::vector<std::thread> up;
        for (size_t gi = 0; gi < groups.size(); ++gi) {
            up.emplace_back([&, gi] {
                for (size_t r : groups[gi]) {
                    sts[gi] = s->shards_.segment(r).Place(ctx[ctx_of[gi]], opts.warm_up, tier, &vectors[r]);
                    if (!sts[gi].ok()) return;
                }
            });
        }
        for (auto& t : up) t.join();
        for (const Status& st : sts) TMS_RETURN_IF_ERROR(st);
    } else {
        std::vector<size_t> all;
        for (size_t r = 0; r < s->shards_.size(); ++r) {
            TMS_RETURN_IF_ERROR(s->shards_.segment(r).Place(nullptr, false, tier, &vectors[r]));
            all.push_back(r);
        }
        s->shards_.AddDevice(std::move(all));
        // Every searching thread runs BLAS products (the centroid scores).
        TMS_RETURN_IF_ERROR(kernels::check_blas_room(omp_get_max_threads(), int64_t(32) << 20, path));
    }
    if (s->device_ == Device::kGpu) trace.Mark("gpu upload and warm-up");
    const Status est = ReadRecallEstimate(path, &s->estimate_);
    if (!est.ok() && est.code() != Status::Code::kNotFound) return est;
    s->vectors_ = tier != VectorTier::kNone;
    s->tune_ = est.ok() && !s->estimate_.points.empty();
    *out = std::move(s);
    return Status::OK();
}

}  // namespace tms
