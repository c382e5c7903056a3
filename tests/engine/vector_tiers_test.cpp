// Copyright TileMaxSim authors. Vector tiers on the CPU (tests/engine/vector_tiers.h), and the
// choice of a tier.
#include "tests/engine/vector_tiers.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/memory.h"
#include "engine/vector_rows.h"
#include "index/index_data.h"
#include "index/store/index_reader.h"

namespace tms {
namespace {

TEST(VectorTiersCpu, DiskGivesTheHostsResults) {
    testing::ExpectTiersAgree(Device::kCpu, VectorTier::kHost, {VectorTier::kDisk});
}

// The GPU tier's open reads every row once in pieces (the files' chunks), checksumming as it
// reads: the rows equal the stores' vectors read whole, and a damaged chunk fails the read of
// its last rows, naming the file, and every later read of it.
TEST(VectorTiersCpu, PiecesReadEveryRowOnceAndCheckIt) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 400;
    so.n_queries = 2;
    so.dim = 32;
    IndexBuildOptions bo;
    bo.keep_vectors = true;
    bo.progress = false;
    bo.shards = 2;
    bo.chunk_docs = 50;
    const fs::path dir = testing::BuildSynthIndex("tms_tiers_pieces", so, bo);
    const std::string path = (dir / "index").string();
    std::vector<index::IndexData> mem, files;
    ASSERT_TRUE(index::ReadIndexShards(path, index::VectorLoad::kMemory, false, &mem).ok());
    const auto rows_of = [&](const std::string& p, engine::VectorRows* rows) {
        ASSERT_TRUE(index::ReadIndexShards(p, index::VectorLoad::kFileOrMemory, false, &files).ok());
        rows->dim = so.dim;
        int64_t t0 = 0;
        for (const index::IndexData& d : files) {
            ASSERT_TRUE(d.vectors.empty());
            ASSERT_EQ(d.vector_files.size(), 1u);
            rows->AddFile({t0 + d.vector_files[0].token0, d.vector_files[0].file});
            t0 += d.info.n_tokens;
        }
    };
    std::vector<uint16_t> want;
    for (const index::IndexData& d : mem) want.insert(want.end(), d.vectors.begin(), d.vectors.end());
    engine::VectorRows rows;
    rows_of(path, &rows);
    const std::vector<int64_t> pieces = rows.Pieces(1000);
    ASSERT_EQ(pieces.front(), 0);
    ASSERT_EQ(pieces.back(), int64_t(want.size()) / so.dim);
    EXPECT_GE(pieces.size(), 9u);  // 2 shards of at least 4 chunks
    std::vector<uint16_t> got(want.size());
    for (size_t i = 0; i + 1 < pieces.size(); ++i) {
        uint32_t crc = 0;
        for (int64_t t = pieces[i]; t < pieces[i + 1]; t += 7) {
            const int64_t n = std::min<int64_t>(7, pieces[i + 1] - t);
            ASSERT_TRUE(rows.ReadInPiece(t, n, got.data() + size_t(t) * so.dim, &crc).ok()) << t;
        }
    }
    EXPECT_EQ(got, want);
    uint32_t crc = 0;
    EXPECT_EQ(rows.ReadInPiece(pieces[1] - 1, 2, got.data(), &crc).code(), Status::Code::kInvalidArgument);  // 2 chunks

    // Damage the second chunk of the first shard's file.
    const fs::path vf = files[0].vector_files[0].file->path();
    {
        std::fstream f(vf, std::ios::in | std::ios::out | std::ios::binary);
        f.seekp(std::streamoff(pieces[1] + 3) * so.dim * 2);
        f.put(char(0x5a));
    }
    engine::VectorRows damaged;
    rows_of(path, &damaged);
    crc = 0;
    ASSERT_TRUE(damaged.ReadInPiece(pieces[1], 10, got.data(), &crc).ok());  // not yet the chunk's end
    const Status st = damaged.ReadInPiece(pieces[1] + 10, pieces[2] - pieces[1] - 10, got.data(), &crc);
    EXPECT_EQ(st.code(), Status::Code::kCorruption) << st.ToString();
    EXPECT_NE(st.message().find(vf.string()), std::string::npos) << st.ToString();
    EXPECT_EQ(damaged.Range(pieces[1], 1, got.data()).code(), Status::Code::kCorruption);  // and later reads
    crc = 0;
    EXPECT_TRUE(damaged.ReadInPiece(pieces[0], pieces[1], got.data(), &crc).ok());  // the chunk before is good
}

TEST(VectorTiersCpu, ChoiceAndRefusals) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 300;
    so.n_queries = 4;
    so.dim = 32;
    IndexBuildOptions bo;
    bo.progress = false;
    const fs::path dir = testing::BuildSynthIndex("tms_tiers_choice", so, bo);  // no vectors
    const std::string path = (dir / "index").string();
    SearcherOptions o;
    o.device = Device::kCpu;
    o.progress = false;
    std::unique_ptr<Searcher> s;
    ASSERT_TRUE(Searcher::Open(o, path, &s).ok());  // auto: none, without vectors
    EXPECT_EQ(s->placement()[0].vectors, VectorTier::kNone);
    EXPECT_EQ(s->placement()[0].vector_bytes, 0);
    for (VectorTier t : {VectorTier::kGpu, VectorTier::kHost, VectorTier::kDisk}) {
        o.vectors = t;
        const Status st = Searcher::Open(o, path, &s);
        EXPECT_EQ(st.code(), Status::Code::kNotSupported) << VectorTierName(t) << ": " << st.ToString();
        EXPECT_NE(st.message().find("--keep-vectors"), std::string::npos) << st.ToString();
    }
    o.vectors = VectorTier::kNone;
    EXPECT_TRUE(Searcher::Open(o, path, &s).ok());
    o.stream_bytes = 0;
    EXPECT_EQ(Searcher::Open(o, path, &s).code(), Status::Code::kInvalidArgument);

