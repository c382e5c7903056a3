// Copyright TileMaxSim authors. .npy: header, dtype, shape, payload size; as embeddings
// (rank 2 and 3) and as document lengths.
#include "tests/fuzz/fuzz_input.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tms::fuzz::AsFile(data, size, "x.npy");
    tms::HostArray a;
    if (tms::LoadNpy(path, &a).ok()) {
        tms::EmbeddingView v;
        (void)tms::EmbeddingsFromArray(a, 2, path, &v);
        (void)tms::EmbeddingsFromArray(a, 3, path, &v);
        std::vector<int64_t> ints;
        (void)tms::IntegersFromArray(a, path, &ints);
    }
    return 0;
}
