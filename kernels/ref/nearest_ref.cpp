// Copyright TileMaxSim authors. Nearest centroid, the spec: fp64 dot products, first maximum.
#include <cmath>

#include "kernels/nearest.h"

namespace tms::kernels {

Status nearest_validate(const NearestParams& p) {
    if (p.n < 0 || p.dim <= 0 || p.n_centroids <= 0) {
        return Status::InvalidArgument("nearest: n >= 0, dim > 0 and n_centroids > 0 required");
    }
    if (p.n > 0 && (p.x == nullptr || p.centroids == nullptr || p.labels == nullptr)) {
        return Status::InvalidArgument("nearest: rows, centroids and labels required");
    }
    return Status::OK();
}

Status nearest_ref(const NearestParams& p) {
    TMS_RETURN_IF_ERROR(nearest_validate(p));
    for (int64_t i = 0; i < p.n; ++i) {
        const float* x = p.x + i * p.dim;
        int best = 0;
        double bv = -INFINITY;
        for (int k = 0; k < p.n_centroids; ++k) {
            const float* c = p.centroids + int64_t(k) * p.dim;
            double s = 0;
            for (int j = 0; j < p.dim; ++j) s += double(x[j]) * c[j];
            if (s > bv) {
                bv = s;
                best = k;
            }
        }
        p.labels[i] = static_cast<uint32_t>(best);
        if (p.best) p.best[i] = static_cast<float>(bv);
    }
    return Status::OK();
}

}  // namespace tms::kernels
