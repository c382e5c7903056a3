#!/usr/bin/env bash
# Search at 1M documents on one GPU in one device call: synthesize the corpus,
# build PQ-16 + fp16 vectors, `tms bench search` over both prunings and a few candidate depths,
# then 2-bit residual without vectors (no vectors: no exhaustive search in that process, so its
# rows have no recall; compare its runs with the first index's exhaustive run separately).
# Usage: search_1m.sh OUTDIR [DOCS]   (binaries packed by shared/tools/device-pack.sh)
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
mkdir -p "$out"
d=${D:-/tmp}/search-$docs  # D=/dev/shm keeps the corpus off the disk the index needs
gpu=$( (nvidia-smi --query-gpu=name --format=csv,noheader | head -n 1 | tr ' ' '-') || echo cpu)
date=$(date -u +%Y-%m-%d)
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
t0=$(date +%s.%N)
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/pq --keep-vectors \
  --no-progress 2>&1 | tail -n 1 | tee "$out/index-pq.txt"
echo "build_s $(python3 -c "print($(date +%s.%N) - $t0)")" >> "$out/index-pq.txt"
tms bench search --index $d/pq --queries $d/queries.npy --device ${DEV:-gpu} --sweep-pruning probe,interaction \
  --sweep-ncandidates 1024,2048,4096 --json "$out/search-$gpu-$date-pq.json" 2>&1 | tee "$out/search-pq.txt"
rm -rf $d/pq
t0=$(date +%s.%N)
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/res2 --codec residual \
  --nbits 2 --no-progress 2>&1 | tail -n 1 | tee "$out/index-res2.txt"
echo "build_s $(python3 -c "print($(date +%s.%N) - $t0)")" >> "$out/index-res2.txt"
tms bench search --index $d/res2 --queries $d/queries.npy --device ${DEV:-gpu} --no-recall --sweep-pruning probe,interaction \
  --json "$out/search-$gpu-$date-res2.json" 2>&1 | tee "$out/search-res2.txt"
rm -rf $d/res2
