// Copyright TileMaxSim authors. The index module: .npy I/O, options JSON, build + reload.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <algorithm>
#include <filesystem>
#include <cstring>
#include <fstream>
#include <limits>
#include <numeric>
#include <random>
#include <set>

#include <faiss/impl/ProductQuantizer.h>

#include "index/encode/encoder.h"
#include "index/index_data.h"
#include "index/store/crc32c.h"
#include "index/store/index_reader.h"
#include "index/store/index_writer.h"
#include "index/store/shards.h"
#include "index/train/train.h"
#include "kernels/maxsim.h"
#include "kernels/nearest.h"
#include "tests/scratch_dir.h"
#include "index/ingest/npy.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms {
namespace {

namespace fs = std::filesystem;

std::string index_dir_for(const std::string& name) { return testing::ScratchDir("tms_idx_" + name).string(); }

TEST(NpyCpu, SaveLoadRoundTrip) {
    const std::string dir = index_dir_for("npy");
    const std::vector<float> v = {1, 2, 3, 4, 5, 6};
    ASSERT_TRUE(SaveNpy(dir + "/a.npy", "<f4", {2, 3}, v.data(), v.size() * 4).ok());
    HostArray a;
    ASSERT_TRUE(LoadNpy(dir + "/a.npy", &a).ok());
    EXPECT_EQ(a.descr, "<f4");
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(0, std::memcmp(a.bytes.data(), v.data(), 24));
    const std::vector<int64_t> lens = {3, 1};
    ASSERT_TRUE(SaveNpy(dir + "/l.npy", "<i8", {2}, lens.data(), 16).ok());
    ASSERT_TRUE(LoadNpy(dir + "/l.npy", &a).ok());
    std::vector<int64_t> got;
    ASSERT_TRUE(IntegersFromArray(a, "l.npy", &got).ok());
    EXPECT_EQ(got, lens);
    EmbeddingView view;
    Status st = EmbeddingsFromArray(a, 2, "l.npy", &view);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("l.npy"), std::string::npos);
    EXPECT_EQ(LoadNpy(dir + "/missing.npy", &a).code(), Status::Code::kNotFound);
}

// Numbers that are not integers of the field's type are refused, never converted (a huge float
// cast to int is undefined behaviour: the fuzzer found one).
TEST(OptionsCpu, IntegerKeysRefuseFloatsAndOutOfRange) {
    const std::pair<const char*, const char*> cases[] = {
        {R"({"chunk_docs": 1e300})", "key 'chunk_docs' must be an integer"},
        {R"({"chunk_docs": 2.0})", "key 'chunk_docs' must be an integer"},
        {R"({"chunk_docs": 40977777777777777777777777})", "key 'chunk_docs' must be an integer"},
        {R"({"chunk_docs": 9223372036854775807})", "key 'chunk_docs' is out of range"},
        {R"({"shards": -3000000000})", "key 'shards' is out of range"},
        {R"({"seed": -1})", "key 'seed' is out of range"},
        {R"({"max_train_tokens": 18446744073709551615})", "key 'max_train_tokens' is out of range"},
        {R"({"build": [1, 2]})", "key 'build' must be an object"},
        {R"({"build": 7})", "key 'build' must be an object"},
    };
    for (const auto& [json, want] : cases) {
        IndexBuildOptions o;
        const Status st = ParseBuildOptionsJson(json, &o);
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument) << json;
        EXPECT_EQ(st.message(), want) << json;
    }
    IndexBuildOptions o;
    ASSERT_TRUE(ParseBuildOptionsJson(R"({"seed": 18446744073709551615, "shards": 4, "gpu": 1})", &o).ok());
    EXPECT_EQ(o.seed, UINT64_MAX);
    EXPECT_EQ(o.shards, 4);
    EXPECT_EQ(o.gpu, 1);
}

TEST(OptionsCpu, ParsesPresetsAndRejectsUnknownKeys) {
    for (const char* name : {"small", "msmarco", "beir"}) {
        IndexBuildOptions o;
        Status st = LoadBuildOptionsJson(std::string(TMS_SOURCE_DIR) + "/configs/" + name + ".json", &o);
        EXPECT_TRUE(st.ok()) << name << ": " << st.ToString();
    }
    IndexBuildOptions o;
    EXPECT_TRUE(ParseBuildOptionsJson(R"({"codec": "residual", "residual_nbits": 4})", &o).ok());
    EXPECT_EQ(o.codec, "residual");
    EXPECT_EQ(o.residual_nbits, 4);
    Status st = ParseBuildOptionsJson(R"({"codecs": "pq"})", &o);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("codecs"), std::string::npos);
    EXPECT_FALSE(ParseBuildOptionsJson(R"({"pq_m": "sixteen"})", &o).ok());
    EXPECT_FALSE(ParseBuildOptionsJson("{not json", &o).ok());
    IndexBuildOptions back;
    EXPECT_TRUE(ParseBuildOptionsJson(BuildOptionsToJson(o), &back).ok());
    EXPECT_EQ(back.residual_nbits, 4);
}

