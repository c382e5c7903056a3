#!/usr/bin/env bash
# Where exhaustive search overtakes the approximate pipeline on small corpora: for each size,
# `tms synth` (d = 128, 1,024 queries), an index with vectors, then in one process each (tms bench
# search, warm, best of 5): batch queries/s (batches of 256) of the default search (which plans
# exhaustive search on small indexes), of the approximate pipeline forced (--target-recall 0) and
# of exhaustive search. One JSON line per size into OUT/crossover.jsonl.
#   tools/experiments/small_corpus_crossover.sh OUT DEVICE [SIZES...]     (DEVICE: cpu or gpu)
set -euo pipefail
out=$(mkdir -p "${1:?usage: $0 OUT DEVICE [SIZES...]}" && cd "$1" && pwd)
dev=${2:?DEVICE: cpu or gpu}
shift 2
sizes=("$@")
((${#sizes[@]})) || sizes=(100 300 1000 2000 4000 20000)
work=$(mktemp -d /tmp/tms-crossover.XXXXXX)
trap 'rm -rf "$work"' EXIT
bench() {  # tms bench search's JSON of one run into $work/$1.json
  local name=$1
  shift
  tms -q bench search --index "$work/c/idx" --queries "$work/c/queries.npy" --device "$dev" --passes 5 \
    --exhaustive-passes 5 --single 0 --concurrency 1 --json "$work/$name.json" "$@" 2>"$work/$name.log" \
    || { cat "$work/$name.log" >&2; exit 1; }
}
for n in "${sizes[@]}"; do
  rm -rf "$work/c"
  tms -q synth --out "$work/c" --docs "$n" --queries 1024 --dim 128
  tms -q index --docs "$work/c/docs.npy" --doclens "$work/c/doclens.npy" --out "$work/c/idx" --keep-vectors \
    --no-progress --device "$dev"
  bench default
  bench approximate --target-recall 0
  python3 - "$work" "$n" "$dev" <<'PY' | tee -a "$out/crossover.jsonl"
import json, sys
work, n, dev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
d, a = (json.load(open(f"{work}/{name}.json"))["rows"][0] for name in ("default", "approximate"))
print(json.dumps({"docs": n, "device": dev, "default_qps": d["batch_qps"], "approximate_qps": a["batch_qps"],
                  "exhaustive_qps": round(1024 / min(d["exhaustive_s"], a["exhaustive_s"]), 1),
                  "default_plan": "exhaustive" if d["exhaustive"] else [d["nprobe"], d["ncandidates"], d["rerank"]]}))
PY
done
