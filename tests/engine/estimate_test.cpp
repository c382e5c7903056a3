// Copyright TileMaxSim authors. The recall estimate: measured and stored beside the index, read
// back, kept by compaction, and used by searches for their target recall.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "kernels/maxsim.h"
#include "engine/estimate.h"
#include "engine/plan.h"
#include "tests/engine/synth_index.h"
#include "index/ingest/npy.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

void write_estimate(const fs::path& index, const std::string& points) {
    std::ofstream(index / "estimate.json") << "{\"queries\": 64, \"k\": 10, \"points\": [" << points << "]}\n";
}

TEST(EstimateCpu, MeasuredStoredKeptAndUsed) {
    SynthOptions so;
    so.n_docs = 1500;
    so.n_queries = 16;
    so.dim = 32;
    IndexBuildOptions bo;
    bo.progress = false;
    bo.keep_vectors = true;
    const fs::path dir = testing::BuildSynthIndex("tms_estimate", so, bo);
    const fs::path index = dir / "index";
    EstimateOptions eo;
    eo.device = Device::kCpu;
    RecallEstimate e;
    Status st = EstimateRecall(index.string(), eo, &e);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(e.queries, 64);
    ASSERT_FALSE(e.points.empty());
    const SearchOptions d;
    ASSERT_NE(e.Default(), nullptr);  // the default setting is measured, cheaper ones before it
    EXPECT_GT(e.Default() - e.points.data(), 0);
    for (const RecallPoint& p : e.points) {
        EXPECT_TRUE(p.recall >= 0 && p.recall <= 1);
        // Queries' recalls in [0, 1] of mean m vary at most m (1 - m): the standard error of
        // their mean is at most sqrt(m (1 - m) / (n - 1)), and 0 where every query agrees.
        EXPECT_GE(p.se, 0);
        EXPECT_LE(p.se, std::sqrt(p.recall * (1 - p.recall) / (e.queries - 1)) + 1e-12);
        EXPECT_NEAR(p.Lower(), p.recall - 1.645 * p.se, 1e-12);
    }
    RecallEstimate back;
    ASSERT_TRUE(ReadRecallEstimate(index.string(), &back).ok());
    ASSERT_EQ(back.points.size(), e.points.size());
    for (size_t i = 0; i < e.points.size(); ++i) {
        EXPECT_DOUBLE_EQ(back.points[i].recall, e.points[i].recall);
        EXPECT_DOUBLE_EQ(back.points[i].se, e.points[i].se);
    }

    // The choice: the cheapest point that reaches the target, else the deepest; only fields at
    // their defaults change; 0 or exhaustive: nothing.
    write_estimate(index,
                   "{\"nprobe\": 1, \"ncandidates\": 5, \"rerank\": 0, \"recall\": 0.5},"
                   "{\"nprobe\": 2, \"ncandidates\": 7, \"rerank\": 0, \"recall\": 0.995},"
                   "{\"nprobe\": 3, \"ncandidates\": 9, \"rerank\": 12, \"recall\": 0.999}");
    ASSERT_TRUE(ReadRecallEstimate(index.string(), &back).ok());
    SearchOptions t = ApplyTargetRecall(back, d);
    EXPECT_EQ(t.nprobe, 2);
    EXPECT_EQ(t.ncandidates, 7);
    EXPECT_EQ(t.rerank, 0);
    SearchOptions given;
    given.nprobe = 5;
    given.target_recall = 0.9999;
    t = ApplyTargetRecall(back, given);
    EXPECT_EQ(t.nprobe, 5);
    EXPECT_EQ(t.ncandidates, 9);
    EXPECT_EQ(t.rerank, 12);
    given.target_recall = 0;
    EXPECT_EQ(ApplyTargetRecall(back, given).ncandidates, d.ncandidates);
    given.target_recall = 0.99;
    given.exhaustive = true;
    EXPECT_EQ(ApplyTargetRecall(back, given).ncandidates, d.ncandidates);

    // A search at the defaults runs the chosen point: the run of its settings given explicitly,
    // not the run of the defaults.
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};
    SearcherOptions sopt;
    sopt.device = Device::kCpu;
    sopt.progress = false;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(sopt, index.string(), &s).ok());
    std::vector<std::vector<SearchHit>> tuned, explicit_point, plain;
    ASSERT_TRUE(s->Search(qb, SearchOptions(), &tuned).ok());
    SearchOptions p2;
    p2.nprobe = 2;
    p2.ncandidates = 7;
    p2.rerank = 0;
    p2.target_recall = 0;
    ASSERT_TRUE(s->Search(qb, p2, &explicit_point).ok());
    SearchOptions off;
    off.target_recall = 0;
    ASSERT_TRUE(s->Search(qb, off, &plain).ok());
    bool differs = false;
    for (size_t q = 0; q < tuned.size(); ++q) {
        ASSERT_EQ(tuned[q].size(), explicit_point[q].size());
        for (size_t j = 0; j < tuned[q].size(); ++j)
            EXPECT_EQ(tuned[q][j].internal_id, explicit_point[q][j].internal_id);
        differs = differs || tuned[q].size() != plain[q].size() ||
                  (!plain[q].empty() && tuned[q][0].internal_id != plain[q][0].internal_id);
    }
    EXPECT_TRUE(differs) << "7 candidates without rerank should lose some of the defaults' hits";
    // Without vectors loaded the estimate does not apply.
    sopt.vectors = VectorTier::kNone;
    ASSERT_TRUE(Searcher::Open(sopt, index.string(), &s).ok());
    std::vector<std::vector<SearchHit>> novec, novec_plain;
    ASSERT_TRUE(s->Search(qb, SearchOptions(), &novec).ok());
    ASSERT_TRUE(s->Search(qb, off, &novec_plain).ok());
    for (size_t q = 0; q < novec.size(); ++q) ASSERT_EQ(novec[q].size(), novec_plain[q].size());

    // Compaction keeps it; a damaged one fails the open naming the file.
    {
        std::unique_ptr<IndexUpdater> u;
        ASSERT_TRUE(IndexUpdater::Open(index.string(), false, &u).ok());
        ASSERT_TRUE(u->Delete({"3"}).ok());
        ASSERT_TRUE(u->Commit().ok());
    }
    s.reset();
    ASSERT_TRUE(CompactIndex(index.string(), false).ok());
    ASSERT_TRUE(ReadRecallEstimate(index.string(), &back).ok());
    EXPECT_EQ(back.points.size(), 3u);

    // Sample queries of one's own are measured as they are: the recall of the default point is
    // theirs, as a search of them against the exhaustive search measures it.
    eo.sample = &qb;
    ASSERT_TRUE(EstimateRecall(index.string(), eo, &e).ok());
    EXPECT_TRUE(e.sampled);
    EXPECT_EQ(e.queries, qb.n_queries);
    sopt.vectors = VectorTier::kAuto;
    ASSERT_TRUE(Searcher::Open(sopt, index.string(), &s).ok());
    std::vector<std::vector<SearchHit>> truth, approx;
    SearchOptions ex;
    ex.exhaustive = true;
    ASSERT_TRUE(s->Search(qb, ex, &truth).ok());
    ASSERT_TRUE(s->Search(qb, off, &approx).ok());
    double sum = 0;
    for (size_t q = 0; q < truth.size(); ++q) {
        int hit = 0;
        for (const SearchHit& h : approx[q])
            for (const SearchHit& t : truth[q]) hit += int(h.internal_id == t.internal_id);
        sum += double(hit) / double(truth[q].size());
    }
    ASSERT_NE(e.Default(), nullptr);
    EXPECT_DOUBLE_EQ(e.Default()->recall, sum / double(truth.size()));
    ASSERT_TRUE(ReadRecallEstimate(index.string(), &back).ok());
    EXPECT_TRUE(back.sampled);
    s.reset();
    QueryBatch wrong = qb;
    wrong.dim = qb.dim / 2;
    eo.sample = &wrong;
    st = EstimateRecall(index.string(), eo, &e);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
    eo.sample = nullptr;

    std::ofstream(index / "estimate.json") << "{\"queries\": 64, \"points\": [";
    st = Searcher::Open(sopt, index.string(), &s);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find("estimate.json"), std::string::npos) << st.ToString();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << st.ToString();

    // An index without vectors has no truth to measure against, unless it is given the documents
    // it was built from.
    bo.keep_vectors = false;
    const fs::path dir2 = testing::BuildSynthIndex("tms_estimate_novec", so, bo);
    st = EstimateRecall((dir2 / "index").string(), eo, &e);
    EXPECT_EQ(st.code(), Status::Code::kNotSupported) << st.ToString();
    EXPECT_NE(st.message().find("--keep-vectors"), std::string::npos);
    std::vector<int64_t> short_lens(3, 1);
    const EmbeddingView none{nullptr, DType::kF16, 3, 64};
    eo.documents = &none;
    eo.doc_lengths = &short_lens;
    st = EstimateRecall((dir2 / "index").string(), eo, &e);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("not the ones"), std::string::npos) << st.ToString();
}