struct Built {
    std::vector<uint16_t> tokens;
    std::vector<int64_t> lens;
    std::vector<std::string> ids;
};

Built random_docs(int n_docs, int dim, uint32_t seed) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> n01;
    Built b;
    for (int d = 0; d < n_docs; ++d) {
        b.lens.push_back(1 + int(rng() % 30));
        b.ids.push_back("doc-" + std::to_string(d * 7));
        for (int t = 0; t < b.lens.back() * dim; ++t) b.tokens.push_back(kernels::float_to_half(n01(rng) * 0.1f));
    }
    return b;
}

class BuildAndLoad : public ::testing::TestWithParam<std::string> {};

// `b` indexed by the engine's builder (at DIR/built), read back whole: a model, codes and IVF
// lists as production builds them.
void build_data(const EmbeddingView& v, const Built& b, const IndexBuildOptions& bo, const std::string& dir,
                index::IndexData* out) {
    std::unique_ptr<IndexBuilder> builder;
    ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/built", &builder).ok());
    const Status st = builder->Build(v, b.lens, b.ids);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(index::ReadIndex(dir + "/built", bo.keep_vectors, false, out).ok());
}

TEST_P(BuildAndLoad, RoundTripsEverything) {
    const int dim = 64;
    const Built b = random_docs(500, dim, 3);
    EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
    IndexBuildOptions bo;
    bo.codec = GetParam();
    bo.n_centroids = 32;
    bo.keep_vectors = true;
    bo.chunk_docs = 37;
    bo.progress = false;
    bo.ivf_memory_entries = 97;  // spill many IVF runs and merge them
    index::IndexData built;
    ASSERT_NO_FATAL_FAILURE(build_data(v, b, bo, index_dir_for("rt_" + bo.codec), &built));
    const std::string path = index_dir_for("rt_" + bo.codec) + "/idx";
    ASSERT_TRUE(index::WriteIndex(path, built, bo).ok());
    index::IndexData got;
    Status st = index::ReadIndex(path, true, false, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(got.info.n_docs, 500);
    EXPECT_EQ(got.info.n_chunks, (500 + 36) / 37);
    EXPECT_EQ(got.doc_offsets, built.doc_offsets);
    EXPECT_EQ(got.token_centroids, built.token_centroids);
    EXPECT_EQ(got.codes, built.codes);
    EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), b.tokens);
    EXPECT_EQ(got.doc_ids, b.ids);
    EXPECT_EQ(got.ivf_offsets, built.ivf_offsets);
    EXPECT_EQ(got.ivf_docs, built.ivf_docs);
    EXPECT_EQ(got.model.centroids, built.model.centroids);
    EXPECT_EQ(got.model.codebook, built.model.codebook);
    // IVF: every document is listed under the centroid of each of its tokens, and only there.
    std::vector<std::set<int32_t>> expect(bo.n_centroids);
    for (int64_t d = 0; d < 500; ++d)
        for (int64_t t = got.doc_offsets[d]; t < got.doc_offsets[d + 1]; ++t)
            expect[got.token_centroids[t]].insert(int32_t(d));
    for (int k = 0; k < bo.n_centroids; ++k) {
        std::set<int32_t> have(got.ivf_docs.begin() + got.ivf_offsets[k],
                               got.ivf_docs.begin() + got.ivf_offsets[k + 1]);
        EXPECT_EQ(have, expect[k]) << "centroid " << k;
    }
    // Codes decode close to the input: the residual codec's error is bounded by the buckets.
    double err = 0, norm = 0;
    const int nb = got.model.n_code_bytes, dsub = dim / nb;
    for (int64_t t = 0; t < 200; ++t) {
        for (int j = 0; j < dim; ++j) {
            const int byte = j / dsub;
            const float dec = got.model.centroids[size_t(got.token_centroids[t]) * dim + j] +
                              got.model.codebook[(size_t(byte) * 256 + got.codes[t * nb + byte]) * dsub + j % dsub];
            const float x = kernels::half_to_float(b.tokens[t * dim + j]);
            err += double(dec - x) * (dec - x);
            norm += double(x) * x;
        }
    }
    EXPECT_LT(err / norm, 0.5) << "relative squared decoding error";
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.codec, bo.codec);
    EXPECT_TRUE(info.has_vectors);
}

INSTANTIATE_TEST_SUITE_P(IndexCpu, BuildAndLoad, ::testing::Values("pq", "residual"));

