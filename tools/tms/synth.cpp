// Copyright TileMaxSim authors. `tms synth`: a synthetic ColBERT-like corpus (docs, queries, qrels).
#include "tools/tms/common.h"
#include "base/log.h"
#include "base/progress.h"

namespace tms::cli {

Command AddSynth(CLI::App& app) {
    struct State {
        tms::SynthOptions so;
        std::string synth_out;
    };
    auto s = std::make_shared<State>();
    auto& so = s->so;
    auto& synth_out = s->synth_out;
    auto* synth = app.add_subcommand("synth", "Write a synthetic ColBERT-like corpus (docs, queries, qrels)");
    synth->add_option("--out", synth_out, "Output directory")->required();
    synth->add_option("--docs", so.n_docs, "Documents")->capture_default_str();
    synth->add_option("--queries", so.n_queries, "Queries")->capture_default_str();
    synth->add_option("--dim", so.dim, "Embedding dimension (32-1024)")->capture_default_str();
    synth->add_option("--seed", so.seed, "Random seed")->capture_default_str();
    synth->add_option("--min-doc-len", so.min_doc_len, "Shortest document (tokens)")->capture_default_str();
    synth->add_option("--max-doc-len", so.max_doc_len, "Longest document (tokens)")->capture_default_str();
    auto run = [s]() -> int {
        auto& so = s->so;
        auto& synth_out = s->synth_out;
        const auto t0 = Clock::now();
        tms::Status st = tms::CheckOutputPath(synth_out, tms::OutputKind::kDirectory).WithContext("--out");
        if (st.ok()) st = tms::WriteSynthCorpus(so, synth_out);
        if (!st.ok()) return fail("synth", st);
        tms::LogInfo("tms synth: %lld documents, %d queries, dim %d in %.2f s -> %s\n", (long long)so.n_docs,
                     so.n_queries, so.dim, tms::SecondsSince(t0), synth_out.c_str());
        return 0;
    };
    return {synth, run};
}

}  // namespace tms::cli
