// Copyright TileMaxSim authors. Status and small value-type helpers of the public API.
// Lives in the lowest module so that every module (and the kernels' tests) can use it.
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"
#include "tilemaxsim/version.h"

namespace tms {

const char* StatusCodeName(Status::Code code) {
    switch (code) {
        case Status::Code::kOk: return "OK";
        case Status::Code::kInvalidArgument: return "InvalidArgument";
        case Status::Code::kNotFound: return "NotFound";
        case Status::Code::kNotSupported: return "NotSupported";
        case Status::Code::kIOError: return "IOError";
        case Status::Code::kCorruption: return "Corruption";
        case Status::Code::kResourceExhausted: return "ResourceExhausted";
        case Status::Code::kAlreadyExists: return "AlreadyExists";
        case Status::Code::kInternal: return "Internal";
        case Status::Code::kCancelled: return "Cancelled";
    }
    return "Unknown";
}

std::string Status::ToString() const {
    if (ok()) return "OK";
    return std::string(StatusCodeName(code_)) + ": " + msg_;
}

const char* DTypeName(DType t) {
    switch (t) {
        case DType::kF32: return "float32";
        case DType::kF16: return "float16";
        case DType::kBF16: return "bfloat16";
    }
    return "unknown";
}

const char* DeviceName(Device d) {
    switch (d) {
        case Device::kAuto: return "auto";
        case Device::kCpu: return "cpu";
        case Device::kGpu: return "gpu";
    }
    return "unknown";
}

const char* VectorTierName(VectorTier t) {
    switch (t) {
        case VectorTier::kAuto: return "auto";
        case VectorTier::kGpu: return "gpu";
        case VectorTier::kHost: return "host";
        case VectorTier::kDisk: return "disk";
        case VectorTier::kNone: return "none";
    }
    return "unknown";
}

const char* PruningName(Pruning p) { return p == Pruning::kProbe ? "probe" : "interaction"; }

const char* SearchModeName(SearchMode m) {
    return m == SearchMode::kBm25 ? "bm25" : m == SearchMode::kHybrid ? "hybrid" : "maxsim";
}

const char* FusionName(Fusion f) { return f == Fusion::kWeighted ? "weighted" : "rrf"; }

const char* MetaTypeName(MetaType t) {
    switch (t) {
        case MetaType::kInteger: return "integer";
        case MetaType::kReal: return "real";
        case MetaType::kText: return "text";
    }
    return "unknown";
}

#define TMS_STRINGIFY_(x) #x
#define TMS_STRINGIFY(x) TMS_STRINGIFY_(x)
const char* VersionString() {
    return TMS_STRINGIFY(TMS_VERSION_MAJOR) "." TMS_STRINGIFY(TMS_VERSION_MINOR) "." TMS_STRINGIFY(TMS_VERSION_PATCH);
}

}  // namespace tms
