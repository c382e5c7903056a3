#!/usr/bin/env bash
# Sharded search at 1M documents on one GPU: for each shard count,
# build PQ-16 + fp16 vectors, then `tms search` once (the run, and the open time: TMS_TRACE_LOAD)
# and `tms bench search` (batch queries/s best of 3, one-query p50/p99, 64 callers, recall@10
# against the exhaustive run of the first count's index). Indexes are built one at a time (27 GB
# each) and removed after; the corpus lives in /dev/shm.
# Usage: shards_1m.sh OUTDIR "1 4" [DOCS]   (binaries packed by shared/tools/device-pack.sh)
set -euo pipefail
out=${1:?OUTDIR}
counts=${2:-"1 2 4"}
docs=${3:-1000000}
mkdir -p "$out"
d=/dev/shm/shards-$docs
idx=/tmp/shards-idx
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
(nvidia-smi --query-gpu=name --format=csv,noheader || echo cpu) > "$out/gpu.txt"
truth=""
for n in $counts; do
  rm -rf $idx
  t0=$(date +%s.%N)
  tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $idx --shards "$n" \
    --keep-vectors --no-progress 2>&1 | tail -n 2 > "$out/index-$n.txt"
  echo "build_s $(python3 -c "print($(date +%s.%N) - $t0)")" >> "$out/index-$n.txt"
  t0=$(date +%s.%N)
  TMS_TRACE_LOAD=1 tms search --index $idx --queries $d/queries.npy --query-ids $d/query_ids.txt \
    --out $out/run-$n.trec --k 10 --device gpu --no-progress 2> "$out/search-$n.txt"
  echo "wall $(python3 -c "print($(date +%s.%N) - $t0)")" >> "$out/search-$n.txt"
  if [ -z "$truth" ]; then
    tms bench search --index $idx --queries $d/queries.npy --device gpu --single 100 --concurrency 64 \
      --truth-out $out/exact.trec --json $out/bench-$n.json 2>&1 | tail -n 4
    truth=$out/exact.trec
  else
    tms bench search --index $idx --queries $d/queries.npy --device gpu --single 100 --concurrency 64 \
      --truth $truth --json $out/bench-$n.json 2>&1 | tail -n 4
  fi
  du -sb $idx | cut -f1 > "$out/bytes-$n.txt"
  rm -rf $idx
done
python3 "$here/shards_report.py" "$out" $counts | tee "$out/report.txt"
