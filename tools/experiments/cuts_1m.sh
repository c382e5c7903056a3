#!/usr/bin/env bash
# The cost of cutting candidates across segments and ranks at 1M documents on one GPU: a 2-shard PQ-16 + fp16 index, then
#   tms bench search                      the two shards as one segment (no cut: the baseline)
#   tms bench search --separate-shards    each shard a segment, cut on the host (what 2 GPUs do)
#   tms search --batch B                  one process, B = 256 and 1
#   mpirun -np 2 tms search --batch B     2 ranks sharing the GPU, a shard each, cut through rank 0
# Every run is compared with the one-process run (identical), recall against the exhaustive run.
# Usage: cuts_1m.sh OUTDIR [DOCS]   (binaries packed by shared/tools/device-pack.sh; mpirun on PATH)
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
dev=${DEV:-gpu}  # DEV=cpu: a dry run on a machine without a GPU
mkdir -p "$out"
d=/dev/shm/cuts-$docs
idx=/tmp/cuts-idx
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
(nvidia-smi --query-gpu=name --format=csv,noheader || echo cpu) > "$out/gpu.txt"
rm -rf $idx
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $idx --shards 2 \
  --keep-vectors --no-progress 2>&1 | tail -n 1
bench="tms bench search --index $idx --queries $d/queries.npy --device $dev --single 100 --concurrency 64"
$bench --truth-out $out/exact.trec --json $out/bench-joined.json 2>&1 | tail -n 3
$bench --separate-shards --truth $out/exact.trec --json $out/bench-separate.json 2>&1 | tail -n 3
search="tms search --index $idx --queries $d/queries.npy --query-ids $d/query_ids.txt --k 10 --device $dev --no-progress"
for b in 256 1; do
  $search --batch $b --out $out/one-$b.trec 2> $out/one-$b.txt
  tail -n 2 $out/one-$b.txt
  mpirun -np 2 -x OMP_NUM_THREADS=$(( $(nproc) / 2 )) $search --batch $b --out $out/mpi-$b.trec 2> $out/mpi-$b.txt
  tail -n 2 $out/mpi-$b.txt
  if cmp -s $out/one-$b.trec $out/mpi-$b.trec; then echo "batch $b: mpi run = one process's"; else echo "batch $b: RUNS DIFFER"; fi
  rm -f $out/one-$b.trec $out/mpi-$b.trec
done
rm -rf $idx $out/exact.trec
