// Copyright TileMaxSim authors. IndexStreamBuilder: an index from documents as they come.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>

#include "index/index_data.h"
#include "index/metadata/metadata.h"
#include "index/store/index_reader.h"
#include "index/train/train.h"
#include "kernels/maxsim.h"
#include "tests/scratch_dir.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

struct StreamedDocs {
    std::vector<uint16_t> tokens;  // fp16 [n_tokens, dim]
    std::vector<int64_t> lens;
    std::vector<int64_t> offsets{0};
    std::vector<std::string> ids;
    std::vector<std::string> meta;  // a JSON object per document
    int dim = 0;
    EmbeddingView view(size_t d0, size_t d1) const {
        return {tokens.data() + offsets[d0] * dim, DType::kF16, offsets[d1] - offsets[d0], dim};
    }
};

StreamedDocs make_streamed_docs(int n_docs, int dim, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01;
    StreamedDocs c;
    c.dim = dim;
    for (int d = 0; d < n_docs; ++d) {
        c.lens.push_back(1 + int(rng() % 30));
        c.offsets.push_back(c.offsets.back() + c.lens.back());
        c.ids.push_back("doc-" + std::to_string(d * 7));
        c.meta.push_back("{\"group\": " + std::to_string(d % 5) + ", \"body\": \"word" + std::to_string(d % 11) +
                         " text\"}");
        for (int t = 0; t < c.lens.back() * dim; ++t) c.tokens.push_back(kernels::float_to_half(n01(rng) * 0.1f));
    }
    return c;
}

// Streams documents [0, n) of `c` in batches of the given sizes (repeated), metadata on batches
// whose index is even (the others' documents get NULLs).
Status stream_batches(const StreamedDocs& c, const IndexBuildOptions& o, const std::string& path, int64_t expected,
                      const std::vector<size_t>& sizes, bool metadata_on_even_batches = true) {
    std::unique_ptr<IndexStreamBuilder> b;
    TMS_RETURN_IF_ERROR(IndexStreamBuilder::Create(o, path, expected, &b));
    size_t batch = 0;
    for (size_t d0 = 0; d0 < c.lens.size(); ++batch) {
        const size_t d1 = std::min(c.lens.size(), d0 + sizes[batch % sizes.size()]);
        DocMetadata md;
        md.objects.assign(c.meta.begin() + int64_t(d0), c.meta.begin() + int64_t(d1));
        const bool with = metadata_on_even_batches && batch % 2 == 0;
        TMS_RETURN_IF_ERROR(b->Add(
            c.view(d0, d1), std::vector<int64_t>(c.lens.begin() + int64_t(d0), c.lens.begin() + int64_t(d1)),
            std::vector<std::string>(c.ids.begin() + int64_t(d0), c.ids.begin() + int64_t(d1)), with ? &md : nullptr));
        d0 = d1;
    }
    return b->Finish();
}

std::vector<std::string> stream_metadata_rows(const std::string& index) {
    std::vector<std::string> rows;
    std::vector<MetaColumn> cols;
    const Status st = index::ForEachMetadataRow((fs::path(index) / index::kMetadataFile).string(), INT64_MAX, &cols,
                                                [&](int64_t doc, const std::string& id, const index::MetaCells& cells) {
                                                    std::string r = std::to_string(doc) + " " + id;
                                                    for (const auto& [col, v] : cells) {
                                                        r += " " + cols[size_t(col)].name + "=" +
                                                             std::to_string(int(v.kind)) + ":" + std::to_string(v.i) +
                                                             ":" + v.s;
                                                    }
                                                    rows.push_back(r);
                                                    return Status::OK();
                                                });
    EXPECT_TRUE(st.ok()) << st.ToString();
    return rows;
}

IndexBuildOptions stream_options() {
    IndexBuildOptions o;
    o.n_centroids = 32;
    o.keep_vectors = true;
    o.chunk_docs = 37;
    o.progress = false;
    o.text_field = "body";
    return o;
}

