// Copyright TileMaxSim authors. End-to-end search through the public API: exhaustive search
// equals brute force; default approximate search reaches recall@10 >= 0.95 vs exhaustive.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <filesystem>
#include <limits>
#include <mutex>
#include <random>
#include <numeric>
#include <set>
#include <thread>
#include <unistd.h>

#include "engine/cuts.h"
#include "index/index_data.h"
#include "index/store/index_reader.h"
#include "kernels/maxsim.h"
#include "tests/engine/degenerate_corpora.h"
#include "tests/engine/synth_index.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

std::string search_dir(const std::string& name) { return testing::ScratchDir("tms_" + name).string(); }

// A clustered corpus: documents near a few topic directions, so that ranking is non-trivial.
struct Corpus {
    int dim;
    std::vector<float> docs;  // [n_tokens, dim]
    std::vector<int64_t> lens;
    std::vector<float> queries;  // [nq, qt, dim]
    int nq, qt;
};

Corpus make_corpus(int n_docs, int dim, int nq, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01;
    std::uniform_int_distribution<int> len(1, 40);
    Corpus c{dim, {}, {}, {}, nq, 16};
    const int topics = 6;
    std::vector<float> centers(size_t(topics) * dim);
    for (auto& x : centers) x = n01(rng);
    auto emit = [&](std::vector<float>* out, int topic, float noise) {
        std::vector<float> v(dim);
        double s = 0;
        for (int j = 0; j < dim; ++j) {
            v[j] = centers[size_t(topic) * dim + j] + noise * n01(rng);
            s += double(v[j]) * v[j];
        }
        for (auto& x : v) out->push_back(static_cast<float>(x / std::sqrt(s)));
    };
    for (int d = 0; d < n_docs; ++d) {
        c.lens.push_back(d % 17 == 0 ? 1 : len(rng));  // some 1-token documents
        const int topic = d % topics;
        for (int t = 0; t < c.lens.back(); ++t) emit(&c.docs, topic, 1.5f);
    }
    for (int q = 0; q < nq; ++q)
        for (int t = 0; t < c.qt; ++t) emit(&c.queries, (q + t) % topics, 1.5f);
    return c;
}

// Brute force with the fp64 reference on the given (rounded) values.
std::vector<double> brute_force(const Corpus& c, const std::vector<float>& doc_values, int q) {
    std::vector<int64_t> off(1, 0);
    for (auto l : c.lens) off.push_back(off.back() + l);
    kernels::MaxSimParams p;
    p.queries = c.queries.data() + size_t(q) * c.qt * c.dim;
    p.q_dtype = DType::kF32;
    p.n_queries = 1;
    p.q_stride = c.qt;
    p.dim = c.dim;
    p.doc_tokens = doc_values.data();
    p.d_dtype = DType::kF32;
    p.doc_offsets = off.data();
    p.n_docs = static_cast<int64_t>(c.lens.size());
    std::vector<double> s(c.lens.size());
    EXPECT_TRUE(kernels::maxsim_ref(p, s.data()).ok());
    return s;
}

class ExhaustiveSearch : public ::testing::TestWithParam<std::tuple<int, DType>> {};

TEST_P(ExhaustiveSearch, EqualsBruteForceTopK) {
    const auto [dim, dtype] = GetParam();
    const Corpus c = make_corpus(300, dim, 8, 1000 + dim);
    // Input in the requested dtype; the index stores fp16 vectors.
    std::vector<uint16_t> h(c.docs.size());
    std::vector<float> rounded(c.docs.size());
    for (size_t i = 0; i < h.size(); ++i) {
        h[i] = kernels::float_to_half(c.docs[i]);
        rounded[i] = kernels::half_to_float(h[i]);
    }
    EmbeddingView v;
    v.dtype = dtype;
    v.data = dtype == DType::kF16 ? static_cast<const void*>(h.data()) : c.docs.data();
    v.rows = static_cast<int64_t>(c.docs.size() / dim);
    v.dim = dim;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.n_centroids = 32;
    bo.progress = false;
    bo.chunk_docs = 64;  // several chunks
    const std::string path = search_dir("exh" + std::to_string(dim)) + "/index";
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    Status st = b->Build(v, c.lens, {});
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::unique_ptr<Searcher> s;
    SearcherOptions so;
    so.device = Device::kCpu;
    so.progress = false;
    ASSERT_TRUE(Searcher::Open(so, path, &s).ok());
    EXPECT_EQ(s->info().n_docs, 300);
    QueryBatch qb;
    qb.data = c.queries.data();
    qb.dtype = DType::kF32;
    qb.n_queries = c.nq;
    qb.q_tokens = c.qt;
    qb.dim = dim;
    SearchOptions opts;
    opts.exhaustive = true;
    opts.k = 20;
    std::vector<std::vector<SearchHit>> res;
    st = s->Search(qb, opts, &res);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(res.size(), size_t(c.nq));
    for (int q = 0; q < c.nq; ++q) {
        SCOPED_TRACE("query " + std::to_string(q));
        const auto bf = brute_force(c, rounded, q);  // what the index stores
        std::vector<int> order(bf.size());
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int a, int b2) { return bf[a] > bf[b2]; });
        ASSERT_EQ(res[q].size(), 20u);
        std::set<int64_t> ids;
        for (int j = 0; j < 20; ++j) {
            const auto& hit = res[q][j];
            EXPECT_TRUE(ids.insert(hit.internal_id).second) << "duplicate id";
            EXPECT_EQ(hit.doc_id, std::to_string(hit.internal_id));
            // Tie-aware: the brute-force score of the returned id equals the j-th best score.
            EXPECT_NEAR(bf[hit.internal_id], bf[order[j]], 1e-4);
            EXPECT_NEAR(hit.score, bf[hit.internal_id], 1e-4);
            if (j + 1 < 20 && bf[order[j]] - bf[order[j + 1]] > 1e-4 &&
                (j == 0 || bf[order[j - 1]] - bf[order[j]] > 1e-4)) {
                EXPECT_EQ(hit.internal_id, order[j]);  // no near-tie: exactly the same document
            }
        }
        if (dtype == DType::kF32) {  // also close to the unrounded fp32 truth
            const auto exact = brute_force(c, c.docs, q);
            EXPECT_NEAR(res[q][0].score, exact[order[0]], 0.02);
        }
    }
}

