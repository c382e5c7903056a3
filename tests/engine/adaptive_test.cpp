// Copyright TileMaxSim authors. The adaptive default search on the CPU (tests/engine/adaptive.h).
#include "tests/engine/adaptive.h"

namespace tms {
namespace {

TEST(AdaptiveCpu, UnsettledQueriesGoDeeper) { testing::ExpectUnsettledQueriesGoDeeper(Device::kCpu); }

}  // namespace
}  // namespace tms
