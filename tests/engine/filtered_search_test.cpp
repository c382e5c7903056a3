// Copyright TileMaxSim authors. Filtered search on the CPU (tests/engine/filtered_search.h).
#include "tests/engine/filtered_search.h"

namespace tms {
namespace {

TEST(FilteredSearchCpu, RecallWithinTheFilterAgainstExhaustive) {
    testing::ExpectFilteredSearchRecall(Device::kCpu, 1);
}

TEST(FilteredSearchCpu, ThreeShardsRecallWithinTheFilterAgainstExhaustive) {
    testing::ExpectFilteredSearchRecall(Device::kCpu, 3);
}

}  // namespace
}  // namespace tms