// One knob: a target below the default one may choose settings cheaper than the defaults, the
// default target and above never do; a small index is searched exhaustively (PlanSearch).
TEST(EstimateCpu, PlanSpansTheCurveAndSmallIndexesSearchExhaustively) {
    const SearchOptions d;
    RecallEstimate e;
    e.points = {
        {2, 128, 32, 0.95}, {4, 256, 64, 0.995}, {d.nprobe, d.ncandidates, d.rerank, 0.996}, {16, 4096, 1024, 0.999}};
    ASSERT_EQ(e.Default(), &e.points[2]);
    EXPECT_EQ(e.For(0.9), &e.points[0]);
    EXPECT_EQ(e.For(0.98), &e.points[1]);             // below the default target: the curve below the defaults
    EXPECT_EQ(e.For(d.target_recall), &e.points[2]);  // the default target: the defaults at least
    EXPECT_EQ(e.For(0.9985), &e.points[3]);
    EXPECT_EQ(e.For(0.99999), &e.points[3]);  // none reaches it: the best (none within kSaturated of it)
    SearchOptions o;
    o.target_recall = 0.9;
    SearchOptions p = PlanSearch(&e, 1000000, true, Device::kCpu, o);
    EXPECT_EQ(p.nprobe, 2);
    EXPECT_EQ(p.rerank, 32);
    EXPECT_FALSE(p.exhaustive);
    EXPECT_EQ(PlanSearch(&e, 1000000, false, Device::kCpu, o).nprobe,
              d.nprobe);  // no vectors: the estimate does not apply
    // At most as many live documents as the plan reranks: exhaustive (with the vectors loaded).
    // On a CPU up to the documents the plan reranks, on a GPU up to twice its candidates.
    EXPECT_TRUE(PlanSearch(&e, 32, true, Device::kCpu, o).exhaustive);
    EXPECT_FALSE(PlanSearch(&e, 33, true, Device::kCpu, o).exhaustive);
    EXPECT_TRUE(PlanSearch(&e, 256, true, Device::kGpu, o).exhaustive);
    EXPECT_FALSE(PlanSearch(&e, 257, true, Device::kGpu, o).exhaustive);
    EXPECT_TRUE(PlanSearch(nullptr, d.rerank, true, Device::kCpu, d).exhaustive);
    EXPECT_TRUE(PlanSearch(nullptr, 2 * d.ncandidates, true, Device::kGpu, d).exhaustive);
    EXPECT_FALSE(PlanSearch(nullptr, 2 * d.ncandidates + 1, true, Device::kGpu, d).exhaustive);
    EXPECT_FALSE(PlanSearch(nullptr, d.rerank, false, Device::kCpu, d).exhaustive);
    // A curve that flattens below the target (a codec that bounds it): the cheapest point within
    // kSaturated of its best, from the defaults on.
    RecallEstimate flat = e;
    flat.points = {{2, 128, 32, 0.80},
                   {d.nprobe, d.ncandidates, d.rerank, 0.9},
                   {16, 4096, 1024, 0.9 + RecallEstimate::kSaturated},
                   {32, 16384, 4096, 0.903}};
    EXPECT_EQ(flat.For(d.target_recall), &flat.points[2]);
    EXPECT_EQ(flat.For(0.85), &flat.points[1]);  // below the default target: the cheapest that reaches it
    flat.points[2].recall = 0.9015;
    flat.points[3].recall = 0.901;
    EXPECT_EQ(flat.For(d.target_recall), &flat.points[1]);
    // A point reaches the target only beyond its sampling error: 0.994 measured with a standard
    // error of 0.003 (64 queries, four missing a document each) is not evidence of 0.99.
    RecallEstimate noisy = e;
    noisy.points = {{d.nprobe, d.ncandidates, d.rerank, 0.994, 0.003}, {12, 2048, 512, 1.0, 0.0}};
    EXPECT_EQ(noisy.For(d.target_recall), &noisy.points[1]);
    noisy.points[0].se = 0.002;  // 0.994 - 1.645 x 0.002 = 0.9907
    EXPECT_EQ(noisy.For(d.target_recall), &noisy.points[0]);
    // --codec auto's ladder: 16 sub-quantizers at dim 128 first, then 32 and 64, as long as the
    // estimate falls short; a count that does not divide the dimension ends it.
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 128, 16, 16), 0);  // reaches: keep it
    noisy.points[1].recall = 0.95;
    noisy.points[0].se = 0.003;
    ASSERT_FALSE(noisy.Reaches(d.target_recall));
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 128, 16, 16), 32);
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 128, 16, 32), 64);
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 128, 16, 64), 0);  // past four times the first
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 96, 12, 24), 48);
    EXPECT_EQ(NextAutoCodecPqM(noisy, d.target_recall, 84, 12, 12), 0);  // 24 does not divide 84
    EXPECT_EQ(NextAutoCodecPqM(noisy, 0.9, 128, 16, 16), 0);             // a lower target it reaches
    // An estimate measured without vectors (compressed) plans searches without them, and only those.
    flat.compressed = true;
    o.target_recall = d.target_recall;
    EXPECT_EQ(PlanSearch(&flat, 1000000, false, Device::kCpu, o).nprobe, d.nprobe);
    flat.points[3].recall = 0.95;
    EXPECT_EQ(PlanSearch(&flat, 1000000, false, Device::kCpu, o).nprobe, 32);
    EXPECT_EQ(PlanSearch(&flat, 1000000, true, Device::kCpu, o).nprobe, d.nprobe);
    EXPECT_EQ(PlanSearch(&e, 1000000, false, Device::kCpu, o).nprobe, d.nprobe);
    // Certifying (with vectors): the search starts no deeper than the defaults and goes, for the
    // queries not certified, as deep as the estimate's setting in certify steps.
    o.certify = true;
    o.target_recall = 0.9985;  // points[3]: 16 / 4,096 / 1,024
    p = PlanSearch(&e, 1000000, true, Device::kCpu, o);
    EXPECT_EQ(p.nprobe, d.nprobe);
    EXPECT_EQ(p.ncandidates, d.ncandidates);
    EXPECT_EQ(p.rerank, d.rerank);
    EXPECT_EQ(p.certify_steps, 2);  // 12 / 2,048 / 512, then 18 / 4,096 / 1,024
    SearchOptions deep = p;
    for (int s = 0; s < p.certify_steps; ++s) deep = engine::CertifyDeeper(deep, true);
    EXPECT_GE(deep.nprobe, 16);
    EXPECT_GE(deep.ncandidates, 4096);
    EXPECT_GE(deep.rerank, 1024);
    EXPECT_EQ(engine::CertifyDeeper(p, false).nprobe, d.nprobe) << "the rerank's bound: only the rerank deepens";
    EXPECT_EQ(engine::CertifyDeeper(p, false).rerank, 2 * d.rerank);
    o.certify = false;  // adaptive (the default): the same start, the unsettled 2 steps deeper at least
    p = PlanSearch(&e, 1000000, true, Device::kCpu, o);
    EXPECT_TRUE(engine::Adapts(p));
    EXPECT_EQ(p.nprobe, d.nprobe);
    EXPECT_EQ(p.rerank, d.rerank);
    EXPECT_EQ(p.certify_steps, engine::kAdaptiveSteps);
    e.points.push_back({24, 8192, 2048, 0.9999});
    o.target_recall = 0.9999;  // 24 / 8,192 / 2,048: a third step (27 / 8,192 / 2,048)
    EXPECT_EQ(PlanSearch(&e, 1000000, true, Device::kCpu, o).certify_steps, 3);
    e.points.back() = {32, 16384, 4096, 0.9999};  // past the steps: as many as there are
    EXPECT_EQ(PlanSearch(&e, 1000000, true, Device::kCpu, o).certify_steps, engine::kMaxAdaptiveSteps);
    e.points.pop_back();
    EXPECT_EQ(PlanSearch(nullptr, 1000000, true, Device::kCpu, o).certify_steps, engine::kAdaptiveSteps);
    o.target_recall = 0.9985;
    o.adaptive = false;  // the estimate's setting for every query
    p = PlanSearch(&e, 1000000, true, Device::kCpu, o);
    EXPECT_EQ(p.nprobe, 16);
    EXPECT_EQ(p.rerank, 1024);
    o.adaptive = true;
    o.target_recall = 0;  // the settings as given, for every query
    EXPECT_FALSE(engine::Adapts(PlanSearch(&e, 1000000, true, Device::kCpu, o)));
    o.certify = true;
    o.target_recall = 0.9;  // cheaper than the defaults: there, one step at most
    p = PlanSearch(&e, 1000000, true, Device::kCpu, o);
    EXPECT_EQ(p.nprobe, 2);
    EXPECT_EQ(p.certify_steps, 1);
    o.certify_steps = 0;  // the caller's
    EXPECT_EQ(PlanSearch(&e, 1000000, true, Device::kCpu, o).certify_steps, 0);
    o.certify_steps = -1;
    EXPECT_EQ(PlanSearch(nullptr, 1000000, true, Device::kCpu, o).certify_steps, engine::kCertifySteps);
    o.target_recall = 0;  // the settings as given
    EXPECT_FALSE(PlanSearch(&e, 10, true, Device::kCpu, o).exhaustive);
    EXPECT_EQ(PlanSearch(&e, 10, true, Device::kCpu, o).nprobe, d.nprobe);

    // A small index searched at the defaults returns the exhaustive search's results.
    SynthOptions so;
    so.n_docs = 200;
    so.n_queries = 8;
    so.dim = 32;
    IndexBuildOptions bo;
    bo.progress = false;
    bo.keep_vectors = true;
    bo.n_centroids = 16;
    const fs::path dir = testing::BuildSynthIndex("tms_estimate_small", so, bo);
    HostArray qa;
    ASSERT_TRUE(LoadNpy((dir / "queries.npy").string(), &qa).ok());
    const QueryBatch qb{qa.bytes.data(), DType::kF16, int(qa.shape[0]), int(qa.shape[1]), int(qa.shape[2]), nullptr};
    SearcherOptions sopt;
    sopt.device = Device::kCpu;
    sopt.progress = false;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(sopt, (dir / "index").string(), &s).ok());
    EXPECT_TRUE(s->Plan(SearchOptions()).exhaustive);
    SearchOptions ex, approx;
    ex.exhaustive = true;
    approx.target_recall = 0;
    approx.ncandidates = 16;
    approx.rerank = 10;
    EXPECT_FALSE(s->Plan(approx).exhaustive);
    std::vector<std::vector<SearchHit>> by_default, exact, cheap;
    ASSERT_TRUE(s->Search(qb, SearchOptions(), &by_default).ok());
    ASSERT_TRUE(s->Search(qb, ex, &exact).ok());
    ASSERT_TRUE(s->Search(qb, approx, &cheap).ok());
    bool cheap_differs = false;
    for (size_t q = 0; q < exact.size(); ++q) {
        ASSERT_EQ(by_default[q].size(), exact[q].size());
        for (size_t j = 0; j < exact[q].size(); ++j) {
            EXPECT_EQ(by_default[q][j].internal_id, exact[q][j].internal_id);
            EXPECT_EQ(by_default[q][j].score, exact[q][j].score);
            cheap_differs = cheap_differs || j >= cheap[q].size() || cheap[q][j].score != exact[q][j].score;
        }
    }
    EXPECT_TRUE(cheap_differs) << "16 candidates and no rerank beyond k should not be exact";
}