// IndexModel::unit_norm: set when the training tokens are unit vectors (to fp16 rounding), not
// when they are not; written with the index, read back, and sent with the model's bytes.
TEST(IndexCpu, UnitNormIsDetectedAndStored) {
    const int dim = 64;
    for (const float norm : {1.0f, 1.5f}) {
        SCOPED_TRACE("token norm " + std::to_string(norm));
        Built b = random_docs(200, dim, 5);
        for (size_t r = 0; r < b.tokens.size() / dim; ++r) {
            double ss = 0;
            for (int j = 0; j < dim; ++j) ss += std::pow(double(kernels::half_to_float(b.tokens[r * dim + j])), 2);
            for (int j = 0; j < dim; ++j) {
                uint16_t& h = b.tokens[r * dim + j];
                h = kernels::float_to_half(float(kernels::half_to_float(h) * norm / std::sqrt(ss)));
            }
        }
        EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
        IndexBuildOptions bo;
        bo.codec = "residual";
        bo.n_centroids = 16;
        bo.progress = false;
        index::IndexData built;
        ASSERT_NO_FATAL_FAILURE(build_data(v, b, bo, index_dir_for("unit_norm"), &built));
        EXPECT_EQ(built.model.unit_norm, norm == 1.0f);
        const std::string path = index_dir_for("unit_norm") + "/idx";
        ASSERT_TRUE(index::WriteIndex(path, built, bo).ok());
        index::IndexData got;
        ASSERT_TRUE(index::ReadIndex(path, false, false, &got).ok());
        EXPECT_EQ(got.model.unit_norm, norm == 1.0f);
        index::IndexModel back;
        ASSERT_TRUE(index::ModelFromBytes(index::ModelToBytes(got.model), &back).ok());
        EXPECT_EQ(back.unit_norm, norm == 1.0f);
        EXPECT_EQ(back.centroids, got.model.centroids);
    }
}

// A build with vectors writes them while k-means trains (IndexWriter::WriteVectorsAhead): from
// an input of several files, fp16 or float32, into several shards whose chunks straddle the
// files, the stored vectors are the input's in fp16, each chunk's checksum checked as read.
TEST(IndexCpu, VectorsWrittenAheadEqualTheInput) {
    const int dim = 32;
    const Built b = random_docs(300, dim, 9);
    for (const bool f32 : {false, true}) {
        SCOPED_TRACE(f32 ? "float32 input" : "fp16 input");
        const std::string dir = index_dir_for(f32 ? "ahead32" : "ahead16");
        // Three input files of 100, 150 and 50 documents.
        const std::array<int64_t, 4> doc0 = {0, 100, 250, 300};
        int64_t row = 0;
        for (int f = 0; f < 3; ++f) {
            const std::vector<int64_t> lens(b.lens.begin() + doc0[f], b.lens.begin() + doc0[f + 1]);
            const int64_t rows = std::accumulate(lens.begin(), lens.end(), int64_t(0));
            const std::string sfx = std::to_string(f) + ".npy";
            ASSERT_TRUE(
                SaveNpy(dir + "/doclens_" + sfx, "<i8", {int64_t(lens.size())}, lens.data(), lens.size() * 8).ok());
            if (f32) {
                std::vector<float> x(size_t(rows) * dim);
                for (size_t i = 0; i < x.size(); ++i) x[i] = kernels::half_to_float(b.tokens[size_t(row) * dim + i]);
                ASSERT_TRUE(SaveNpy(dir + "/docs_" + sfx, "<f4", {rows, dim}, x.data(), x.size() * 4).ok());
            } else {
                ASSERT_TRUE(SaveNpy(dir + "/docs_" + sfx, "<f2", {rows, dim}, b.tokens.data() + size_t(row) * dim,
                                    size_t(rows) * dim * 2)
                                .ok());
            }
            row += rows;
        }
        IndexBuildOptions bo;
        bo.n_centroids = 16;
        bo.keep_vectors = true;
        bo.chunk_docs = 7;  // chunks of the shard of documents [100, 200) span the first two files
        bo.shards = 3;
        bo.progress = false;
        std::unique_ptr<IndexBuilder> builder;
        ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/idx", &builder).ok());
        Status st = builder->BuildFromFiles(dir, "", "");
        ASSERT_TRUE(st.ok()) << st.ToString();
        index::IndexData got;
        st = index::ReadIndex(dir + "/idx", true, false, &got);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(got.info.n_docs, 300);
        EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), b.tokens);
        // A flipped byte in a vectors file fails its chunk's checksum.
        const std::string vf = dir + "/idx/shard-0001/vectors.f16";
        std::fstream f(vf, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(3 * dim * 2 + 1);
        f.put(char(0x5a));
        f.close();
        EXPECT_EQ(index::ReadIndex(dir + "/idx", true, false, &got).code(), Status::Code::kCorruption);
    }
}

