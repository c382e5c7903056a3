// Copyright TileMaxSim authors. safetensors input of `tms index` (header JSON, tensor shapes,
// offsets, dtypes, document lengths); an input that parses is indexed (small: a few tokens).
#include <filesystem>

#include "tests/fuzz/fuzz_input.h"
#include "tilemaxsim/index_builder.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tms::fuzz::AsFile(data, size, "x.safetensors");
    tms::IndexBuildOptions o;
    o.progress = false;
    o.threads = 1;
    o.device = tms::Device::kCpu;
    const std::string out = path + ".index";
    std::unique_ptr<tms::IndexBuilder> b;
    if (tms::IndexBuilder::Create(o, out, &b).ok()) (void)b->BuildFromFiles(path, "", "");
    std::error_code ec;
    std::filesystem::remove_all(out, ec);
    return 0;
}