INSTANTIATE_TEST_SUITE_P(SearchCpu, ExhaustiveSearch,
                         ::testing::Values(std::make_tuple(96, DType::kF16), std::make_tuple(96, DType::kF32),
                                           std::make_tuple(128, DType::kF16), std::make_tuple(128, DType::kF32)),
                         [](const auto& info) {
                             return "dim" + std::to_string(std::get<0>(info.param)) +
                                    (std::get<1>(info.param) == DType::kF16 ? "_f16" : "_f32");
                         });

// Default parameters on the synthetic corpus: recall@10 of approximate vs exhaustive >= 0.95.
class DefaultSearch : public ::testing::TestWithParam<std::string> {};

TEST_P(DefaultSearch, RecallAgainstExhaustive) {
    const std::string codec = GetParam();
    const std::string dir = search_dir("synth_" + codec);
    SynthOptions so;
    so.n_docs = 1000;
    so.n_queries = 60;
    ASSERT_TRUE(WriteSynthCorpus(so, dir).ok());
    IndexBuildOptions bo;
    bo.codec = codec;
    bo.keep_vectors = true;
    bo.progress = false;
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/index", &b).ok());
    Status st = b->BuildFromFiles(dir + "/docs.npy", dir + "/doclens.npy", dir + "/doc_ids.txt");
    ASSERT_TRUE(st.ok()) << st.ToString();
    std::unique_ptr<Searcher> s;
    SearcherOptions sopt;
    sopt.device = Device::kCpu;
    sopt.progress = false;
    ASSERT_TRUE(Searcher::Open(sopt, dir + "/index", &s).ok());
    HostArray qa;
    ASSERT_TRUE(LoadNpy(dir + "/queries.npy", &qa).ok());
    QueryBatch qb;
    qb.data = qa.bytes.data();
    qb.dtype = DType::kF16;
    qb.n_queries = static_cast<int>(qa.shape[0]);
    qb.q_tokens = static_cast<int>(qa.shape[1]);
    qb.dim = static_cast<int>(qa.shape[2]);
    SearchOptions exh;
    exh.exhaustive = true;
    SearchOptions def;  // defaults
    std::vector<std::vector<SearchHit>> re, ra;
    ASSERT_TRUE(s->Search(qb, exh, &re).ok());
    ASSERT_TRUE(s->Search(qb, def, &ra).ok());
    // Without rerank the compressed scores alone must still find most of them.
    SearchOptions norerank;
    norerank.rerank = 0;
    std::vector<std::vector<SearchHit>> rn;
    ASSERT_TRUE(s->Search(qb, norerank, &rn).ok());
    auto recall = [&](const std::vector<std::vector<SearchHit>>& r) {
        double sum = 0;
        for (size_t q = 0; q < re.size(); ++q) {
            std::set<std::string> truth;
            for (const auto& h : re[q]) truth.insert(h.doc_id);
            int hit = 0;
            for (const auto& h : r[q]) hit += truth.count(h.doc_id);
            sum += double(hit) / truth.size();
        }
        return sum / re.size();
    };
    // Synth tokens are unit vectors (IndexModel::unit_norm): the compressed scores are those of
    // the decoded tokens normalised (the reference decodes in fp64, with decoded_scales_ref's).
    {
        index::IndexData data;
        ASSERT_TRUE(index::ReadIndex(dir + "/index", false, false, &data).ok());
        EXPECT_TRUE(data.model.unit_norm);
        kernels::DecodedScaleParams sp;
        sp.centroids = data.model.centroids.data();
        sp.n_centroids = data.model.n_centroids;
        sp.dim = data.model.dim;
        sp.token_centroids = data.token_centroids.data();
        sp.codes = data.codes.data();
        sp.n_code_bytes = data.model.n_code_bytes;
        sp.codebook = data.model.codebook.data();
        sp.n_tokens = data.info.n_tokens;
        std::vector<double> s64(static_cast<size_t>(sp.n_tokens));
        ASSERT_TRUE(kernels::decoded_scales_ref(sp, s64.data()).ok());
        const std::vector<float> scales(s64.begin(), s64.end());
        std::vector<float> qf(size_t(qb.q_tokens) * qb.dim);
        for (int q = 0; q < 5; ++q) {
            const uint16_t* qh = reinterpret_cast<const uint16_t*>(qa.bytes.data()) + size_t(q) * qf.size();
            for (size_t i = 0; i < qf.size(); ++i) qf[i] = kernels::half_to_float(qh[i]);
            const int64_t co[2] = {0, 1};
            const int32_t cd[1] = {int32_t(rn[size_t(q)][0].internal_id)};
            kernels::CodeMaxSimParams p;
            p.queries = qf.data();
            p.n_queries = 1;
            p.q_stride = qb.q_tokens;
            p.dim = qb.dim;
            p.n_centroids = data.model.n_centroids;
            p.token_centroids = data.token_centroids.data();
            p.codes = data.codes.data();
            p.n_code_bytes = data.model.n_code_bytes;
            p.codebook = data.model.codebook.data();
            p.token_scales = scales.data();
            p.doc_offsets = data.doc_offsets.data();
            p.n_docs = data.info.n_docs;
            p.cand_offsets = co;
            p.cand_docs = cd;
            double want = 0;
            ASSERT_TRUE(kernels::code_maxsim_ref(p, data.model.centroids.data(), &want).ok());
            EXPECT_NEAR(rn[size_t(q)][0].score, want, 1e-4 * (1 + std::fabs(want))) << "query " << q;
        }
    }
    // Searched 7 queries at a time (query lengths too): the same hits and scores, in order.
    std::vector<int32_t> lens(size_t(qb.n_queries));
    for (size_t i = 0; i < lens.size(); ++i) lens[i] = int32_t(i % 5 == 0 ? qb.q_tokens - 3 : qb.q_tokens);
    QueryBatch ql = qb;
    ql.lengths = lens.data();
    for (const SearchOptions& base : {def, exh}) {
        SearchOptions chunked = base;
        chunked.max_batch_queries = 7;
        std::vector<std::vector<SearchHit>> whole, parts;
        ASSERT_TRUE(s->Search(ql, base, &whole).ok());
        ASSERT_TRUE(s->Search(ql, chunked, &parts).ok());
        ASSERT_EQ(parts.size(), whole.size());
        for (size_t q = 0; q < whole.size(); ++q) {
            ASSERT_EQ(parts[q].size(), whole[q].size()) << "query " << q;
            for (size_t j = 0; j < whole[q].size(); ++j) {
                EXPECT_EQ(parts[q][j].doc_id, whole[q][j].doc_id) << "query " << q << " rank " << j;
                EXPECT_EQ(parts[q][j].score, whole[q][j].score) << "query " << q << " rank " << j;
            }
        }
    }
    const double r_default = recall(ra), r_compressed = recall(rn);
    std::printf("[ codec %s ] recall@10 vs exhaustive: default %.4f, compressed only %.4f\n", codec.c_str(), r_default,
                r_compressed);
    EXPECT_GE(r_default, 0.95);
    EXPECT_GE(r_compressed, 0.80);
    // Pruned hard (64 of 1,000 documents, where the default keeps every one the probes reach):
    // both prunings keep most of the true top 10.
    for (const Pruning pr : {Pruning::kProbe, Pruning::kInteraction}) {
        SearchOptions pruned;
        pruned.ncandidates = 64;
        pruned.pruning = pr;
        std::vector<std::vector<SearchHit>> rp;
        ASSERT_TRUE(s->Search(qb, pruned, &rp).ok());
        const double r = recall(rp);
        std::printf("[ codec %s ] recall@10 vs exhaustive, 64 candidates, %s pruning: %.4f\n", codec.c_str(),
                    pr == Pruning::kProbe ? "probe" : "interaction", r);
        EXPECT_GE(r, 0.85) << (pr == Pruning::kProbe ? "probe" : "interaction");
    }
}