// Vectors written ahead go to disk in 4 KiB-aligned direct writes of up to 8 MiB with the
// partial pages at a chunk's ends through the page cache: rows of 192 bytes put chunk ends
// anywhere in a page, and chunks of 200 documents (~0.6 MB) and one of 3,000 (~9 MB, more
// than one direct write) read back as the input, and their checksums hold.
TEST(IndexCpu, VectorsWrittenAheadAtAnyAlignmentEqualTheInput) {
    const int dim = 96;
    const Built b = random_docs(3000, dim, 11);
    const int64_t rows = int64_t(b.tokens.size()) / dim;
    for (const int chunk_docs : {200, 3000}) {
        SCOPED_TRACE("chunk_docs " + std::to_string(chunk_docs));
        const std::string dir = index_dir_for("ahead_align_" + std::to_string(chunk_docs));
        ASSERT_TRUE(
            SaveNpy(dir + "/doclens.npy", "<i8", {int64_t(b.lens.size())}, b.lens.data(), b.lens.size() * 8).ok());
        ASSERT_TRUE(SaveNpy(dir + "/docs.npy", "<f2", {rows, dim}, b.tokens.data(), b.tokens.size() * 2).ok());
        IndexBuildOptions bo;
        bo.n_centroids = 16;
        bo.keep_vectors = true;
        bo.chunk_docs = chunk_docs;
        bo.progress = false;
        std::unique_ptr<IndexBuilder> builder;
        ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/idx", &builder).ok());
        Status st = builder->BuildFromFiles(dir + "/docs.npy", dir + "/doclens.npy", "");
        ASSERT_TRUE(st.ok()) << st.ToString();
        index::IndexData got;
        st = index::ReadIndex(dir + "/idx", true, false, &got);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), b.tokens);
    }
}

// IndexWriter in two steps with vectors written ahead, with no lead (max_lead 1 byte): no chunk
// but the first is asked for before its documents are appended, and the index equals the input.
TEST(IndexCpu, VectorsWrittenAheadStayWithinTheirLead) {
    const int dim = 32;
    const Built b = random_docs(200, dim, 11);
    EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
    IndexBuildOptions bo;
    bo.n_centroids = 16;
    bo.keep_vectors = true;
    bo.chunk_docs = 9;
    bo.progress = false;
    index::IndexData built;
    ASSERT_NO_FATAL_FAILURE(build_data(v, b, bo, index_dir_for("ahead_lead"), &built));
    const std::string path = index_dir_for("ahead_lead") + "/idx";
    std::unique_ptr<index::IndexWriter> w;
    const std::vector<int64_t> shard_docs = index::SplitShards(b.lens, 2);
    ASSERT_EQ(shard_docs.size(), 2u);
    ASSERT_TRUE(index::IndexWriter::Begin(path, bo, &w, nullptr, shard_docs).ok());
    const int64_t first_chunk = std::accumulate(b.lens.begin(), b.lens.begin() + 9, int64_t(0));
    std::atomic<int64_t> appended{0};  // tokens of the documents handed to AppendDocs
    std::atomic<bool> early{false};
    ASSERT_TRUE(w->WriteVectorsAhead(b.lens, dim, 1, [&](int64_t t0, int64_t n, std::vector<uint16_t>*) {
                     if (t0 >= first_chunk && t0 + n > appended.load()) early = true;
                     return b.tokens.data() + t0 * dim;
                 }).ok());
    ASSERT_TRUE(w->SetModel(built.model).ok());
    int64_t t = 0;
    for (size_t d = 0; d < b.lens.size(); ++d) {
        appended += b.lens[d];
        ASSERT_TRUE(w->AppendDocs(&b.lens[d], 1, built.token_centroids.data() + t,
                                  built.codes.data() + t * built.model.n_code_bytes, nullptr, &b.ids[d])
                        .ok());
        t += b.lens[d];
    }
    ASSERT_TRUE(w->Finish().ok());
    EXPECT_FALSE(early.load()) << "rows were asked for before their documents were appended";
    index::IndexData got;
    const Status st = index::ReadIndex(path, true, false, &got);
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(std::vector<uint16_t>(got.vectors.begin(), got.vectors.end()), b.tokens);
    EXPECT_EQ(got.codes, built.codes);
    EXPECT_EQ(got.info.n_chunks, (shard_docs[0] + 8) / 9 + (shard_docs[1] + 8) / 9);
}

