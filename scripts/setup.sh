#!/usr/bin/env bash
# Installs what TileMaxSim needs on Debian 12 (idempotent: installs only what is missing).
#   Debian packages: compilers, CMake, FAISS (CPU), RocksDB, SQLite, CLI11, nlohmann-json, Boost (Beast/Asio headers: tms serve), GoogleTest,
#   Google Benchmark, OpenMP, OpenBLAS, Open MPI (distributed search and builds); clang with libFuzzer and the sanitizer runtimes
#   (scripts/fuzz.sh), curl (a real HTTP client in the server tests).   Python: numpy, pytest, pytrec-eval (tests); pybind11 and
#   scikit-build-core (the Python package, python/), ml_dtypes (its bfloat16 test).
set -euo pipefail
pkgs=(build-essential cmake pkg-config libfaiss-dev librocksdb-dev libsqlite3-dev libcli11-dev nlohmann-json3-dev libboost-dev
      libgtest-dev libgmock-dev libbenchmark-dev libomp-dev libopenblas-dev python3
      clang libclang-rt-14-dev libopenmpi-dev openmpi-bin python3-dev python3-venv curl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
py=(numpy pytest pytrec-eval-terrier pybind11 scikit-build-core ml_dtypes)
if ! python3 -c "import numpy, pytest, pytrec_eval, pybind11, scikit_build_core, ml_dtypes" 2>/dev/null; then
  echo "setup: installing Python packages (${py[*]})"
  python3 -m pip install -q "${py[@]}" 2>/dev/null \
    || python3 -m pip install -q --break-system-packages "${py[@]}" \
    || { (command -v pip3 >/dev/null || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-pip >/dev/null) \
         && python3 -m pip install -q --break-system-packages "${py[@]}"; }
fi
