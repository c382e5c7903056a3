#!/usr/bin/env bash
# Is the recall estimate honest? (issue #29) For each index: the recall@10 that `tms estimate`
# predicts (pseudo-queries drawn from the documents, at several noise levels) beside the recall@10
# that the corpus's real queries measure against exhaustive search, at each ladder setting.
# Usage: estimate_check.sh OUTDIR INDEX:QUERIES.npy ...   (binaries packed by device-pack.sh)
set -uo pipefail
out=${1:?OUTDIR}
shift
mkdir -p "$out"
for spec in "$@"; do
  idx=${spec%%:*}
  q=${spec#*:}
  name=$(basename "$idx")
  for mix in ${MIXES:-0 0.5}; do
    for noise in ${NOISES:-0.5 0.9}; do
      echo "== $name estimate mix $mix noise $noise"
      tms estimate --index "$idx" --mix "$mix" --noise "$noise" 2>&1 | tail -n 2
      tms info --index "$idx" | grep recall_curve
    done
  done
  echo "== $name real queries"
  tms bench search --index "$idx" --queries "$q" --device gpu --target-recall 0 --single 0 --concurrency 0 \
    --truth-out /tmp/truth-$name.trec --json /dev/null 2>&1 | tail -n 1
  for p in "12 2048 512" "16 4096 1024" "24 8192 2048" "32 16384 4096"; do
    set -- $p
    tms bench search --index "$idx" --queries "$q" --device gpu --target-recall 0 --single 0 --concurrency 0 \
      --truth /tmp/truth-$name.trec --nprobe $1 --ncandidates $2 --rerank $3 --json /dev/null 2>&1 | tail -n 1
  done
done 2>&1 | tee "$out/estimate-check.txt"