INSTANTIATE_TEST_SUITE_P(SearchCpu, DefaultSearch, ::testing::Values("pq", "residual"));

// A 3-shard synthetic index with vectors (d = 64, 32 centroids), searched on the CPU, and its
// queries (fp16).
struct ShardedSynth {
    fs::path dir;
    std::string index;
    SearcherOptions opts;
    HostArray qa;
    QueryBatch qb;
};

void make_sharded_synth(const std::string& name, int n_docs, int n_queries, ShardedSynth* out) {
    SynthOptions so;
    so.n_docs = n_docs;
    so.n_queries = n_queries;
    so.dim = 64;
    IndexBuildOptions bo;
    bo.shards = 3;
    bo.keep_vectors = true;
    bo.n_centroids = 32;
    bo.progress = false;
    out->dir = testing::BuildSynthIndex(name, so, bo);
    out->index = (out->dir / "index").string();
    out->opts.device = Device::kCpu;
    out->opts.progress = false;
    ASSERT_TRUE(LoadNpy((out->dir / "queries.npy").string(), &out->qa).ok());
    out->qb = QueryBatch{out->qa.bytes.data(),  DType::kF16,           int(out->qa.shape[0]),
                         int(out->qa.shape[1]), int(out->qa.shape[2]), nullptr};
}

