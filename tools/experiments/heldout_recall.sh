#!/usr/bin/env bash
# The default search's recall@10 against exhaustive search on a corpus of
# tools/experiments/heldout_corpus.py, and what the build's estimate predicted:
#   heldout_recall.sh TMS CORPUS_DIR WORK_DIR [tms index flags...]
# prints one line: corpus, estimate at the defaults, measured recall@10, queries/s.
set -euo pipefail
tms=$1 corpus=$2 work=$3
shift 3
mkdir -p "$work"
[[ -d $work/idx && -z ${REBUILD:-} ]] || "$tms" -q index --docs "$corpus/docs.npy" --doclens "$corpus/doclens.npy" --out "$work/idx" --keep-vectors \
  --overwrite --no-progress "$@"
"$tms" -q search --index "$work/idx" --queries "$corpus/queries.npy" --out "$work/exact.run" --exhaustive --k 10 \
  --no-progress
"$tms" search --index "$work/idx" --queries "$corpus/queries.npy" --out "$work/default.run" --k 10 --no-progress \
  2> "$work/default.log"
log=$(tail -n 1 "$work/default.log")
echo "$corpus: $(python3 "$(dirname "$0")/run_recall.py" "$work/exact.run" "$work/default.run" "$work/default.log")  | $log"
