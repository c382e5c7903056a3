#!/usr/bin/env bash
# The recall estimate of an index without stored vectors (measured at build time against the
# input, `compressed`) beside what its queries measure: the exact top 10 from exhaustive search of
# the same documents kept with vectors, then the compressed index searched at the fixed defaults
# (--target-recall 0) and as the estimate plans it (the default search).
#   novec_estimate.sh TMS CORPUS_DIR WORK_DIR [tms index flags...]
# CORPUS_DIR holds docs.npy, doclens.npy, queries.npy (tms synth, heldout_corpus.py,
# realtext_encode.py). Prints one line per corpus.
set -euo pipefail
tms=$1 corpus=$2 work=$3
shift 3
mkdir -p "$work"
"$tms" -q index --docs "$corpus/docs.npy" --doclens "$corpus/doclens.npy" --out "$work/vec" --keep-vectors \
  --no-estimate --overwrite --no-progress "$@"
"$tms" -q search --index "$work/vec" --queries "$corpus/queries.npy" --out "$work/exact.run" --exhaustive --k 10 \
  --no-progress
rm -rf "$work/vec"
"$tms" index --docs "$corpus/docs.npy" --doclens "$corpus/doclens.npy" --out "$work/novec" --overwrite \
  --no-progress "$@" 2> "$work/build.log"
"$tms" info --index "$work/novec" > "$work/info.txt"
"$tms" search --index "$work/novec" --queries "$corpus/queries.npy" --out "$work/fixed.run" --k 10 --no-progress \
  --target-recall 0 2> "$work/fixed.log"
"$tms" search --index "$work/novec" --queries "$corpus/queries.npy" --out "$work/planned.run" --k 10 --no-progress \
  2> "$work/planned.log"
PYTHONPATH="$(dirname "$0")" python3 - "$work" "$corpus" <<'PY'
import re, sys
from run_recall import qps, recall, top
work, corpus = sys.argv[1], sys.argv[2]
exact = top(f"{work}/exact.run")
rec = lambda name: recall(exact, top(f"{work}/{name}.run"))
info = open(f"{work}/info.txt").read()
est = re.search(r"estimated_recall@10\t([0-9.]+)", info)
target = re.search(r"target_recall\t[0-9.]+\tnprobe (\d+)\tncandidates (\d+)", info)
print(f"{corpus}: estimate at the defaults {est.group(1) if est else 'none'}; fixed defaults recall@10 "
      f"{rec('fixed'):.4f} ({qps(f'{work}/fixed.log')} q/s); planned nprobe {target.group(1) if target else '?'} "
      f"ncandidates {target.group(2) if target else '?'}: recall@10 {rec('planned'):.4f} "
      f"({qps(f'{work}/planned.log')} q/s)")
PY
