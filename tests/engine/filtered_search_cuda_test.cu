// Copyright TileMaxSim authors. Filtered search on the GPU: the allowed documents' bitmap on the
// device, inside candidate generation (tests/engine/filtered_search.h).
#include "tests/engine/filtered_search.h"
#include "tests/kernels/cuda_test_util.h"

namespace tms {
namespace {

TEST(FilteredSearchCuda, RecallWithinTheFilterAgainstExhaustive) {
    SKIP_WITHOUT_GPU();
    testing::ExpectFilteredSearchRecall(Device::kGpu, 1);
}

TEST(FilteredSearchCuda, ThreeShardsRecallWithinTheFilterAgainstExhaustive) {
    SKIP_WITHOUT_GPU();
    testing::ExpectFilteredSearchRecall(Device::kGpu, 3);
}

}  // namespace
}  // namespace tms
