#!/usr/bin/env bash
# Sharded search at 1M documents on one GPU (issue #23's measurement): for each shard count,
# build PQ-16 + fp16 vectors, then in one process each: open time, batch queries/s (batches of
# 256, 1,000 queries, defaults), recall@10 against exhaustive search, and whether the run equals
# the one-shard run. Indexes are built one at a time (26 GB each) and removed after.
# Usage: shards_1m.sh OUTDIR "1 2 4" [DOCS]   (binaries packed by shared/tools/device-pack.sh)
set -euo pipefail
out=${1:?OUTDIR}
counts=${2:-"1 2 4"}
docs=${3:-1000000}
mkdir -p "$out"
d=/tmp/shards-$docs
here=$(cd "$(dirname "$0")" && pwd)
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
(nvidia-smi --query-gpu=name --format=csv,noheader || echo cpu) > "$out/gpu.txt"
for n in $counts; do
  rm -rf $d/idx
  tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/idx --shards "$n" \
    --keep-vectors --no-progress 2>&1 | tail -n 2 > "$out/index-$n.txt"
  if [ ! -f $d/exact.trec ]; then
    tms search --index $d/idx --queries $d/queries.npy --query-ids $d/query_ids.txt --out $d/exact.trec --k 10 \
      --exhaustive --device ${DEV:-gpu} --no-progress 2> "$out/exact.txt"
  fi
  for rep in 1 2; do
    t0=$(date +%s.%N)
    TMS_TRACE_LOAD=1 tms search --index $d/idx --queries $d/queries.npy --query-ids $d/query_ids.txt \
      --out $d/run-$n.trec --k 10 --device ${DEV:-gpu} --no-progress 2> "$out/search-$n-$rep.txt"
    t1=$(date +%s.%N)
    python3 -c "print('wall', $t1 - $t0)" >> "$out/search-$n-$rep.txt"
  done
  du -sb $d/idx | cut -f1 > "$out/bytes-$n.txt"
  rm -rf $d/idx
done
python3 "$here/shards_report.py" "$d" "$out" $counts | tee "$out/report.txt"