// SearchCuts for participants that are threads of this process (as MPI ranks are processes):
// each Cut waits for every participant's keys, then all get the same cut.
class ThreadCuts {
public:
    ThreadCuts(int n, int64_t n_docs, int n_centroids) : n_(n), n_docs_(n_docs), n_centroids_(n_centroids) {}
    struct Member final : SearchCuts {
        ThreadCuts* group = nullptr;
        int64_t n_docs() const override { return group->n_docs_; }
        int n_centroids() const override { return group->n_centroids_; }
        Status Cut(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best,
                   std::vector<CutKey>* cut) override {
            return group->Cut(keep, mine, best, cut);
        }
    };
    Member member() {
        Member m;
        m.group = this;
        return m;
    }

private:
    Status Cut(int keep, const Status& mine, const std::vector<std::vector<CutKey>>& best, std::vector<CutKey>* cut) {
        std::unique_lock<std::mutex> lock(mu_);
        const int64_t round = round_;
        if (!mine.ok() && err_.ok()) err_ = mine;
        pool_.resize(best.size());
        for (size_t q = 0; q < best.size(); ++q) pool_[q].insert(pool_[q].end(), best[q].begin(), best[q].end());
        if (++arrived_ == n_) {
            at_.assign(pool_.size(), CutKey{-INFINITY, std::numeric_limits<int64_t>::max()});
            for (size_t q = 0; q < pool_.size(); ++q) {
                auto& p = pool_[q];
                std::sort(p.begin(), p.end(), CutKeyBetter);
                if (p.size() >= size_t(keep)) at_[q] = p[size_t(keep - 1)];
            }
            result_ = err_;
            err_ = Status::OK();
            pool_.clear();
            arrived_ = 0;
            ++round_;
            cv_.notify_all();
        } else {
            cv_.wait(lock, [&] { return round_ != round; });
        }
        *cut = at_;
        return result_;
    }

    const int n_;
    const int64_t n_docs_;
    const int n_centroids_;
    std::mutex mu_;
    std::condition_variable cv_;
    int arrived_ = 0;
    int64_t round_ = 0;
    Status err_, result_;
    std::vector<std::vector<CutKey>> pool_;
    std::vector<CutKey> at_;
};

// Hits equal: the same documents in the same order, with the same scores.
void expect_same_hits(const std::vector<std::vector<SearchHit>>& got, const std::vector<std::vector<SearchHit>>& want,
                      const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t q = 0; q < want.size(); ++q) {
        ASSERT_EQ(got[q].size(), want[q].size()) << what << " query " << q;
        for (size_t j = 0; j < want[q].size(); ++j) {
            EXPECT_EQ(got[q][j].doc_id, want[q][j].doc_id) << what << " query " << q << " rank " << j;
            EXPECT_EQ(got[q][j].internal_id, want[q][j].internal_id) << what << " query " << q << " rank " << j;
            EXPECT_EQ(got[q][j].score, want[q][j].score) << what << " query " << q << " rank " << j;
        }
    }
}

