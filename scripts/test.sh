#!/usr/bin/env bash
# Install, build, and run every CPU test. GPU tests carry the ctest label gpu: on a GPU machine,
# scripts/build.sh -DTMS_BUILD_CUDA_TESTS=ON, then `ctest --test-dir build -L gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# PyLate from PyPI, for the adapter's test against PyLate itself: a download (GBs), made while
# the build uses the cores.
mkdir -p build
scripts/pylate_env.sh > build/pylate_env.log 2>&1 &
pylate_pid=$!
# CI compiles CUDA for sm_90a only (what the H200 runs) to stay fast, and not the CUDA test
# binaries, which only a GPU runs.
scripts/build.sh -DCMAKE_CUDA_ARCHITECTURES=90a -DTMS_BUILD_CUDA_TESTS=OFF "$@"
wait $pylate_pid || { cat build/pylate_env.log; exit 1; }
cat build/pylate_env.log
ctest --test-dir build -L cpu --output-on-failure -j"$(nproc)" --timeout 1200
# The CPU wheel, installed into a fresh environment that cannot see the libraries it bundles.
scripts/wheel.sh --test
# The parsers under libFuzzer, unit and CLI tests under ASan + UBSan (clang): a few minutes.
scripts/fuzz.sh 10
