// Copyright TileMaxSim authors. A synthetic corpus and its index in a fresh temporary
// directory, for the engine tests.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tests/scratch_dir.h"
#include "tools/lib/synth.h"
#include "tilemaxsim/tilemaxsim.h"

namespace tms::testing {

/// Writes the corpus of `so` into ScratchDir(NAME) and builds DIR/index from it with `bo`; the
/// queries are DIR/queries.npy. Fails the test on any error.
inline std::filesystem::path BuildSynthIndex(const std::string& name, const SynthOptions& so,
                                             const IndexBuildOptions& bo) {
    namespace fs = std::filesystem;
    const fs::path dir = ScratchDir(name);
    EXPECT_TRUE(WriteSynthCorpus(so, dir.string()).ok());
    std::unique_ptr<IndexBuilder> b;
    EXPECT_TRUE(IndexBuilder::Create(bo, (dir / "index").string(), &b).ok());
    if (!b) return dir;
    const Status st = b->BuildFromFiles((dir / "docs.npy").string(), (dir / "doclens.npy").string(), "");
    EXPECT_TRUE(st.ok()) << st.ToString();
    return dir;
}

/// Every approximate setting a cut across segments must reproduce: the default, and, under both
/// prunings with nprobe 2, deep cuts: (ncandidates, rerank), no rerank, no pruning, and a
/// third of the candidates with a quarter of the rerank.
inline std::vector<SearchOptions> CutSettings(int ncandidates, int rerank) {
    std::vector<SearchOptions> out(1);
    for (const Pruning pr : {Pruning::kProbe, Pruning::kInteraction}) {
        for (const auto& [nc, rr] : {std::pair{ncandidates, rerank}, std::pair{ncandidates, 0}, std::pair{0, rerank},
                                     std::pair{ncandidates / 3, rerank / 4}}) {
            SearchOptions o;
            o.nprobe = 2;
            o.pruning = pr;
            o.ncandidates = nc;
            o.rerank = rr;
            out.push_back(o);
        }
    }
    return out;
}

}  // namespace tms::testing
