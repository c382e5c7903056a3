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
python3 - "$work" "$corpus" <<'PY'
import json, re, sys
work, corpus = sys.argv[1], sys.argv[2]
def top(path):
    r = {}
    for line in open(path):
        q, _, d, *_ = line.split()
        r.setdefault(q, []).append(d)
    return r
exact, got = top(f"{work}/exact.run"), top(f"{work}/default.run")
rec = sum(len(set(exact[q][:10]) & set(got.get(q, [])[:10])) / min(10, len(exact[q])) for q in exact) / len(exact)
log = open(f"{work}/default.log").read()
qps = re.search(r"([0-9.]+) queries/s", log)
print(f"{corpus}: recall@10 {rec:.4f}  {qps.group(1) if qps else '?'} q/s  | {log.strip().splitlines()[-1] if log.strip() else ''}")
PY