TEST(IndexCpu, FailedBuildLeavesNothing) {
    for (const bool vectors : {false, true}) {  // with vectors: written while k-means trains
        SCOPED_TRACE(vectors ? "with vectors" : "codes only");
        const int dim = 64;
        const Built b = random_docs(100, dim, 4);
        EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
        IndexBuildOptions bo;
        bo.keep_vectors = vectors;
        bo.n_centroids = 8;
        bo.pq_m = 7;  // does not divide 64: fails after k-means
        bo.progress = false;
        const std::string dir = index_dir_for("fail");
        std::unique_ptr<IndexBuilder> builder;
        ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/idx", &builder).ok());
        Status st = builder->Build(v, b.lens, b.ids);
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
        EXPECT_NE(st.message().find("pq_m 7"), std::string::npos) << st.message();
        EXPECT_TRUE(fs::is_empty(dir));
        bo.n_centroids = 100000;  // more centroids than tokens
        bo.pq_m = 0;
        ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/idx", &builder).ok());
        EXPECT_FALSE(builder->Build(v, b.lens, b.ids).ok());
        EXPECT_TRUE(fs::is_empty(dir));
        IndexBuildOptions bad = bo;
        bad.codec = "zip";
        EXPECT_EQ(IndexBuilder::Create(bad, dir + "/idx", &builder).code(), Status::Code::kInvalidArgument);
    }
}

TEST(IndexCpu, OverwriteReplacesOnlyWhenComplete) {
    const int dim = 32;
    const Built b = random_docs(60, dim, 5);
    EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
    IndexBuildOptions bo;
    bo.n_centroids = 8;
    bo.codec = "residual";
    bo.progress = false;
    const std::string path = index_dir_for("ow") + "/idx";
    std::unique_ptr<IndexBuilder> builder;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &builder).ok());
    ASSERT_TRUE(builder->Build(v, b.lens, b.ids).ok());
    EXPECT_EQ(builder->Build(v, b.lens, b.ids).code(), Status::Code::kAlreadyExists);
    bo.overwrite = true;
    bo.residual_nbits = 4;
    ASSERT_TRUE(IndexBuilder::Create(bo, path, &builder).ok());
    std::vector<int64_t> wrong = b.lens;
    wrong[0] += 1;
    EXPECT_FALSE(builder->Build(v, wrong, b.ids).ok());  // failed rebuild: old index intact
    IndexInfo info;
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.residual_nbits, 2);
    ASSERT_TRUE(builder->Build(v, b.lens, b.ids).ok());
    ASSERT_TRUE(ReadIndexInfo(path, &info).ok());
    EXPECT_EQ(info.residual_nbits, 4);
    EXPECT_EQ(std::distance(fs::directory_iterator(fs::path(path).parent_path()), fs::directory_iterator()), 1);
}

bool has_phase(const BuildStats& s, const std::string& name) {
    return std::any_of(s.phase_seconds.begin(), s.phase_seconds.end(), [&](const auto& p) { return p.first == name; });
}

// The index at `path` holds `v` encoded with its model as a fresh Encoder encodes it: every
// token's nearest centroid and code.
void expect_encoded_as_fresh(const std::string& path, const EmbeddingView& v, size_t n_docs) {
    index::IndexData whole;
    ASSERT_TRUE(index::ReadIndex(path, false, false, &whole).ok());
    ASSERT_EQ(whole.info.n_docs, int64_t(n_docs));
    std::unique_ptr<index::Encoder> enc;
    ASSERT_TRUE(index::Encoder::Create(whole.model, Device::kCpu, 0, &enc).ok());
    std::vector<uint32_t> cids(size_t(v.rows));
    std::vector<uint8_t> codes(size_t(v.rows) * whole.model.n_code_bytes);
    ASSERT_TRUE(enc->Encode(v, 0, v.rows, cids.data(), codes.data()).ok());
    EXPECT_TRUE(std::equal(cids.begin(), cids.end(), whole.token_centroids.begin(), whole.token_centroids.end()));
    EXPECT_TRUE(std::equal(codes.begin(), codes.end(), whole.codes.begin(), whole.codes.end()));
}

