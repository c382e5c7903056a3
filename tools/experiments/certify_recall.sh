#!/usr/bin/env bash
# Per-query certification and the adaptive default search (tuning.md, "Each query certified",
# "Each query searched as deep as it needs") on a corpus: an index with vectors (and its build
# estimate), the exhaustive top 10, then the search with --certify, the default search (each
# query at the defaults, the unsettled ones again deeper), --no-adaptive (the estimate's setting
# for every query) and the fixed defaults; one line each: recall@10, queries certified and
# certified queries whose top 10 is not the exhaustive one, or queries searched again deeper,
# queries/s (the four searches run back to back on the same machine).
#   certify_recall.sh TMS CORPUS_DIR WORK_DIR [tms search flags...]
# CORPUS_DIR holds docs.npy, doclens.npy, queries.npy (tms synth, heldout_corpus.py,
# realtext_encode.py). REBUILD=1 builds the index again.
set -euo pipefail
tms=$1 corpus=$2 work=$3
shift 3
mkdir -p "$work"
[[ -d $work/idx && -z ${REBUILD:-} ]] || "$tms" -q index --docs "$corpus/docs.npy" --doclens "$corpus/doclens.npy" \
  --out "$work/idx" --keep-vectors --overwrite --no-progress
[[ -f $work/exact.run ]] || "$tms" -q search --index "$work/idx" --queries "$corpus/queries.npy" \
  --out "$work/exact.run" --exhaustive --k 10 --no-progress "$@"
search() {  # NAME FLAGS...
  local name=$1
  shift
  "$tms" search --index "$work/idx" --queries "$corpus/queries.npy" --out "$work/$name.run" --k 10 --no-progress \
    --certificates "$work/$name.tsv" "$@" 2> "$work/$name.log"
}
search certified --certify "$@"
search planned "$@"
search once --no-adaptive "$@"
search fixed --target-recall 0 "$@"
PYTHONPATH="$(dirname "$0")" python3 - "$work" "$corpus" <<'PY'
import sys
from run_recall import qps, recall, top
work, corpus = sys.argv[1], sys.argv[2]
exact = top(f"{work}/exact.run")
for name in ("certified", "planned", "once", "fixed"):
    got = top(f"{work}/{name}.run")
    rows = [l.split() for l in open(f"{work}/{name}.tsv")][1:]
    cert = [q for q, c, _ in rows if c == "1"]
    again = sum(1 for _, c, d in rows if d != "0")
    wrong = sum(1 for q in cert if set(exact[q][:10]) != set(got.get(q, [])[:10]))
    line = f"{corpus} {name}: recall@10 {recall(exact, got):.4f}"
    if name == "certified":
        line += f", certified {len(cert)}/{len(rows)} ({wrong} not exact), searched again {again}"
    elif again:
        line += f", not settled and searched again {again}/{len(rows)}"
    print(line + f", {qps(f'{work}/{name}.log')} q/s")
PY
