#!/usr/bin/env bash
# Vector tiers at 1M documents on one GPU: the corpus of the search-speed issue, a
# PQ-16 + fp16 index, then `tms bench search` with the vectors on the GPU, in host memory and on
# disk (through the page cache); each row's recall@10 is against exhaustive search on the same
# tier, which streams every vector (GB/s against the host-to-device copy rate of the same run).
# Usage: tiers_1m.sh OUTDIR [DOCS] [TIERS]   (binaries packed by shared/tools/device-pack.sh)
# DELETE_INPUT=1 removes the corpus's docs.npy from /dev/shm once the index is built (2M documents:
# 51 GB of input in RAM, which the host tier then needs).
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
tiers=${3:-gpu host disk}
dev=${DEV:-gpu}  # DEV=cpu: a dry run on a machine without a GPU
mkdir -p "$out"
d=/dev/shm/tiers-$docs
idx=/tmp/tiers-idx
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
(nvidia-smi --query-gpu=name --format=csv,noheader || echo cpu) > "$out/gpu.txt"
if [ ! -d $idx ]; then
  /usr/bin/time -f "index: %e s, %M KB" tms index --docs $d/docs.npy --doclens $d/doclens.npy \
    --doc-ids $d/doc_ids.txt --out $idx --keep-vectors --no-progress --no-estimate 2>&1 | tail -n 4
fi
if [ "${DELETE_INPUT:-0}" = 1 ]; then rm -f $d/docs.npy; fi
df -h /tmp /dev/shm | tail -n 2
for t in $tiers; do
  echo "vectors: $t"
  /usr/bin/time -f "bench: %e s, %M KB peak" tms bench search --index $idx --queries $d/queries.npy --device $dev \
    --vectors $t --single 100 --concurrency 1,64 --json $out/tiers-$t.json 2>&1 | tail -n 5
done
