// Embedding TileMaxSim: build an index from in-memory token embeddings, open a searcher,
// search a batch of queries. Usage: embed_example INDEX_DIR
#include <tilemaxsim/tilemaxsim.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

int main(int argc, char** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s INDEX_DIR\n", argv[0]);
        return 2;
    }
    const int dim = 64, n_docs = 400;
    // 1. Token embeddings: documents of 1..40 tokens, unit rows (what a ColBERT model emits).
    std::mt19937 rng(7);
    std::normal_distribution<float> n01;
    std::vector<float> tokens;
    std::vector<int64_t> doclens;
    std::vector<std::string> ids;
    for (int d = 0; d < n_docs; ++d) {
        doclens.push_back(1 + d % 40);
        ids.push_back("passage-" + std::to_string(d));
        for (int t = 0; t < doclens.back(); ++t) {
            std::vector<float> v(dim);
            float s = 0;
            for (float& x : v) s += (x = n01(rng)) * x;
            for (float x : v) tokens.push_back(x / std::sqrt(s));
        }
    }
    // 2. Build the index (PQ codes + fp16 vectors for exact rerank).
    tms::IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.n_centroids = 32;
    bo.overwrite = true;
    bo.progress = false;
    std::unique_ptr<tms::IndexBuilder> builder;
    tms::Status st = tms::IndexBuilder::Create(bo, argv[1], &builder);
    tms::EmbeddingView view{tokens.data(), tms::DType::kF32, static_cast<int64_t>(tokens.size() / dim), dim};
    if (st.ok()) st = builder->Build(view, doclens, ids);
    if (!st.ok()) {
        std::fprintf(stderr, "build failed: %s\n", st.ToString().c_str());
        return 1;
    }
    // 3. Open and search: query = the first 8 tokens of passage-115, so it should come first.
    std::unique_ptr<tms::Searcher> searcher;
    st = tms::Searcher::Open(tms::SearcherOptions{}, argv[1], &searcher);
    if (!st.ok()) {
        std::fprintf(stderr, "open failed: %s\n", st.ToString().c_str());
        return 1;
    }
    int64_t start = 0;
    for (int d = 0; d < 115; ++d) start += doclens[d];
    tms::QueryBatch q;
    q.data = tokens.data() + start * dim;
    q.dtype = tms::DType::kF32;
    q.n_queries = 1;
    q.q_tokens = 8;
    q.dim = dim;
    std::vector<std::vector<tms::SearchHit>> hits;
    tms::SearchOptions so;
    so.k = 3;
    st = searcher->Search(q, so, &hits);
    if (!st.ok()) {
        std::fprintf(stderr, "search failed: %s\n", st.ToString().c_str());
        return 1;
    }
    std::printf("index: %lld documents on %s\n", static_cast<long long>(searcher->info().n_docs),
                tms::DeviceName(searcher->device()));
    for (const auto& h : hits[0]) std::printf("hit %s %.4f\n", h.doc_id.c_str(), h.score);
    std::printf("top hit: %s\n", hits[0].empty() ? "none" : hits[0][0].doc_id.c_str());
    return hits[0].empty() || hits[0][0].doc_id != "passage-115";
}
