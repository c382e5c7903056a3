#!/usr/bin/env bash
# Configures and builds into build/ (CUDA kernels too where nvcc exists; they need a GPU to run).
# Extra arguments go to cmake's configure step, e.g. -DTMS_ENABLE_CUDA=OFF.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v nvcc >/dev/null && [[ -x /usr/local/cuda/bin/nvcc ]]; then
  export CUDACXX=/usr/local/cuda/bin/nvcc
fi
cmake --preset default "$@" >/dev/null  # CMakePresets.json: build/, Release
cmake --build build -j"$(nproc)"
