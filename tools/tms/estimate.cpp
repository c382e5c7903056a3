// Copyright TileMaxSim authors. `tms estimate`: measure an index's recall curve (the settings --target-recall
// takes).
#include "tools/tms/common.h"

#include "tools/tms/query.h"

namespace tms::cli {

Command AddEstimate(CLI::App& app) {
    struct State {
        std::string est_path, est_device = "auto";
        tms::EstimateOptions est_o;
        std::string est_sample, est_docs, est_doclens;
    };
    auto s = std::make_shared<State>();
    auto& est_path = s->est_path;
    auto& est_device = s->est_device;
    auto& est_o = s->est_o;
    auto& est_sample = s->est_sample;
    auto* est = app.add_subcommand("estimate",
                                   "Measure an index's recall@10 against exhaustive search on pseudo-queries (token "
                                   "sets of its documents, perturbed), at the default and deeper settings; searches "
                                   "take their parameters for --target-recall from it");
    est->add_option("--index", est_path,
                    "Index directory (built with --keep-vectors, or give the documents it was built from)")
        ->required();
    auto* docs_opt = est->add_option("--docs", s->est_docs,
                                     "For an index without stored vectors: the .npy of the documents it was built "
                                     "from (the truth, and the pseudo-queries' tokens)")
                         ->check(CLI::ExistingFile);
    est->add_option("--doclens", s->est_doclens, "With --docs: their lengths (.npy)")
        ->check(CLI::ExistingFile)
        ->needs(docs_opt);
    docs_opt->needs("--doclens");
    est->add_option("--queries", est_o.queries, "Pseudo-queries (0: 256 on a GPU, 64 on the CPU)")
        ->capture_default_str()
        ->check(CLI::Range(0, 100000));
    est->add_option("--device", est_device, "Where the searches run: auto, cpu or gpu")->capture_default_str();
    est->add_option("--noise", est_o.noise,
                    "Norm of the Gaussian noise added to each pseudo-query token (unit vectors) before renormalising")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10.0));
    est->add_option("--seed", est_o.seed, "Seed of the documents and tokens drawn")->capture_default_str();
    est->add_option("--content-tokens", est_o.content_tokens,
                    "Pseudo-queries of a span of N of a document's tokens, padded with copies of one vector that "
                    "the corpus matches weakly (as ColBERT's [MASK]s; 11 fits MiniLM-encoded queries); 0: tokens drawn "
                    "across the document, no padding")
        ->capture_default_str()
        ->check(CLI::Range(0, 1000));
    est->add_option("--pad-noise", est_o.pad_noise,
                    "Norm of the Gaussian noise that moves a random corpus token to make the padding vector")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 10.0));
    est->add_option("--mix", est_o.mix,
                    "Share of each pseudo-query's tokens drawn from other random documents (with --content-tokens 0)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    est->add_option("--sample", est_sample,
                    "Measure these queries of your own (.npy [n, tokens, dim], e.g. a sample of real ones) instead "
                    "of pseudo-queries")
        ->check(CLI::ExistingFile);
    auto run = [s]() -> int {
        auto& est_path = s->est_path;
        auto& est_device = s->est_device;
        auto& est_o = s->est_o;
        auto& est_sample = s->est_sample;
        tms::Status st = parse_device(est_device, &est_o.device);
        EstimateSample sample;
        if (st.ok()) st = load_estimate_sample(est_sample, &sample, &est_o);
        EstimateInput input;
        if (st.ok()) st = load_estimate_input(s->est_docs, s->est_doclens, &input, &est_o);
        if (st.ok()) st = estimate_index("tms estimate", est_path, est_o);
        return st.ok() ? 0 : fail("estimate", st);
    };
    return {est, run};
}

}  // namespace tms::cli