// Searchers over parts of a sharded index (SearcherOptions::shards, as the ranks of a
// distributed search open them), cutting their candidates together (SearchWithCuts), merged,
// equal one searcher over all of it, exhaustive or approximate, deletions included (they live
// in the last shard's store); a participant without shards takes part in the cuts; a part
// needs only its stores and the last.
TEST(SearchCpu, ShardSubsetsMergeToTheWhole) {
    ShardedSynth sy;
    ASSERT_NO_FATAL_FAILURE(make_sharded_synth("subsets", 400, 12, &sy));
    const fs::path& dir = sy.dir;
    const std::string& index = sy.index;
    const SearcherOptions& opts = sy.opts;
    const QueryBatch& qb = sy.qb;
    SearchOptions exh;
    exh.exhaustive = true;
    std::vector<std::vector<SearchHit>> top;
    {
        std::unique_ptr<Searcher> s;
        ASSERT_TRUE(Searcher::Open(opts, index, &s).ok());
        ASSERT_TRUE(s->Search(qb, exh, &top).ok());
    }
    std::set<std::string> gone;  // the best hits of the first queries: some in every shard
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(index, false, &u).ok());
        std::vector<std::string> ids;
        for (int q = 0; q < 4; ++q) ids.push_back(top[q][0].doc_id);
        std::sort(ids.begin(), ids.end());
        ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
        ASSERT_TRUE(u->Delete(ids).ok());
        ASSERT_TRUE(u->Commit().ok());
        gone.insert(ids.begin(), ids.end());
    }
    std::unique_ptr<Searcher> whole;
    ASSERT_TRUE(Searcher::Open(opts, index, &whole).ok());
    std::vector<std::unique_ptr<Searcher>> part_searchers;
    for (const std::vector<int>& part : {std::vector<int>{0}, std::vector<int>{2, 1}}) {
        SearcherOptions po = opts;
        po.shards = part;
        std::unique_ptr<Searcher> s;
        ASSERT_TRUE(Searcher::Open(po, index, &s).ok());
        ASSERT_EQ(s->placement().size(), part.size());
        EXPECT_EQ(s->placement()[0].shard, *std::min_element(part.begin(), part.end()));
        EXPECT_EQ(s->placement()[0].first_doc, whole->placement()[size_t(s->placement()[0].shard)].first_doc);
        part_searchers.push_back(std::move(s));
    }
    part_searchers.push_back(nullptr);  // a participant that holds no shard
    std::vector<std::vector<SearchHit>> exact;
    ASSERT_TRUE(whole->Search(qb, exh, &exact).ok());
    int differ = 0;  // settings whose approximate run differs from the exhaustive one
    std::vector<SearchOptions> settings = testing::CutSettings(20, 12);
    settings.push_back(exh);
    for (const SearchOptions& so2 : settings) {
        const std::string what = "ncandidates " + std::to_string(so2.ncandidates) + " rerank " +
                                 std::to_string(so2.rerank) + " pruning " + PruningName(so2.pruning) +
                                 (so2.exhaustive ? " exhaustive" : "");
        std::vector<std::vector<SearchHit>> want;
        ASSERT_TRUE(whole->Search(qb, so2, &want).ok());
        ThreadCuts group(int(part_searchers.size()), whole->info().n_docs, whole->info().n_centroids);
        std::vector<std::vector<std::vector<SearchHit>>> parts(part_searchers.size());
        std::vector<Status> sts(part_searchers.size());
        std::vector<std::thread> threads;
        for (size_t p = 0; p < part_searchers.size(); ++p) {
            threads.emplace_back([&, p] {
                ThreadCuts::Member m = group.member();
                sts[p] = SearchWithCuts(part_searchers[p].get(), qb, so2, &m, &parts[p]);
            });
        }
        for (auto& t : threads) t.join();
        for (const Status& st : sts) ASSERT_TRUE(st.ok()) << what << ": " << st.ToString();
        std::vector<std::vector<SearchHit>> got;
        MergeHits(&parts, qb.n_queries, so2.k, &got);
        expect_same_hits(got, want, what);
        for (const auto& hits : got)
            for (const SearchHit& h : hits) EXPECT_EQ(gone.count(h.doc_id), 0u) << "a deleted document came back";
        bool same = true;
        for (size_t q = 0; q < want.size(); ++q)
            for (size_t j = 0; j < want[q].size(); ++j)
                same = same && want[q][j].internal_id == exact[q][j].internal_id;
        differ += !same;
    }
    EXPECT_GT(differ, 0) << "no setting cut deep enough to differ from exhaustive search: the test checks nothing";
    // A participant's error reaches every participant, through the first cut.
    {
        ThreadCuts group(2, whole->info().n_docs, whole->info().n_centroids);
        SearchOptions bad;
        bad.nprobe = 0;
        std::vector<std::vector<SearchHit>> r0, r1;
        Status s0, s1;
        std::thread t([&] {
            ThreadCuts::Member m = group.member();
            s0 = SearchWithCuts(part_searchers[0].get(), qb, bad, &m, &r0);
        });
        ThreadCuts::Member m = group.member();
        s1 = SearchWithCuts(nullptr, qb, bad, &m, &r1);
        t.join();
        EXPECT_EQ(s0.code(), Status::Code::kInvalidArgument) << s0.ToString();
        EXPECT_EQ(s1.code(), Status::Code::kInvalidArgument) << s1.ToString();
    }
    // Without shard 1's store: shard 0 still opens (with the last), shard 1 is named missing.
    fs::rename(dir / "index" / "shard-0001", dir / "shard-0001.aside");
    SearcherOptions p0 = opts, p1 = opts;
    p0.shards = {0};
    p1.shards = {1};
    std::unique_ptr<Searcher> s;
    EXPECT_TRUE(Searcher::Open(p0, index, &s).ok());
    const Status st = Searcher::Open(p1, index, &s);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("shard 1 ("), std::string::npos) << st.ToString();
    p1.shards = {3};
    EXPECT_EQ(Searcher::Open(p1, index, &s).code(), Status::Code::kInvalidArgument);
    fs::rename(dir / "shard-0001.aside", dir / "index" / "shard-0001");
}

// Each shard its own segment (SearcherOptions::join_shards = false), their candidates cut
// together on the host between stages, gives what one segment of all the shards gives, in
// every setting and in chunks of queries.
TEST(SearchCpu, SeparateShardSegmentsEqualOne) {
    ShardedSynth sy;
    ASSERT_NO_FATAL_FAILURE(make_sharded_synth("segments", 400, 12, &sy));
    SearcherOptions apart = sy.opts;
    apart.join_shards = false;
    std::unique_ptr<Searcher> one, three;
    ASSERT_TRUE(Searcher::Open(sy.opts, sy.index, &one).ok());
    ASSERT_TRUE(Searcher::Open(apart, sy.index, &three).ok());
    for (SearchOptions so : testing::CutSettings(20, 12)) {
        for (const int chunk : {0, 5}) {
            so.max_batch_queries = chunk;
            const std::string what = "ncandidates " + std::to_string(so.ncandidates) + " rerank " +
                                     std::to_string(so.rerank) + " pruning " + PruningName(so.pruning) + " chunk " +
                                     std::to_string(chunk);
            std::vector<std::vector<SearchHit>> want, got;
            ASSERT_TRUE(one->Search(sy.qb, so, &want).ok());
            ASSERT_TRUE(three->Search(sy.qb, so, &got).ok());
            expect_same_hits(got, want, what);
        }
    }
}

