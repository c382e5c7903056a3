#!/usr/bin/env bash
# The parsers under a coverage-guided fuzzer, and the CPU unit tests under ASan and UBSan.
# Builds build-fuzz/ with clang (-DTMS_FUZZ=ON: libFuzzer coverage, address and
# undefined-behaviour sanitizers), runs unit and CLI tests there, then each fuzz target for SECONDS
# (default 10) from its seeds in tests/fuzz/corpus/ (new inputs it finds go to
# build-fuzz/corpus/; a crash leaves crash-* in build-fuzz/ and fails the script).
#   scripts/fuzz.sh          what CI runs (scripts/test.sh): 10 s a target
#   scripts/fuzz.sh 1800     a longer hunt: half an hour a target
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-10}
cmake --preset asan >/dev/null  # CMakePresets.json: build-fuzz/, clang, TMS_FUZZ
# Only what runs below (not the Python module or the examples).
cmake --build build-fuzz -j"$(nproc)" --target tms_tests tms fuzz_npy fuzz_safetensors fuzz_text fuzz_config fuzz_metadata fuzz_form_data
# Leaks are checked; ODR reports are off (FAISS and its BLAS define symbols twice in Debian).
export ASAN_OPTIONS=detect_leaks=1:detect_odr_violation=0:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
# The store, parsers, updates and search paths; the compute-heavy cases (MaxSim*, CodeMaxSim*,
# the concurrent and recall searches, the sharded-search and add/delete equivalences: their
# searches and builds are the kernels again) run 20x slower instrumented and stay in the plain run.
echo "fuzz.sh: CPU unit tests and CLI tests under ASan + UBSan"
build-fuzz/tests/tms_tests --gtest_brief=1 \
  --gtest_filter='EvalCpu.*:SearchCpu.*:NpyCpu.*:OptionsCpu.*:IndexCpu.*:StreamBuildCpu.*:PoolCpu.*:UpdateCpu.*:MetadataCpu.*:FilterFunctionsCpu.*:TopKCpu.*:HalfCpu.*:ParallelMemcpy.*:TeamMemcpy.*:CodebookBlocksEqual.*-UpdateCpu.AddDeleteEqualsFreshBuild:SearchCpu.SeparateShardSegmentsEqualOne:SearchCpu.ShardSubsetsMergeToTheWhole' \
  2>&1 | grep -v "^WARNING clustering"
# The CLI's bad-input and filter tests (its end-to-end flows, test_cli.py, are the kernels again
# and run in the plain build).
TMS_BIN=build-fuzz/tools/tms python3 -m pytest -q -p no:cacheprovider tests/tools/test_filter.py tests/tools/test_safety.py
# The server's parsing of hostile requests (JSON, .npy and multipart bodies), with the Python
# package of the plain build (build/) as its client.
if [ -d build/python/tilemaxsim ]; then
  TMS_BIN=build-fuzz/tools/tms PYTHONPATH=build/python python3 -m pytest -q -p no:cacheprovider tests/server/test_serve.py \
    -k "bad_requests or binary_form"
fi
# Each target writes its inputs as files into a scratch directory of its own, removed at the end.
scratch=$(mktemp -d /dev/shm/tms-fuzz.XXXXXX)
trap 'rm -rf "$scratch"' EXIT
for t in npy safetensors text config metadata form_data; do
  mkdir -p build-fuzz/corpus/$t
  echo "fuzz.sh: fuzz_$t for ${secs}s"
  (cd build-fuzz && TMPDIR="$scratch" ./tests/fuzz/fuzz_$t -max_total_time="$secs" -timeout=30 -rss_limit_mb=4096 \
     -print_final_stats=1 corpus/$t ../tests/fuzz/corpus/$t 2>&1 | grep -E "^stat::number_of_executed_units|ERROR|SUMMARY|crash" || true)
  # (ls fails when any one pattern matches nothing: collect what exists instead)
  found=$(ls build-fuzz/crash-* build-fuzz/timeout-* build-fuzz/oom-* 2>/dev/null || true)
  if [ -n "$found" ]; then
    echo "fuzz.sh: fuzz_$t found an input that fails: $found"
    exit 1
  fi
done
