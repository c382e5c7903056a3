#!/usr/bin/env bash
# tms serve under load: a synthetic corpus (PQ-16 + fp16 vectors, default search), then
# `tms bench serve` at 1, 16, 64 and 256 clients, without and with a writer adding 10 documents a
# second, beside the engine's in-process concurrent callers.
# Usage: serve_load.sh OUTDIR [DOCS (1000000)] [DEVICE (gpu)] [SECONDS (5)]
#   GPU, one device call: serve_load.sh $OUT            CPU here: serve_load.sh out 20000 cpu
set -uo pipefail
out=$1
docs=${2:-1000000}
device=${3:-gpu}
secs=${4:-5}
d=/dev/shm/serve-$docs
mkdir -p "$out"
tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/pq --keep-vectors \
  --device "$device" --no-progress 2>&1 | tail -n 1
rm -f $d/docs.npy
tms bench serve --index $d/pq --queries $d/queries.npy --device "$device" --clients 1,16,64,256 --seconds "$secs" \
  --writer-rate 10 --json "$out/serve-$device-$docs.json" 2>&1 | tee "$out/serve-$device-$docs.txt"
rm -rf $d