// Rerank-only scoring: the exact scores of the given candidates (as exhaustive search scores
// them), best first, over a sharded index; duplicates once, deleted documents dropped.
TEST(SearchCpu, RerankScoresTheCandidatesExactly) {
    ShardedSynth sy;
    ASSERT_NO_FATAL_FAILURE(make_sharded_synth("rerank", 300, 9, &sy));
    const std::string& index = sy.index;
    const SearcherOptions& opts = sy.opts;
    const QueryBatch& qb = sy.qb;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(opts, index, &s).ok());
    SearchOptions all;
    all.exhaustive = true;
    all.k = 300;
    std::vector<std::vector<SearchHit>> every;
    ASSERT_TRUE(s->Search(qb, all, &every).ok());
    std::mt19937 rng(5);
    std::vector<std::vector<int64_t>> cand(size_t(qb.n_queries));
    for (auto& c : cand) {
        for (int j = 0; j < 40; ++j) c.push_back(int64_t(rng() % 300));
        c.push_back(c[0]);  // a duplicate
    }
    cand[3].clear();  // a query without candidates
    for (const int k : {0, 5}) {
        std::vector<std::vector<SearchHit>> got;
        ASSERT_TRUE(s->Rerank(qb, cand, k, &got).ok());
        ASSERT_EQ(got.size(), size_t(qb.n_queries));
        for (int q = 0; q < qb.n_queries; ++q) {
            const std::set<int64_t> want_ids(cand[size_t(q)].begin(), cand[size_t(q)].end());
            std::vector<SearchHit> want;  // exhaustive order, restricted to the candidates
            for (const SearchHit& h : every[size_t(q)])
                if (want_ids.count(h.internal_id)) want.push_back(h);
            if (k > 0 && want.size() > size_t(k)) want.resize(size_t(k));
            ASSERT_EQ(got[size_t(q)].size(), want.size()) << "query " << q << " k " << k;
            for (size_t j = 0; j < want.size(); ++j) {
                EXPECT_EQ(got[size_t(q)][j].internal_id, want[j].internal_id) << "query " << q << " rank " << j;
                EXPECT_EQ(got[size_t(q)][j].doc_id, want[j].doc_id);
                EXPECT_NEAR(got[size_t(q)][j].score, want[j].score, 1e-4f * (1 + std::fabs(want[j].score)));
            }
        }
    }
    // External ids: known ones map to their internal ids, unknown ones to -1.
    std::vector<int64_t> ids;
    s->FindDocs({every[0][0].doc_id, "no-such-document", every[1][2].doc_id}, &ids);
    EXPECT_EQ(ids, (std::vector<int64_t>{every[0][0].internal_id, -1, every[1][2].internal_id}));
    // Bad requests.
    std::vector<std::vector<SearchHit>> got;
    cand[1].push_back(300);
    Status st = s->Rerank(qb, cand, 0, &got);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("query 1: candidate id 300 outside"), std::string::npos) << st.ToString();
    cand.pop_back();
    EXPECT_EQ(s->Rerank(qb, cand, 0, &got).code(), Status::Code::kInvalidArgument);  // lists != queries
    // A deleted candidate is dropped.
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(index, false, &u).ok());
        ASSERT_TRUE(u->Delete({every[0][0].doc_id}).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    ASSERT_TRUE(Searcher::Open(opts, index, &s).ok());
    std::vector<std::vector<int64_t>> one(size_t(qb.n_queries));
    one[0] = {every[0][0].internal_id, every[0][1].internal_id};
    ASSERT_TRUE(s->Rerank(qb, one, 0, &got).ok());
    ASSERT_EQ(got[0].size(), 1u);
    EXPECT_EQ(got[0][0].internal_id, every[0][1].internal_id);
    s->FindDocs({every[0][0].doc_id}, &ids);
    EXPECT_EQ(ids[0], -1) << "a deleted document has no internal id";
}