// A stream shorter than its training sample is built as IndexBuilder builds the same documents:
// the same model, codes, IVF lists, vectors, ids and metadata (NULLs where a batch had none).
TEST(StreamBuildCpu, ShortStreamEqualsTheBuildOfItsDocuments) {
    const StreamedDocs c = make_streamed_docs(400, 64, 5);
    const std::string dir = testing::ScratchDir("tms_stream_short").string();
    const IndexBuildOptions o = stream_options();
    const Status st = stream_batches(c, o, dir + "/stream", 0, {1, 37, 100, 2});
    ASSERT_TRUE(st.ok()) << st.ToString();
    // The same documents in one Build, with the metadata the stream's batches carried.
    DocMetadata md;
    for (size_t d0 = 0, batch = 0; d0 < c.lens.size(); ++batch) {
        const size_t n = std::vector<size_t>{1, 37, 100, 2}[batch % 4], d1 = std::min(c.lens.size(), d0 + n);
        for (size_t d = d0; d < d1; ++d) md.objects.push_back(batch % 2 == 0 ? c.meta[d] : "{}");
        d0 = d1;
    }
    std::unique_ptr<IndexBuilder> builder;
    ASSERT_TRUE(IndexBuilder::Create(o, dir + "/whole", &builder).ok());
    ASSERT_TRUE(builder->Build(c.view(0, c.lens.size()), c.lens, c.ids, nullptr, &md).ok());
    index::IndexData a, b;
    ASSERT_TRUE(index::ReadIndex(dir + "/stream", true, false, &a).ok());
    ASSERT_TRUE(index::ReadIndex(dir + "/whole", true, false, &b).ok());
    EXPECT_EQ(a.info.n_docs, 400);
    EXPECT_EQ(a.doc_offsets, b.doc_offsets);
    EXPECT_EQ(a.doc_ids, c.ids);
    EXPECT_EQ(a.model.centroids, b.model.centroids);
    EXPECT_EQ(a.model.codebook, b.model.codebook);
    EXPECT_EQ(a.token_centroids, b.token_centroids);
    EXPECT_EQ(a.codes, b.codes);
    EXPECT_EQ(a.ivf_offsets, b.ivf_offsets);
    EXPECT_EQ(a.ivf_docs, b.ivf_docs);
    EXPECT_EQ(std::vector<uint16_t>(a.vectors.begin(), a.vectors.end()), c.tokens);
    EXPECT_EQ(stream_metadata_rows(dir + "/stream"), stream_metadata_rows(dir + "/whole"));
    index::TextIndexSpec spec;
    bool has = false;
    ASSERT_TRUE(index::ReadTextIndexSpec((fs::path(dir) / "stream" / index::kMetadataFile).string(), &spec, &has).ok());
    EXPECT_TRUE(has);
    EXPECT_EQ(spec.column, "body");
}

