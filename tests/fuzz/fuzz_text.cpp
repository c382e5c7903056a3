// Copyright TileMaxSim authors. The text inputs: id files (one per line), TREC runs, TREC and
// BEIR qrels, and an evaluation of whatever run and qrels parse.
#include "tests/fuzz/fuzz_input.h"
#include "tools/lib/eval.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tms::fuzz::AsFile(data, size, "x.txt");
    std::vector<std::string> lines;
    (void)tms::ReadLines(path, &lines);
    tms::Run run;
    tms::Qrels qrels;
    const bool r = tms::ReadRun(path, &run).ok();
    const bool q = tms::ReadQrels(path, &qrels).ok();
    if (r && q) {
        tms::EvalResult e;
        (void)tms::Evaluate(run, qrels, &e);
    }
    return 0;
}
