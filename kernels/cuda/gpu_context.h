// Copyright TileMaxSim authors. One GPU's resources, created once per device by whoever uses it
// (a Searcher, an index build) and passed to everything that runs there, as FAISS's
// GpuResources: the device ordinal, a stream and a second one for overlapping copies, a cuBLAS
// handle bound to the first, pinned staging buffers for per-call inputs, and scratch arenas
// shared by every object on the device. Host header: no CUDA includes (cudaStream_t is
// CUstream_st*, cublasHandle_t cublasContext*).
#pragma once

#include <memory>
#include <mutex>
#include <typeindex>
#include <unordered_map>

#include "tilemaxsim/status.h"

struct CUstream_st;
struct cublasContext;

namespace tms::kernels {

class StagedUploader;

/// Thread-safety: the stream, the handle, the staging buffers and the scratch arenas serve one
/// caller at a time; a caller holds mutex() for a whole sequence of calls on the device (the
/// scratch of one call is the input of the next, e.g. candidate lists, then their scores).
class GpuContext {
public:
    /// The context of CUDA device `device`: NotSupported naming it when it is not present.
    static Status Create(int device, std::shared_ptr<GpuContext>* out);
    ~GpuContext();
    GpuContext(const GpuContext&) = delete;
    GpuContext& operator=(const GpuContext&) = delete;

    int device() const { return device_; }
    CUstream_st* stream() const { return stream_; }
    /// A second stream, for host-to-device copies that overlap the work on stream() (the next
    /// rows of a streamed exhaustive search while the current ones are scored).
    CUstream_st* copy_stream() const { return copy_stream_; }
    /// cuBLAS, on stream(), TF32 tensor-op math allowed where a call asks for it.
    cublasContext* blas() const { return blas_; }
    /// Two pinned 1 MB stages for per-call inputs (kernels::MakeQueryUploader).
    StagedUploader& inputs() { return *inputs_; }
    std::mutex& mutex() { return mu_; }

    /// The one T of this device (default-constructed on first use, destroyed with the context,
    /// with the device current): the scratch arenas that every object of one kind on the device
    /// shares, so that N shards on a GPU hold one set of per-batch buffers, not N.
    template <class T>
    T& Scratch() {
        std::lock_guard<std::mutex> g(scratch_mu_);
        auto& p = scratch_[std::type_index(typeid(T))];
        if (!p) p = std::make_unique<Holder<T>>();
        return static_cast<Holder<T>&>(*p).value;
    }

private:
    GpuContext() = default;
    struct HolderBase {
        virtual ~HolderBase() = default;
    };
    template <class T>
    struct Holder final : HolderBase {
        T value;
    };
    int device_ = -1;
    CUstream_st* stream_ = nullptr;
    CUstream_st* copy_stream_ = nullptr;
    cublasContext* blas_ = nullptr;
    std::unique_ptr<StagedUploader> inputs_;
    std::mutex mu_, scratch_mu_;
    std::unordered_map<std::type_index, std::unique_ptr<HolderBase>> scratch_;
};

}  // namespace tms::kernels