// SearcherOptions::record_queries: a reservoir of the queries searched. While it has room it
// holds every query searched (their used tokens, as fp16, zero rows padding the shorter ones);
// past it, record_queries of them, each one of the queries searched; a query of no tokens is
// not kept; off, nothing is kept.
TEST(SearchCpu, RecordsASampleOfTheQueriesSearched) {
    const Corpus c = make_corpus(60, 64, 8, 9);
    EmbeddingView v{c.docs.data(), DType::kF32, static_cast<int64_t>(c.docs.size() / 64), 64};
    IndexBuildOptions bo;
    bo.n_centroids = 8;
    bo.progress = false;
    const std::string path = search_dir("served") + "/index";
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    ASSERT_TRUE(b->Build(v, c.lens, {}).ok());
    // The queries as fp16 (what the sample keeps), with lengths: query 1 uses 5 tokens, query 2 none.
    std::vector<uint16_t> q16(c.queries.size());
    for (size_t i = 0; i < q16.size(); ++i) q16[i] = kernels::float_to_half(c.queries[i]);
    std::vector<int32_t> lens(size_t(c.nq), c.qt);
    lens[1] = 5;
    lens[2] = 0;
    const QueryBatch qb{q16.data(), DType::kF16, c.nq, c.qt, 64, lens.data()};
    const size_t row = size_t(c.qt) * 64;
    const auto expect_query = [&](const ServedQueries& sq, int i, int want) {  // sample row i is query `want`
        const uint16_t* got = sq.tokens.data() + size_t(i) * size_t(sq.q_tokens) * 64;
        for (size_t e = 0; e < size_t(sq.q_tokens) * 64; ++e) {
            const uint16_t w = e < size_t(lens[size_t(want)]) * 64 ? q16[size_t(want) * row + e] : uint16_t(0);
            ASSERT_EQ(got[e], w) << "sample row " << i << " query " << want << " element " << e;
        }
    };
    SearchOptions o;
    o.k = 3;
    std::vector<std::vector<SearchHit>> res;
    for (const int cap : {0, 100, 3}) {
        SCOPED_TRACE("record_queries " + std::to_string(cap));
        SearcherOptions so;
        so.device = Device::kCpu;
        so.record_queries = cap;
        std::unique_ptr<Searcher> s;
        ASSERT_TRUE(Searcher::Open(so, path, &s).ok());
        for (int round = 0; round < 5; ++round) ASSERT_TRUE(s->Search(qb, o, &res).ok());
        const ServedQueries sq = s->Served();
        EXPECT_EQ(sq.dim, 64);
        if (cap == 0) {
            EXPECT_EQ(sq.n_queries, 0);
            EXPECT_EQ(sq.seen, 0);
            continue;
        }
        EXPECT_EQ(sq.seen, 5 * (c.nq - 1));  // query 2 has no tokens
        ASSERT_EQ(sq.q_tokens, c.qt);
        if (cap == 100) {  // room for all: the queries in the order searched
            ASSERT_EQ(sq.n_queries, 5 * (c.nq - 1));
            for (int i = 0; i < sq.n_queries; ++i) {
                const int j = i % (c.nq - 1);
                expect_query(sq, i, j < 2 ? j : j + 1);
            }
        } else {
            ASSERT_EQ(sq.n_queries, cap);
            for (int i = 0; i < cap; ++i) {  // each row one of the queries searched
                int match = -1;
                for (int j = 0; j < c.nq && match < 0; ++j) {
                    if (j == 2) continue;
                    bool same = true;
                    const uint16_t* got = sq.tokens.data() + size_t(i) * row;
                    for (size_t e = 0; same && e < size_t(lens[size_t(j)]) * 64; ++e)
                        same = got[e] == q16[size_t(j) * row + e];
                    if (same) match = j;
                }
                ASSERT_GE(match, 0) << "sample row " << i;
                expect_query(sq, i, match);
            }
        }
    }
    // One sample shared by searchers opened one after another (record_into): it holds every
    // searcher's queries, in order, and not while recording is off.
    auto shared = std::make_shared<QuerySample>(100);
    for (int searcher = 0; searcher < 2; ++searcher) {
        SearcherOptions so;
        so.device = Device::kCpu;
        so.record_queries = 1;  // (not used: record_into wins)
        so.record_into = shared;
        std::unique_ptr<Searcher> s;
        ASSERT_TRUE(Searcher::Open(so, path, &s).ok());
        ASSERT_TRUE(s->Search(qb, o, &res).ok());
        shared->set_recording(false);
        ASSERT_TRUE(s->Search(qb, o, &res).ok());
        shared->set_recording(true);
        EXPECT_EQ(s->Served().seen, (searcher + 1) * (c.nq - 1));
    }
    const ServedQueries sq = shared->Get();
    ASSERT_EQ(sq.n_queries, 2 * (c.nq - 1));
    EXPECT_EQ(shared->seen(), sq.seen);
    for (int i = 0; i < sq.n_queries; ++i) {
        const int j = i % (c.nq - 1);
        expect_query(sq, i, j < 2 ? j : j + 1);
    }
}

TEST(SearchCpu, DegenerateCorporaAnswerEveryQuery) { testing::ExpectDegenerateCorporaAnswered(Device::kCpu); }