// centroids_from: a build on another index's centroids (no k-means) keeps them exactly and
// trains its own codec, also over the very index it replaces (--codec auto's ladder), its tokens
// assigned as that index's where it holds the same documents, else anew; a wrong
// dimension, a missing index and n_centroids beside it are refused.
TEST(IndexCpu, BuildReusesAnotherIndexsCentroids) {
    const int dim = 32;
    const Built b = random_docs(80, dim, 9);
    EmbeddingView v{b.tokens.data(), DType::kF16, int64_t(b.tokens.size() / dim), dim};
    IndexBuildOptions bo;
    bo.n_centroids = 16;
    bo.pq_m = 4;
    bo.progress = false;
    const std::string dir = index_dir_for("centroids_from");
    std::unique_ptr<IndexBuilder> builder;
    ASSERT_TRUE(IndexBuilder::Create(bo, dir + "/a", &builder).ok());
    ASSERT_TRUE(builder->Build(v, b.lens, b.ids).ok());
    index::IndexModel a;
    ASSERT_TRUE(index::ReadIndexModel(dir + "/a", &a).ok());
    IndexBuildOptions again = bo;
    again.n_centroids = 0;
    again.pq_m = 8;
    again.seed = 77;  // k-means would move them
    again.centroids_from = dir + "/a";
    again.overwrite = true;
    for (const std::string out : {dir + "/b", dir + "/a"}) {
        SCOPED_TRACE(out);
        ASSERT_TRUE(IndexBuilder::Create(again, out, &builder).ok());
        BuildStats stats;
        const Status st = builder->Build(v, b.lens, b.ids, &stats);
        ASSERT_TRUE(st.ok()) << st.ToString();
        EXPECT_TRUE(has_phase(stats, "known_assignments"));
        EXPECT_FALSE(has_phase(stats, "kmeans.assign"));
        index::IndexModel got;
        ASSERT_TRUE(index::ReadIndexModel(out, &got).ok());
        EXPECT_EQ(got.n_centroids, a.n_centroids);
        EXPECT_EQ(got.centroids, a.centroids);
        EXPECT_EQ(got.pq_m, 8);
        EXPECT_EQ(got.unit_norm, a.unit_norm);
        ASSERT_NO_FATAL_FAILURE(expect_encoded_as_fresh(out, v, b.lens.size()));
    }
    // Other documents on the same centroids: assigned anew, not given the index's assignments.
    const Built other = random_docs(50, dim, 10);
    EmbeddingView ov{other.tokens.data(), DType::kF16, int64_t(other.tokens.size() / dim), dim};
    ASSERT_TRUE(IndexBuilder::Create(again, dir + "/d", &builder).ok());
    BuildStats stats;
    ASSERT_TRUE(builder->Build(ov, other.lens, other.ids, &stats).ok());
    EXPECT_FALSE(has_phase(stats, "known_assignments"));
    ASSERT_NO_FATAL_FAILURE(expect_encoded_as_fresh(dir + "/d", ov, other.lens.size()));
    again.n_centroids = 16;
    EXPECT_EQ(IndexBuilder::Create(again, dir + "/c", &builder).code(), Status::Code::kInvalidArgument);
    again.n_centroids = 0;
    again.centroids_from = dir + "/missing";
    ASSERT_TRUE(IndexBuilder::Create(again, dir + "/c", &builder).ok());
    EXPECT_FALSE(builder->Build(v, b.lens, b.ids).ok());
    const Built wide = random_docs(80, 64, 9);
    EmbeddingView wv{wide.tokens.data(), DType::kF16, int64_t(wide.tokens.size() / 64), 64};
    again.centroids_from = dir + "/a";
    again.pq_m = 4;
    ASSERT_TRUE(IndexBuilder::Create(again, dir + "/c", &builder).ok());
    const Status st = builder->Build(wv, wide.lens, wide.ids);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("dimension 32"), std::string::npos) << st.ToString();
    EXPECT_FALSE(fs::exists(dir + "/c"));
}

}  // namespace
}  // namespace tms

namespace tms {
namespace {

// The engine's own PQ encoder against FAISS's ProductQuantizer on the same codebook.
TEST(IndexCpu, PqEncoderMatchesFaiss) {
    const int dim = 64, n = 3000;
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    std::vector<float> x(size_t(n) * dim);
    for (auto& v : x) v = n01(rng);
    index::IndexModel m;
    m.dim = dim;
    m.codec = "pq";
    m.pq_m = 8;
    m.pq_nbits = 8;
    m.n_code_bytes = 8;
    m.n_centroids = 1;
    m.centroids.assign(dim, 0.0f);  // residual == x
    faiss::ProductQuantizer pq(dim, 8, 8);
    pq.cp.niter = 5;
    pq.train(n, x.data());
    m.codebook = pq.centroids;
    std::vector<uint8_t> ref(size_t(n) * 8), got(size_t(n) * 8);
    pq.compute_codes(x.data(), ref.data(), n);
    std::unique_ptr<index::Encoder> enc;
    ASSERT_TRUE(index::Encoder::Create(m, Device::kCpu, 0, &enc).ok());
    std::vector<uint32_t> cids(n);
    EmbeddingView v{x.data(), DType::kF32, n, dim};
    ASSERT_TRUE(enc->Encode(v, 0, n, cids.data(), got.data()).ok());
    int same = 0;
    double err_ref = 0, err_got = 0;
    for (int t = 0; t < n; ++t)
        for (int s = 0; s < 8; ++s) {
            same += ref[t * 8 + s] == got[t * 8 + s];
            for (int j = 0; j < 8; ++j) {
                const float xv = x[size_t(t) * dim + s * 8 + j];
                const float a = pq.centroids[(size_t(s) * 256 + ref[t * 8 + s]) * 8 + j];
                const float b = pq.centroids[(size_t(s) * 256 + got[t * 8 + s]) * 8 + j];
                err_ref += (xv - a) * (xv - a);
                err_got += (xv - b) * (xv - b);
            }
        }
    EXPECT_GE(same, n * 8 * 99 / 100) << "codes differ beyond near ties";
    EXPECT_LE(err_got, err_ref * (1 + 1e-5));

    // The encoder is the build's input check: a non-finite value is reported with its row
    // (within the view) and column, whatever rows the call covers.
    x[size_t(2345) * dim + 17] = std::numeric_limits<float>::infinity();
    Status st = enc->Encode(v, 2000, 1000, cids.data(), got.data());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message(), "docs: non-finite value (Inf) at row 2345, column 17");
    // So is a finite value fp16 cannot hold (the stored vectors and GPU scores are fp16).
    x[size_t(2345) * dim + 17] = 65520.f;
    st = enc->Encode(v, 2000, 1000, cids.data(), got.data());
    ASSERT_FALSE(st.ok());
    EXPECT_EQ(st.message(),
              "docs: value 65520 beyond fp16's range (|x| <= 65504; the index stores and scores fp16) at row 2345, "
              "column 17");
    x[size_t(2345) * dim + 17] = -65504.f;  // fp16's largest finite magnitude is fine
    EXPECT_TRUE(enc->Encode(v, 2000, 1000, cids.data(), got.data()).ok());
}

}  // namespace
}  // namespace tms

