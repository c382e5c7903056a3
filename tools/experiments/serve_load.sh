#!/usr/bin/env bash
# tms serve under load: a synthetic corpus (PQ-16 + fp16 vectors, default search), then
# `tms bench serve` at 1, 16, 64 and 256 clients, without and with a writer adding 10 documents a
# second, beside the engine's in-process concurrent callers. First (CALIBRATE=1, the default) a
# tms serve is sent 1,000 of the queries, so that the recall estimate is measured on them as the
# server does by itself (serve_calibrate.py).
# Usage: [CALIBRATE=0] [CLIENTS=64] serve_load.sh OUTDIR [DOCS (1000000)] [DEVICE (gpu)] [SECONDS (5)]
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
if [ "${CALIBRATE:-1}" = 1 ]; then
  # What tms serve does by itself after 1,000 queries: measure the recall estimate on the queries
  # served (rather than the build's pseudo-queries), which the default search then plans from.
  tms serve --index $d/pq --device "$device" --port 18181 --recalibrate-idle-ms 500 > "$out/serve-calibrate.log" 2>&1 &
  sp=$!
  python3 -c "import time, urllib.request as u
for _ in range(600):
    try: u.urlopen('http://127.0.0.1:18181/ready', timeout=5); break
    except Exception: time.sleep(0.5)"
  python3 "$(dirname "$0")/serve_calibrate.py" http://127.0.0.1:18181 $d/queries.npy 1000 2>&1 | tee "$out/serve-calibrate-$device-$docs.txt"
  python3 -c "import urllib.request as u; print(u.urlopen('http://127.0.0.1:18181/metrics').read().decode())" \
    | grep -E "^tms_(gpu_memory|shard_bytes|index_memory)" | tee -a "$out/serve-calibrate-$device-$docs.txt"
  kill -TERM $sp; wait $sp
fi
tms bench serve --index $d/pq --queries $d/queries.npy --device "$device" --clients "${CLIENTS:-1,16,64,256}" --seconds "$secs" \
  --writer-rate 10 --json "$out/serve-$device-$docs.json" 2>&1 | tee "$out/serve-$device-$docs.txt"
rm -rf $d