// A stream longer than its sample trains on its first documents and writes the rest as they
// come, into as many shards as fill: every document, in order, under the centroid of each of its
// tokens, with its vectors; the index opens and searches across the shards.
TEST(StreamBuildCpu, LongStreamTrainsOnItsFirstPartAndFillsShards) {
    const StreamedDocs c = make_streamed_docs(1500, 64, 9);
    const std::string dir = testing::ScratchDir("tms_stream_long").string();
    IndexBuildOptions o = stream_options();
    o.text_field.clear();
    o.max_train_tokens = 3000;   // the sample: about the first 190 documents
    o.shards = 3;                // a third of the expected tokens each
    o.ivf_memory_entries = 501;  // IVF runs spilled and merged
    const int64_t total = c.offsets.back();
    const Status st = stream_batches(c, o, dir + "/idx", total, {64, 1, 250}, false);
    ASSERT_TRUE(st.ok()) << st.ToString();
    int shards = 0;
    ASSERT_TRUE(ReadIndexShardCount(dir + "/idx", &shards).ok());
    EXPECT_EQ(shards, 3);
    index::IndexData got;
    ASSERT_TRUE(index::ReadIndex(dir + "/idx", true, false, &got).ok());
    EXPECT_EQ(got.info.n_docs, 1500);
    EXPECT_EQ(got.doc_ids, c.ids);
    EXPECT_EQ(got.doc_offsets, c.offsets);
    EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), c.tokens);
    EXPECT_EQ(got.model.n_centroids, 32);
    // The model is the one trained on the documents held until the sample was full (the
    // batches up to the one that passed 3,000 tokens), not on the whole stream.
    size_t held = 0;
    for (size_t batch = 0; c.offsets[held] <= 3000; ++batch) held += std::vector<size_t>{64, 1, 250}[batch % 3];
    index::IndexModel first;
    std::vector<std::pair<std::string, double>> phases;
    ASSERT_TRUE(index::TrainModel({c.view(0, held)}, o, &first, &phases).ok());
    EXPECT_EQ(got.model.centroids, first.centroids);
    EXPECT_EQ(got.model.codebook, first.codebook);
    std::vector<std::set<int32_t>> expect(32);
    for (int64_t d = 0; d < 1500; ++d)
        for (int64_t t = got.doc_offsets[d]; t < got.doc_offsets[d + 1]; ++t)
            expect[got.token_centroids[t]].insert(int32_t(d));
    for (int k = 0; k < 32; ++k) {
        std::set<int32_t> have(got.ivf_docs.begin() + got.ivf_offsets[k],
                               got.ivf_docs.begin() + got.ivf_offsets[k + 1]);
        EXPECT_EQ(have, expect[k]) << "centroid " << k;
    }
    // Each token's centroid is the nearest of the model's (the encoder's assignment, after training).
    for (int64_t t = 0; t < got.doc_offsets.back(); t += 97) {
        float best = -1e30f;
        int arg = -1;
        for (int k = 0; k < 32; ++k) {
            float dot = 0;
            for (int j = 0; j < 64; ++j)
                dot += kernels::half_to_float(c.tokens[size_t(t) * 64 + j]) * got.model.centroids[size_t(k) * 64 + j];
            // nearest by L2: maximise <x, c> - |c|^2 / 2
            float cc = 0;
            for (int j = 0; j < 64; ++j)
                cc += got.model.centroids[size_t(k) * 64 + j] * got.model.centroids[size_t(k) * 64 + j];
            if (dot - cc / 2 > best) best = dot - cc / 2, arg = k;
        }
        EXPECT_EQ(got.token_centroids[size_t(t)], uint32_t(arg)) << "token " << t;
    }
    // Exhaustive search over the shards finds a document from its own tokens.
    SearcherOptions so;
    so.device = Device::kCpu;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(so, dir + "/idx", &s).ok());
    for (size_t d : {size_t(3), size_t(700), size_t(1499)}) {
        SearchOptions q;
        q.k = 1;
        q.exhaustive = true;
        std::vector<std::vector<SearchHit>> hits;
        const EmbeddingView v = c.view(d, d + 1);
        QueryBatch qb{v.data, DType::kF16, 1, int(v.rows), 64};
        ASSERT_TRUE(s->Search(qb, q, &hits).ok());
        ASSERT_EQ(hits.size(), 1u);
        ASSERT_FALSE(hits[0].empty());
        EXPECT_EQ(hits[0][0].doc_id, c.ids[d]);
    }
}

