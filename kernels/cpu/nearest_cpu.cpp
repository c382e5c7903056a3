// Copyright TileMaxSim authors. Nearest centroid on the CPU: BLAS score blocks, then each row's
// first maximum.
#include <omp.h>

#include <algorithm>
#include <vector>

#include "kernels/nearest.h"

#include "base/memory.h"

// The BLAS FAISS links (OpenBLAS on Debian), called single-threaded: the engine parallelises
// with OpenMP (SingleThreadedBlas).
extern "C" int sgemm_(const char* transa, const char* transb, int* m, int* n, int* k, const float* alpha,
                      const float* a, int* lda, const float* b, int* ldb, float* beta, float* c, int* ldc);

namespace tms::kernels {

void inner_products_cpu(const float* x, int64_t n, const float* c, int K, int d, float* out) {
    if (n == 0) return;
    const int64_t block = 256;
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t b = 0; b < n; b += block) {
        int nb = static_cast<int>(std::min<int64_t>(block, n - b));
        int k = K, dd = d;
        float one = 1.0f, zero = 0.0f;
        sgemm_("T", "N", &k, &nb, &dd, &one, c, &dd, x + b * d, &dd, &zero, out + b * K, &k);
    }
}

Status check_blas_room(int threads, int64_t extra, const std::string& what) {
    return CheckAddressSpace((int64_t(128) << 20) * threads + extra, threads, what);
}

Status nearest_cpu(const NearestParams& p) {
    TMS_RETURN_IF_ERROR(nearest_validate(p));
    const int K = p.n_centroids;
    // Enough rows per pass to keep every thread busy (256-row blocks), at most ~256 MB of scores.
    const int64_t rows =
        std::max<int64_t>(256, std::min<int64_t>(int64_t(1024) * omp_get_max_threads(), (int64_t(1) << 26) / K));
    std::vector<float> s;
    for (int64_t r0 = 0; r0 < p.n; r0 += rows) {
        const int64_t nr = std::min<int64_t>(rows, p.n - r0);
        s.resize(size_t(nr) * K);
        inner_products_cpu(p.x + r0 * p.dim, nr, p.centroids, K, p.dim, s.data());
#pragma omp parallel for schedule(static)
        for (int64_t i = 0; i < nr; ++i) {
            const float* row = s.data() + i * K;
            const int64_t best = std::max_element(row, row + K) - row;
            p.labels[r0 + i] = static_cast<uint32_t>(best);
            if (p.best) p.best[r0 + i] = row[best];
        }
    }
    return Status::OK();
}

}  // namespace tms::kernels
