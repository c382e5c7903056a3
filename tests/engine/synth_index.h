// Copyright TileMaxSim authors. A synthetic corpus and its index in a fresh temporary
// directory, for the engine tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

/// Writes the corpus of `so` into TempDir()/NAME_PID (removed first) and builds DIR/index from it
/// with `bo`; the queries are DIR/queries.npy. Fails the test on any error.
inline std::filesystem::path BuildSynthIndex(const std::string& name, const SynthOptions& so,
                                             const IndexBuildOptions& bo) {
    namespace fs = std::filesystem;
    const fs::path dir = fs::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    EXPECT_TRUE(WriteSynthCorpus(so, dir.string()).ok());
    std::unique_ptr<IndexBuilder> b;
    EXPECT_TRUE(IndexBuilder::Create(bo, (dir / "index").string(), &b).ok());
    if (!b) return dir;
    const Status st = b->BuildFromFiles((dir / "docs.npy").string(), (dir / "doclens.npy").string(), "");
    EXPECT_TRUE(st.ok()) << st.ToString();
    return dir;
}

}  // namespace tms::testing