TEST(SearchCpu, RejectsBadRequests) {
    const Corpus c = make_corpus(50, 64, 2, 5);
    EmbeddingView v{c.docs.data(), DType::kF32, static_cast<int64_t>(c.docs.size() / 64), 64};
    IndexBuildOptions bo;
    bo.n_centroids = 8;
    bo.codec = "residual";
    bo.progress = false;
    const std::string path = search_dir("bad") + "/index";
    std::unique_ptr<IndexBuilder> b;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &b).ok());
    ASSERT_TRUE(b->Build(v, c.lens, {}).ok());
    std::unique_ptr<Searcher> s;
    SearcherOptions so;
    so.device = Device::kCpu;
    ASSERT_TRUE(Searcher::Open(so, path, &s).ok());
    QueryBatch qb{c.queries.data(), DType::kF32, c.nq, c.qt, 64, nullptr};
    std::vector<std::vector<SearchHit>> res;
    SearchOptions o;
    o.k = 0;
    EXPECT_EQ(s->Search(qb, o, &res).code(), Status::Code::kInvalidArgument);
    o.k = 5;
    o.exhaustive = true;  // no stored vectors
    Status st = s->Search(qb, o, &res);
    EXPECT_EQ(st.code(), Status::Code::kNotSupported);
    EXPECT_NE(st.message().find("--keep-vectors"), std::string::npos) << st.message();
    o.exhaustive = false;
    o.max_batch_queries = -1;
    EXPECT_EQ(s->Search(qb, o, &res).code(), Status::Code::kInvalidArgument);
    o.max_batch_queries = 0;
    QueryBatch wrong = qb;
    wrong.dim = 32;
    EXPECT_EQ(s->Search(wrong, o, &res).code(), Status::Code::kInvalidArgument);
    ASSERT_TRUE(s->Search(qb, o, &res).ok());
    EXPECT_EQ(res[0].size(), 5u);
    // More results than documents: every document once.
    o.k = 100;
    o.nprobe = 8;
    ASSERT_TRUE(s->Search(qb, o, &res).ok());
    EXPECT_LE(res[0].size(), 50u);
    // Query lengths: a 0-token query matches nothing (empty hits, not an error), approximate or
    // exhaustive.
    const int32_t lens[] = {0, 3};
    qb.lengths = lens;
    o.k = 3;
    for (const bool exh : {false, true}) {
        SearchOptions e = o;
        e.exhaustive = exh;
        if (exh && !s->info().has_vectors) continue;
        ASSERT_TRUE(s->Search(qb, e, &res).ok());
        EXPECT_TRUE(res[0].empty());
        EXPECT_EQ(res[1].size(), 3u);
        for (const SearchHit& h : res[1]) EXPECT_TRUE(std::isfinite(h.score));
    }
    // Non-finite values in a used token are refused, naming the query; past a query's length
    // they are padding, never read.
    std::vector<float> nan_q(c.queries.begin(), c.queries.end());
    QueryBatch nq = qb;
    nq.data = nan_q.data();
    nan_q[size_t((1 * c.qt + 2) * 64 + 5)] = NAN;  // query 1, token 2 (< its length 3)
    const Status refused = s->Search(nq, o, &res);
    EXPECT_EQ(refused.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(refused.message(), "query 1: non-finite value (NaN) at token 2, dimension 5");
    nan_q[size_t((1 * c.qt + 2) * 64 + 5)] = 0.f;
    nan_q[size_t((1 * c.qt + 4) * 64 + 5)] = INFINITY;  // query 1, token 4: padding
    EXPECT_TRUE(s->Search(nq, o, &res).ok());
    nq.lengths = nullptr;
    EXPECT_EQ(s->Search(nq, o, &res).message(), "query 1: non-finite value (Inf) at token 4, dimension 5");
    std::vector<uint16_t> half(nan_q.size());
    for (size_t i = 0; i < half.size(); ++i) half[i] = kernels::float_to_half(nan_q[i]);
    nq.data = half.data();
    nq.dtype = DType::kF16;
    EXPECT_EQ(s->Search(nq, o, &res).message(), "query 1: non-finite value (Inf) at token 4, dimension 5");
    // Finite values beyond fp16's range are refused too (fp32 and bf16 hold them; scores would
    // be Inf), fp16's largest finite magnitude is not.
    nan_q[size_t((1 * c.qt + 4) * 64 + 5)] = 0.f;
    nan_q[size_t((0 * c.qt + 1) * 64 + 2)] = -3e38f;
    nq.data = nan_q.data();
    nq.dtype = DType::kF32;
    const std::string beyond = "beyond fp16's range (|x| <= 65504; the index stores and scores fp16)";
    EXPECT_EQ(s->Search(nq, o, &res).message(), "query 0: value -3e+38 " + beyond + " at token 1, dimension 2");
    std::vector<uint16_t> bf(nan_q.size());
    for (size_t i = 0; i < bf.size(); ++i) bf[i] = kernels::float_to_bf16(nan_q[i]);
    bf[size_t((0 * c.qt + 1) * 64 + 2)] = 0x4780;  // 65536, the next bf16 after 65280
    nq.data = bf.data();
    nq.dtype = DType::kBF16;
    EXPECT_EQ(s->Search(nq, o, &res).message(), "query 0: value 65536 " + beyond + " at token 1, dimension 2");
    bf[size_t((0 * c.qt + 1) * 64 + 2)] = 0xc77f;  // -65280
    ASSERT_TRUE(s->Search(nq, o, &res).ok());
    for (const auto& r : res)
        for (const SearchHit& h : r) EXPECT_TRUE(std::isfinite(h.score));
    SearcherOptions gpu;
    gpu.device = Device::kGpu;
    std::unique_ptr<Searcher> g;
#if !TMS_WITH_CUDA
    EXPECT_EQ(Searcher::Open(gpu, path, &g).code(), Status::Code::kNotSupported);
#endif
}

}  // namespace
}  // namespace tms
