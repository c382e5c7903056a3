#!/usr/bin/env bash
# The adaptive default search (tuning.md, "Each query searched as deep as it needs") on a corpus:
# an index with vectors (and its build estimate), the exhaustive top 10, then three searches back
# to back: the default, --no-adaptive (every query at the estimate's setting) and the fixed
# defaults (--target-recall 0); one line each: recall@10, queries/s, the queries not settled.
#   adaptive_recall.sh TMS CORPUS_DIR WORK_DIR [tms search flags...]
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
for name in adaptive once fixed; do
  case $name in adaptive) flags=() ;; once) flags=(--no-adaptive) ;; fixed) flags=(--target-recall 0) ;; esac
  "$tms" search --index "$work/idx" --queries "$corpus/queries.npy" --out "$work/$name.run" --k 10 --no-progress \
    "${flags[@]}" "$@" 2> "$work/$name.log"
  echo "$corpus $name: $(python3 "$(dirname "$0")/run_recall.py" "$work/exact.run" "$work/$name.run" "$work/$name.log")" \
    "$(grep -hoE '[0-9]+ of [0-9]+ queries not settled' "$work/$name.log" || true)" \
    "$(grep -hoE 'target recall .*' "$work/$name.log" || true)"
done