// The pseudo-queries' recipes, checked against the corpus they come from: each token a unit
// vector near a corpus token (noise 0.5: cosine ~0.89); span queries are consecutive tokens of
// one document, then copies of one padding vector that the corpus matches only weakly.
TEST(EstimateCpu, PseudoQueryRecipes) {
    SynthOptions so;
    so.n_docs = 400;
    so.n_queries = 4;
    so.dim = 32;
    IndexBuildOptions bo;
    bo.progress = false;
    bo.keep_vectors = true;
    const fs::path dir = testing::BuildSynthIndex("tms_estimate_recipes", so, bo);
    const std::string index = (dir / "index").string();
    HostArray docs, lens_arr;
    ASSERT_TRUE(LoadNpy((dir / "docs.npy").string(), &docs).ok());
    ASSERT_TRUE(LoadNpy((dir / "doclens.npy").string(), &lens_arr).ok());
    const int dim = so.dim;
    const int64_t n_tok = docs.shape[0];
    std::vector<float> corpus(size_t(n_tok) * dim);
    const uint16_t* raw = reinterpret_cast<const uint16_t*>(docs.bytes.data());
    for (size_t i = 0; i < corpus.size(); ++i) corpus[i] = kernels::half_to_float(raw[i]);
    std::vector<int64_t> doc_of(static_cast<size_t>(n_tok));
    {
        const int32_t* dl = reinterpret_cast<const int32_t*>(lens_arr.bytes.data());
        int64_t t = 0;
        for (int64_t d = 0; d < lens_arr.shape[0]; ++d)
            for (int32_t j = 0; j < dl[d]; ++j) doc_of[size_t(t++)] = d;
    }
    const auto unit = [&](const uint16_t* h, std::vector<float>* v) {
        v->resize(size_t(dim));
        double n2 = 0;
        for (int c = 0; c < dim; ++c) n2 += double((*v)[size_t(c)] = kernels::half_to_float(h[c])) * (*v)[size_t(c)];
        return std::sqrt(n2);
    };
    // The corpus token closest to v (cosine into *best).
    const auto nearest = [&](const std::vector<float>& v, double* best) {
        int64_t arg = -1;
        *best = -2;
        for (int64_t t = 0; t < n_tok; ++t) {
            double dot = 0;
            for (int c = 0; c < dim; ++c) dot += double(v[size_t(c)]) * corpus[size_t(t) * dim + c];
            if (dot > *best) *best = dot, arg = t;
        }
        return arg;
    };
    EstimateOptions eo;
    std::vector<uint16_t> q;
    std::vector<int32_t> lens;
    int n = 0;
    std::vector<float> v, w;
    double cos = 0;

    // Default: up to 32 tokens, each near some corpus token.
    ASSERT_TRUE(MakePseudoQueries(index, eo, 8, &q, &lens, &n).ok());
    ASSERT_EQ(n, 8);
    ASSERT_EQ(q.size(), size_t(n) * eo.query_tokens * dim);
    for (int i = 0; i < n; ++i) {
        ASSERT_TRUE(lens[size_t(i)] >= so.min_doc_len && lens[size_t(i)] <= eo.query_tokens) << lens[size_t(i)];
        for (int j = 0; j < lens[size_t(i)]; ++j) {
            EXPECT_NEAR(unit(q.data() + (size_t(i) * eo.query_tokens + j) * dim, &v), 1.0, 1e-2);
            nearest(v, &cos);
            EXPECT_GT(cos, 0.75) << "query " << i << " token " << j;
        }
    }

    // Span queries: 11 consecutive tokens of one document, then one padding vector 21 times.
    eo.content_tokens = 11;
    ASSERT_TRUE(MakePseudoQueries(index, eo, 8, &q, &lens, &n).ok());
    ASSERT_EQ(n, 8);
    for (int i = 0; i < n; ++i) {
        ASSERT_EQ(lens[size_t(i)], eo.query_tokens);
        const uint16_t* qi = q.data() + size_t(i) * eo.query_tokens * dim;
        // Where the span came from: the corpus position whose next 11 tokens match best.
        int64_t first = -1;
        double best = -1e9;
        for (int64_t t = 0; t + eo.content_tokens <= n_tok; ++t) {
            double sum = 0;
            for (int j = 0; j < eo.content_tokens; ++j)
                for (int c = 0; c < dim; ++c)
                    sum += double(kernels::half_to_float(qi[size_t(j) * dim + c])) * corpus[size_t(t + j) * dim + c];
            if (sum > best) best = sum, first = t;
        }
        for (int j = 0; j < eo.content_tokens; ++j) {
            unit(qi + size_t(j) * dim, &v);
            double dot = 0;
            for (int c = 0; c < dim; ++c) dot += double(v[size_t(c)]) * corpus[size_t(first + j) * dim + c];
            EXPECT_GT(dot, 0.75) << "query " << i << " token " << j << " is not token " << j << " of the span";
            EXPECT_EQ(doc_of[size_t(first + j)], doc_of[size_t(first)]) << "the span leaves its document";
        }
        unit(qi + size_t(eo.content_tokens) * dim, &w);
        nearest(w, &cos);
        EXPECT_GT(cos, 0.3) << "query " << i;
        EXPECT_LT(cos, 0.8) << "query " << i << ": the padding is matched closely";
        for (int j = eo.content_tokens + 1; j < eo.query_tokens; ++j)
            EXPECT_TRUE(
                std::equal(qi + size_t(j) * dim, qi + size_t(j + 1) * dim, qi + size_t(eo.content_tokens) * dim));
    }

    EXPECT_EQ(MakePseudoQueries(index, eo, 0, &q, &lens, &n).code(), Status::Code::kInvalidArgument);
    eo.pad_noise = -1;
    EXPECT_EQ(MakePseudoQueries(index, eo, 8, &q, &lens, &n).code(), Status::Code::kInvalidArgument);
}

}  // namespace
}  // namespace tms