namespace tms {
namespace {

// The sample grows with the centroid count, from a floor, up to the cap and the corpus.
TEST(IndexCpu, TrainSampleFollowsTheCentroidCount) {
    struct Case {
        int64_t n_tokens;
        int centroids, per_centroid;
        int64_t cap, want;
    };
    for (const Case c : {Case{100000000, 32768, 8, 1 << 22, 262144}, Case{100000000, 32768, 64, 1 << 22, 2097152},
                         Case{100000000, 32768, 256, 1 << 22, 1 << 22}, Case{100000000, 32768, 256, 0, 8388608},
                         Case{100000000, 1024, 64, 1 << 22, index::kMinTrainTokens},
                         Case{50000, 4096, 64, 1 << 22, 50000}, Case{100000000, 65536, 8, 20000, 20000}}) {
        IndexBuildOptions o;
        o.train_tokens_per_centroid = c.per_centroid;
        o.max_train_tokens = c.cap;
        EXPECT_EQ(index::TrainSampleTokens(c.n_tokens, c.centroids, o), c.want)
            << c.n_tokens << " tokens, " << c.centroids << " centroids, " << c.per_centroid << " a centroid, cap "
            << c.cap;
    }
}

// The residual codec trains on a sample of its own: its cutoffs split the residuals of the
// corpus (not of the k-means sample, which the centroids were fitted to and sit closer to) into
// equal quarters, and each bucket decodes to the mean of the corpus residuals in it. 32 sampled
// tokens a centroid in 32 dimensions, where the two residual distributions differ the most.
TEST(IndexCpu, ResidualBucketsFitTheCorpusResiduals) {
    const int dim = 32, n_centroids = 1024;
    const int64_t n_tokens = 200000;
    std::mt19937 rng(11);
    std::normal_distribution<float> n01;
    std::vector<float> x(size_t(n_tokens) * dim);
    for (float& v : x) v = n01(rng);
    for (int64_t r = 0; r < n_tokens; ++r) {  // unit rows, as ColBERT tokens
        float ss = 0;
        for (int j = 0; j < dim; ++j) ss += x[r * dim + j] * x[r * dim + j];
        for (int j = 0; j < dim; ++j) x[r * dim + j] /= std::sqrt(ss);
    }
    IndexBuildOptions bo;
    bo.codec = "residual";
    bo.residual_nbits = 2;
    bo.n_centroids = n_centroids;
    bo.max_train_tokens = 32 * n_centroids;
    bo.device = Device::kCpu;
    bo.progress = false;
    const std::vector<EmbeddingView> shards{EmbeddingView{x.data(), DType::kF32, n_tokens, dim}};
    index::IndexModel m;
    std::vector<std::pair<std::string, double>> phases;
    ASSERT_TRUE(index::TrainModel(shards, bo, &m, &phases).ok());
    ASSERT_EQ(m.residual_cutoffs.size(), 3u);
    ASSERT_EQ(m.residual_weights.size(), 4u);
    // The residual values of the first 20,000 tokens (i.i.d. like the rest), by bucket.
    const int64_t n_eval = 20000;
    std::vector<uint32_t> nearest(n_eval);
    ASSERT_TRUE(kernels::nearest_ref({.x = x.data(),
                                      .n = n_eval,
                                      .dim = dim,
                                      .centroids = m.centroids.data(),
                                      .n_centroids = n_centroids,
                                      .labels = nearest.data()})
                    .ok());
    std::array<int64_t, 4> count{};
    std::array<double, 4> sum{};
    for (int64_t r = 0; r < n_eval; ++r) {
        for (int j = 0; j < dim; ++j) {
            const float v = x[r * dim + j] - m.centroids[size_t(nearest[r]) * dim + j];
            const int b = int(std::upper_bound(m.residual_cutoffs.begin(), m.residual_cutoffs.end(), v) -
                              m.residual_cutoffs.begin());
            ++count[b];
            sum[b] += v;
        }
    }
    const double total = double(count[0] + count[1] + count[2] + count[3]);
    for (int b = 0; b < 4; ++b) {
        SCOPED_TRACE("bucket " + std::to_string(b));
        EXPECT_NEAR(count[b] / total, 0.25, 0.01);
        EXPECT_NEAR(m.residual_weights[b], sum[b] / count[b], 0.03 * std::abs(sum[b] / count[b]));
    }
}

// The training sample: distinct rows in increasing order, the requested count, deterministic
// in the seed, spread over the whole range (both the direct draw and the complement path).
TEST(IndexCpu, SortedSampleIsUniformAndSorted) {
    for (const auto [n, k] :
         {std::pair<int64_t, int64_t>{1000000, 5000}, {10000, 9000}, {100, 100}, {50, 80}, {7, 0}}) {
        SCOPED_TRACE(std::to_string(n) + " choose " + std::to_string(k));
        const std::vector<int64_t> s = index::SortedSample(n, k, 42);
        ASSERT_EQ(int64_t(s.size()), std::min(n, k));
        for (size_t i = 0; i < s.size(); ++i) {
            ASSERT_GE(s[i], 0);
            ASSERT_LT(s[i], n);
            if (i) ASSERT_LT(s[i - 1], s[i]) << "not strictly increasing at " << i;
        }
        EXPECT_EQ(s, index::SortedSample(n, k, 42));
        if (k >= 1000 && k < n) {
            EXPECT_NE(s, index::SortedSample(n, k, 43));
            // Each tenth of [0, n) holds about a tenth of the sample.
            std::vector<int> bins(10, 0);
            for (int64_t v : s) ++bins[size_t(v * 10 / n)];
            for (int b : bins) EXPECT_NEAR(double(b) / double(s.size()), 0.1, 0.03);
        }
    }
}

TEST(IndexCpu, ChunkChecksumIsCrc32c) {
    // The standard check value of CRC-32C, and a long buffer through both paths' tail handling.
    EXPECT_EQ(index::Crc32("123456789", 9), 0xE3069283u);
    std::vector<uint8_t> buf(1000);
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7);
    const uint32_t whole = index::Crc32(buf.data(), buf.size());
    buf[500] ^= 1;
    EXPECT_NE(index::Crc32(buf.data(), buf.size()), whole);
}

}  // namespace
}  // namespace tms

