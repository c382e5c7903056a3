// Copyright TileMaxSim authors. Shared helpers of the kernel module: validation, number formats.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <omp.h>
#include <string>

#include "kernels/candidates.h"
#include "kernels/maxsim.h"
#include "kernels/threads.h"
#include "tilemaxsim/options.h"

// Weak: absent when the BLAS is not OpenBLAS.
extern "C" void openblas_set_num_threads(int) __attribute__((weak));

namespace tms::kernels {

float half_to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else {  // subnormal: normalise
            exp = 127 - 15 + 1;
            while ((mant & 0x400u) == 0) {
                mant <<= 1;
                --exp;
            }
            mant &= 0x3ffu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    return std::bit_cast<float>(bits);
}

uint16_t float_to_half(float f) {
    const uint32_t x = std::bit_cast<uint32_t>(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) {  // Inf or NaN
        return static_cast<uint16_t>(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    }
    if (absx >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> Inf
    if (absx < 0x38800000u) {                                               // subnormal or zero in half
        if (absx < 0x33000000u) return static_cast<uint16_t>(sign);
        const uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e;  // 14 + (113 - e) - 1 ... yields the half mantissa
        const uint32_t half_m = m >> (shift);
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t halfway = 1u << (shift - 1);
        uint32_t r = half_m;
        if (rem > halfway || (rem == halfway && (half_m & 1u))) ++r;
        return static_cast<uint16_t>(sign | r);
    }
    uint32_t r = absx - 0x38000000u;  // rebias exponent
    const uint32_t rem = r & 0x1fffu;
    r >>= 13;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
}

float bf16_to_float(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

uint16_t float_to_bf16(float f) {
    uint32_t x = std::bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
    x += 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>(x >> 16);
}

float load_as_float(const void* data, DType t, int64_t i) {
    switch (t) {
        case DType::kF32: return static_cast<const float*>(data)[i];
        case DType::kF16: return half_to_float(static_cast<const uint16_t*>(data)[i]);
        case DType::kBF16: return bf16_to_float(static_cast<const uint16_t*>(data)[i]);
    }
    return NAN;
}

namespace {

Status validate_candidates(const int64_t* cand_offsets, const int32_t* cand_docs, int n_queries, const char* op) {
    if (cand_offsets == nullptr) return Status::OK();
    if (cand_offsets[0] != 0) return Status::InvalidArgument(std::string(op) + ": cand_offsets[0] must be 0");
    for (int q = 0; q < n_queries; ++q) {
        if (cand_offsets[q + 1] < cand_offsets[q]) {
            return Status::InvalidArgument(std::string(op) + ": cand_offsets must be non-decreasing");
        }
    }
    if (cand_offsets[n_queries] > 0 && cand_docs == nullptr) {
        return Status::InvalidArgument(std::string(op) + ": cand_docs is null");
    }
    return Status::OK();
}

Status validate_common(int n_queries, int q_stride, int dim, const int32_t* query_lens, int64_t n_docs,
                       const int64_t* doc_offsets, const char* op) {
    const std::string o(op);
    if (n_queries < 0 || q_stride < 0 || n_docs < 0) return Status::InvalidArgument(o + ": negative size");
    if (dim <= 0) return Status::InvalidArgument(o + ": dim must be positive");
    if (n_docs > 0 && doc_offsets == nullptr) return Status::InvalidArgument(o + ": doc_offsets is null");
    if (query_lens != nullptr) {
        for (int q = 0; q < n_queries; ++q) {
            if (query_lens[q] < 0 || query_lens[q] > q_stride) {
                return Status::InvalidArgument(o + ": query_lens[" + std::to_string(q) +
                                               "] = " + std::to_string(query_lens[q]) + " outside [0, q_stride]");
            }
        }
    }
    return Status::OK();
}

}  // namespace

bool codebook_blocks_equal(const float* codebook, int dim, int n_code_bytes) {
    if (codebook == nullptr || n_code_bytes <= 0 || dim <= 0 || dim % n_code_bytes != 0) return false;
    const size_t block = size_t(256) * (dim / n_code_bytes);
    for (int b = 1; b < n_code_bytes; ++b)
        if (!std::equal(codebook, codebook + block, codebook + b * block)) return false;
    return true;
}

Status validate_shard(const char* who, const int64_t* doc_offsets, int64_t n_docs, int64_t n_tokens, int device,
                      int n_devices) {
    const std::string w(who);
    if (doc_offsets == nullptr) return Status::InvalidArgument(w + ": doc_offsets is null");
    if (doc_offsets[0] != 0 || doc_offsets[n_docs] != n_tokens) {
        return Status::InvalidArgument(w + ": doc_offsets must run from 0 to n_tokens");
    }
    for (int64_t d = 0; d < n_docs; ++d) {
        if (doc_offsets[d + 1] < doc_offsets[d])
            return Status::InvalidArgument(w + ": doc_offsets must be non-decreasing");
    }
    if (device < 0 || device >= n_devices) {
        return Status::InvalidArgument(w + ": device " + std::to_string(device) + " of " + std::to_string(n_devices));
    }
    return Status::OK();
}

Status validate_host_batch(const char* who, int n_queries, int q_stride, const void* queries, const int32_t* query_lens,
                           const int64_t* cand_offsets, const int32_t* cand_docs, int64_t n_docs, int64_t* n_cand) {
    const std::string w(who);
    if (n_queries < 0 || q_stride < 0) return Status::InvalidArgument(w + ": negative size");
    if (n_queries > 0 && q_stride > 0 && queries == nullptr) return Status::InvalidArgument(w + ": queries is null");
    if (query_lens != nullptr) {
        for (int q = 0; q < n_queries; ++q) {
            if (query_lens[q] < 0 || query_lens[q] > q_stride) {
                return Status::InvalidArgument(w + ": query_lens[" + std::to_string(q) +
                                               "] = " + std::to_string(query_lens[q]) + " outside [0, q_stride]");
            }
        }
    }
    *n_cand = 0;
    if (cand_offsets == nullptr) return Status::OK();
    TMS_RETURN_IF_ERROR(validate_candidates(cand_offsets, cand_docs, n_queries, who));
    *n_cand = cand_offsets[n_queries];
    for (int64_t i = 0; i < *n_cand; ++i) {
        if (cand_docs[i] < 0 || cand_docs[i] >= n_docs) {
            return Status::InvalidArgument(w + ": candidate document " + std::to_string(cand_docs[i]) +
                                           " outside [0, " + std::to_string(n_docs) + ")");
        }
    }
    return Status::OK();
}

int64_t maxsim_num_scores(const MaxSimParams& p) {
    return p.cand_offsets ? p.cand_offsets[p.n_queries] : int64_t(p.n_queries) * p.n_docs;
}

int64_t code_maxsim_num_scores(const CodeMaxSimParams& p) {
    return p.cand_offsets ? p.cand_offsets[p.n_queries] : int64_t(p.n_queries) * p.n_docs;
}

Status ivf_union_validate(const IvfUnionParams& p) {
    if (p.n_queries < 0 || p.q_stride < 0 || p.nprobe < 0 || p.n_centroids < 0 || p.n_docs < 0) {
        return Status::InvalidArgument("ivf_union: negative size");
    }
    if (p.n_queries > 0 && p.q_stride > 0 && p.nprobe > 0 && (p.probe == nullptr || p.ivf_offsets == nullptr)) {
        return Status::InvalidArgument("ivf_union: null input");
    }
    return Status::OK();
}

Status probe_scores_validate(const ProbeScoreParams& p) {
    TMS_RETURN_IF_ERROR(ivf_union_validate(p.lists));
    if (p.keep < 0) return Status::InvalidArgument("probe_scores: keep < 0");
    const IvfUnionParams& u = p.lists;
    if (u.n_queries > 0 && u.q_stride > 0 &&
        (p.floor_scores == nullptr || (u.nprobe > 0 && p.probe_scores == nullptr))) {
        return Status::InvalidArgument("probe_scores: null scores");
    }
    return Status::OK();
}

Status maxsim_validate(const MaxSimParams& p) {
    TMS_RETURN_IF_ERROR(
        validate_common(p.n_queries, p.q_stride, p.dim, p.query_lens, p.n_docs, p.doc_offsets, "maxsim"));
    if (p.dim > 4096) {
        return Status::NotSupported("maxsim: dim " + std::to_string(p.dim) + " not supported (at most 4096)");
    }
    TMS_RETURN_IF_ERROR(validate_candidates(p.cand_offsets, p.cand_docs, p.n_queries, "maxsim"));
    if (p.n_queries > 0 && p.q_stride > 0 && p.queries == nullptr) {
        return Status::InvalidArgument("maxsim: queries is null");
    }
    return Status::OK();
}

Status code_maxsim_validate(const CodeMaxSimParams& p) {
    TMS_RETURN_IF_ERROR(
        validate_common(p.n_queries, p.q_stride, p.dim, p.query_lens, p.n_docs, p.doc_offsets, "code_maxsim"));
    if (p.n_code_bytes < 0 || (p.n_code_bytes > 0 && p.dim % p.n_code_bytes != 0)) {
        return Status::NotSupported("code_maxsim: n_code_bytes " + std::to_string(p.n_code_bytes) +
                                    " must divide dim " + std::to_string(p.dim));
    }
    if (p.n_code_bytes > 0 && (p.codebook == nullptr)) {
        return Status::InvalidArgument("code_maxsim: codebook is null");
    }
    if (p.n_centroids <= 0) return Status::InvalidArgument("code_maxsim: n_centroids must be positive");
    TMS_RETURN_IF_ERROR(validate_candidates(p.cand_offsets, p.cand_docs, p.n_queries, "code_maxsim"));
    return Status::OK();
}

Status decoded_scales_validate(const DecodedScaleParams& p) {
    if (p.n_tokens < 0 || p.dim <= 0 || p.n_centroids <= 0) return Status::InvalidArgument("decoded_scales: bad size");
    if (p.n_code_bytes <= 0 || p.dim % p.n_code_bytes != 0) {
        return Status::InvalidArgument("decoded_scales: n_code_bytes " + std::to_string(p.n_code_bytes) +
                                       " must be positive and divide dim " + std::to_string(p.dim));
    }
    if (p.centroids == nullptr || p.codebook == nullptr ||
        (p.n_tokens > 0 && (p.token_centroids == nullptr || p.codes == nullptr))) {
        return Status::InvalidArgument("decoded_scales: null input");
    }
    return Status::OK();
}

Status topk_validate(const TopKParams& p) {
    if (p.k <= 0) return Status::InvalidArgument("topk: k must be > 0, got " + std::to_string(p.k));
    if (p.n_segments < 0 || p.row_len < 0) return Status::InvalidArgument("topk: negative size");
    if (p.n_segments > 0 && (p.out_ids == nullptr || p.out_scores == nullptr)) {
        return Status::InvalidArgument("topk: null output");
    }
    if (p.offsets != nullptr) {
        for (int64_t s = 0; s < p.n_segments; ++s) {
            if (p.offsets[s + 1] < p.offsets[s]) return Status::InvalidArgument("topk: offsets must be non-decreasing");
        }
    }
    return Status::OK();
}

}  // namespace tms::kernels

namespace tms::kernels {

void SingleThreadedBlas() {
    if (openblas_set_num_threads != nullptr) openblas_set_num_threads(1);
}

void SetThreads(int threads) {
    if (threads > 0)
        omp_set_num_threads(std::min(threads, kMaxThreads));
    else if (omp_get_max_threads() > kMaxThreads)
        omp_set_num_threads(kMaxThreads);
}

}  // namespace tms::kernels
