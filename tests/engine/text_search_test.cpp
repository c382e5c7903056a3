// Copyright TileMaxSim authors. BM25 and hybrid search on the CPU (tests/engine/text_search.h).
#include "tests/engine/text_search.h"

namespace tms {
namespace {

TEST(TextSearchCpu, ModesAgree) { testing::ExpectTextSearchAgrees(Device::kCpu); }

}  // namespace
}  // namespace tms
