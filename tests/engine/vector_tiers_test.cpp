// Copyright TileMaxSim authors. Vector tiers on the CPU (tests/engine/vector_tiers.h), and the
// choice of a tier.
#include "tests/engine/vector_tiers.h"

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/memory.h"

namespace tms {
namespace {

TEST(VectorTiersCpu, DiskGivesTheHostsResults) {
    testing::ExpectTiersAgree(Device::kCpu, VectorTier::kHost, {VectorTier::kDisk});
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
    fs::remove_all(dir);
    fs::remove_all(dir2);
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
    fs::remove_all(dir);
}

}  // namespace
}  // namespace tms
