#!/usr/bin/env bash
# Search at the defaults on one GPU, one device call: the GPU search tests, 20K and 1M documents
# (PQ-16 + vectors with sweeps, gathered and not; then 2-bit residual against the exhaustive run).
# Usage: search_defaults.sh OUTDIR   (binaries packed by shared/tools/device-pack.sh)
set -uo pipefail
out=$1
tms_cuda_tests --gtest_filter='ConcurrentSearchCuda.*:FaultCuda.*:GpuCodeScorer*:ProbeScores*' 2>&1 | tee $out/cuda_tests.txt | grep -E "^\[  (FAILED|PASSED) |OK \]|FAILED|Failure|rror" | head -30
d=/tmp/s20k
tms synth --out $d --docs 20000 --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/pq --keep-vectors --no-progress 2>&1 | tail -n 1
tms bench search --index $d/pq --queries $d/queries.npy --device gpu --sweep-ncandidates 256,512,1024,2048 --json $out/search-20k.json 2>&1 | tee $out/s20k.txt
rm -rf $d
d=/dev/shm/m1
tms synth --out $d --docs 1000000 --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
t0=$(date +%s.%N)
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/pq --keep-vectors --no-progress 2>&1 | tail -n 1 | tee $out/index-pq.txt
echo "build_s $(python3 -c "print($(date +%s.%N) - $t0)")" | tee -a $out/index-pq.txt
tms bench search --index /tmp/pq --queries $d/queries.npy --device gpu --truth-out $out/exact.trec --sweep-ncandidates 512,1024,2048,4096 --sweep-nprobe 4,8,16 --json $out/search-1m-pq.json 2>&1 | tee $out/search-pq.txt
tms bench search --index /tmp/pq --queries $d/queries.npy --device gpu --no-gather --no-recall --sweep-ncandidates 1024 --json $out/search-1m-pq-nogather.json 2>&1 | tail -n 3
rm -rf /tmp/pq
t0=$(date +%s.%N)
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/res2 --codec residual --nbits 2 --no-progress 2>&1 | tail -n 1 | tee $out/index-res2.txt
echo "build_s $(python3 -c "print($(date +%s.%N) - $t0)")" | tee -a $out/index-res2.txt
tms bench search --index /tmp/res2 --queries $d/queries.npy --device gpu --truth $out/exact.trec --sweep-ncandidates 1024,2048,4096,8192 --json $out/search-1m-res2.json 2>&1 | tee $out/search-res2.txt