// Bad batches are refused with a message naming the batch and leave the stream going; what was
// refused is not in the index. No documents, or a builder dropped unfinished: nothing at the path.
TEST(StreamBuildCpu, BadBatchesAreRefusedAndTheStreamGoesOn) {
    const StreamedDocs c = make_streamed_docs(60, 64, 2);
    const std::string dir = testing::ScratchDir("tms_stream_bad").string();
    IndexBuildOptions o = stream_options();
    o.n_centroids = 8;
    o.text_field.clear();
    std::unique_ptr<IndexStreamBuilder> b;
    ASSERT_TRUE(IndexStreamBuilder::Create(o, dir + "/idx", 0, &b).ok());
    const auto lens = [&](size_t d0, size_t d1) {
        return std::vector<int64_t>(c.lens.begin() + int64_t(d0), c.lens.begin() + int64_t(d1));
    };
    const auto ids = [&](size_t d0, size_t d1) {
        return std::vector<std::string>(c.ids.begin() + int64_t(d0), c.ids.begin() + int64_t(d1));
    };
    ASSERT_TRUE(b->Add(c.view(0, 20), lens(0, 20), ids(0, 20)).ok());
    const auto refused = [&](const Status& st, const std::string& want) {
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << st.ToString();
        EXPECT_NE(st.message().find(want), std::string::npos) << st.message();
    };
    // A duplicate of an earlier batch's id, and one within the batch.
    std::vector<std::string> dup = ids(20, 30);
    dup[4] = c.ids[3];
    refused(b->Add(c.view(20, 30), lens(20, 30), dup), "batch 2: duplicate id 'doc-21'");
    dup = ids(20, 30);
    dup[7] = dup[2];
    refused(b->Add(c.view(20, 30), lens(20, 30), dup), "duplicate id");
    // Lengths that do not cover the tokens; another dimension; a NaN; metadata for other documents.
    std::vector<int64_t> short_lens = lens(20, 30);
    short_lens.back() += 1;
    refused(b->Add(c.view(20, 30), short_lens, ids(20, 30)), "batch 4: ");
    const EmbeddingView v = c.view(20, 30);
    refused(b->Add(EmbeddingView{v.data, v.dtype, v.rows / 2, 128}, {v.rows / 2}, {"x"}),
            "differs from the stream's 64");
    std::vector<uint16_t> nan(c.tokens.begin() + c.offsets[20] * 64, c.tokens.begin() + c.offsets[30] * 64);
    nan[70] = 0x7e00;
    refused(b->Add(EmbeddingView{nan.data(), DType::kF16, v.rows, 64}, lens(20, 30), ids(20, 30)),
            "batch 6: docs: non-finite value (NaN) at row 1, column 6");
    DocMetadata md;
    md.objects = {"{\"a\": 1}"};
    refused(b->Add(c.view(20, 30), lens(20, 30), ids(20, 30), &md), "1 object for 10 documents");
    // The same documents, right, go in; then the rest.
    ASSERT_TRUE(b->Add(c.view(20, 30), lens(20, 30), ids(20, 30)).ok());
    ASSERT_TRUE(b->Add(c.view(30, 60), lens(30, 60), ids(30, 60)).ok());
    ASSERT_TRUE(b->Finish().ok());
    EXPECT_FALSE(b->Add(c.view(0, 1), lens(0, 1), {"late"}).ok());
    index::IndexData got;
    ASSERT_TRUE(index::ReadIndex(dir + "/idx", true, false, &got).ok());
    EXPECT_EQ(got.doc_ids, c.ids);
    EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), c.tokens);

    // An index there already: refused at Create unless overwrite.
    EXPECT_EQ(IndexStreamBuilder::Create(o, dir + "/idx", 0, &b).code(), Status::Code::kAlreadyExists);
    // No documents; a builder dropped before Finish: nothing at the path, no build directory left.
    ASSERT_TRUE(IndexStreamBuilder::Create(o, dir + "/empty", 0, &b).ok());
    EXPECT_EQ(b->Finish().code(), Status::Code::kInvalidArgument);
    b.reset();
    ASSERT_TRUE(IndexStreamBuilder::Create(o, dir + "/dropped", 0, &b).ok());
    ASSERT_TRUE(b->Add(c.view(0, 20), lens(0, 20), ids(0, 20)).ok());
    b.reset();
    EXPECT_FALSE(fs::exists(dir + "/empty"));
    EXPECT_FALSE(fs::exists(dir + "/dropped"));
    size_t entries = 0;
    for (const auto& e : fs::directory_iterator(dir)) entries += e.path().filename() != "idx";
    EXPECT_EQ(entries, 0u) << "leftover build directories";
}

}  // namespace
}  // namespace tms