    VectorTier t;
    for (const char* w : {"auto", "gpu", "host", "disk", "none"}) {
        ASSERT_TRUE(ParseVectorTier(w, &t).ok()) << w;
        EXPECT_STREQ(VectorTierName(t), w);
    }
    const Status bad = ParseVectorTier("ram", &t);
    EXPECT_EQ(bad.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(bad.message().find("auto, gpu, host, disk or none"), std::string::npos) << bad.ToString();

    // With vectors: a CPU searcher asked for kGpu keeps them in host memory; auto picks host.
    bo.keep_vectors = true;
    const fs::path dir2 = testing::BuildSynthIndex("tms_tiers_choice_v", so, bo);
    for (VectorTier want : {VectorTier::kAuto, VectorTier::kGpu}) {
        SearcherOptions o2;
        o2.device = Device::kCpu;
        o2.progress = false;
        o2.vectors = want;
        ASSERT_TRUE(Searcher::Open(o2, (dir2 / "index").string(), &s).ok());
        EXPECT_EQ(s->placement()[0].vectors, VectorTier::kHost) << VectorTierName(want);
        EXPECT_EQ(s->placement()[0].vector_bytes, s->info().n_tokens * 32 * 2);
    }
}

// Under an address-space limit (ulimit -v) the room the limit leaves is all the host has:
// --vectors host is refused with the tier that would hold them, and auto picks the disk.
TEST(VectorTiersCpu, AddressSpaceLimitIsAvailableMemory) {
    namespace fs = std::filesystem;
    SynthOptions so;
    so.n_docs = 2000;  // 28 MB of vectors
    so.n_queries = 4;
    IndexBuildOptions bo;
    bo.progress = false;
    bo.keep_vectors = true;
    bo.n_centroids = 64;
    const fs::path dir = testing::BuildSynthIndex("tms_tiers_rlimit", so, bo);
    const std::string path = (dir / "index").string();
    SearcherOptions o;
    o.device = Device::kCpu;
    o.progress = false;
    o.vectors = VectorTier::kAuto;
    VectorTier t;
    ASSERT_TRUE(ResolveVectorTier(o, path, &t).ok());  // libraries and RocksDB's threads set up
    EXPECT_EQ(t, VectorTier::kHost);
    // The child's exit code: 0 passed, else the number of the check that failed.
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
        const int64_t mapped = MappedBytes();
        if (mapped < 0) ::_exit(10);
        const int64_t room = int64_t(12) << 20;
        const struct rlimit lim = {rlim_t(mapped + room), rlim_t(mapped + room)};
        if (::setrlimit(RLIMIT_AS, &lim) != 0) ::_exit(11);
        if (HostAvailableMemory() > room) ::_exit(1);
        VectorTier c;
        if (!ResolveVectorTier(o, path, &c).ok() || c != VectorTier::kDisk) ::_exit(2);
        SearcherOptions h = o;
        h.vectors = VectorTier::kHost;
        const Status st = ResolveVectorTier(h, path, &c);
        if (st.code() != Status::Code::kResourceExhausted) ::_exit(3);
        if (st.message().find("--vectors disk") == std::string::npos) ::_exit(4);
        ::_exit(0);
    }
    int wstatus = 0;
    ASSERT_EQ(::waitpid(pid, &wstatus, 0), pid);
    ASSERT_TRUE(WIFEXITED(wstatus)) << "child ended by signal " << WTERMSIG(wstatus);
    EXPECT_EQ(WEXITSTATUS(wstatus), 0) << "check " << WEXITSTATUS(wstatus) << " failed in the limited child";
}

}  // namespace
}  // namespace tms
