// Copyright TileMaxSim authors. Per-query certification on the CPU (tests/engine/certify.h).
#include "tests/engine/certify.h"

namespace tms {
namespace {

TEST(CertifyCpu, CertifiedQueriesHaveTheExhaustiveTopK) { testing::ExpectCertifiedQueriesExact(Device::kCpu); }

}  // namespace
}  // namespace tms