namespace tms {
namespace {

TEST(Shards, CountFollowsTheTokens) {
    EXPECT_EQ(index::ResolveShardCount(0, 1), 1);
    EXPECT_EQ(index::ResolveShardCount(0, kTokensPerShard), 1);
    EXPECT_EQ(index::ResolveShardCount(0, kTokensPerShard + 1), 2);
    EXPECT_EQ(index::ResolveShardCount(0, int64_t(1) << 62), kMaxShards);
    EXPECT_EQ(index::ResolveShardCount(5, 10), 5);  // asked for: as asked
}

TEST(Shards, SplitBalancesTokensAndKeepsEveryShardNonEmpty) {
    std::vector<int64_t> lens;
    for (int i = 0; i < 1000; ++i) lens.push_back(1 + (i * 37) % 200);
    const int64_t total = std::accumulate(lens.begin(), lens.end(), int64_t(0));
    for (int n : {1, 2, 3, 7, 64}) {
        const std::vector<int64_t> s = index::SplitShards(lens, n);
        ASSERT_EQ(s.size(), size_t(n));
        int64_t doc = 0;
        for (int64_t c : s) {
            ASSERT_GE(c, 1);
            int64_t tok = 0;
            for (int64_t i = doc; i < doc + c; ++i) tok += lens[i];
            EXPECT_NEAR(double(tok), double(total) / n, 200.0 + double(total) / n * 0.02) << n;
            doc += c;
        }
        EXPECT_EQ(doc, int64_t(lens.size()));
    }
    // Fewer documents than shards: one document a shard.
    EXPECT_EQ(index::SplitShards({5, 6}, 4), (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(index::SplitShards({1000, 1, 1, 1}, 2), (std::vector<int64_t>{1, 3}));
}

}  // namespace
}  // namespace tms
