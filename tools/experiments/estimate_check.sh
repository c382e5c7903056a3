#!/usr/bin/env bash
# Is the recall estimate honest? For each index: the recall curve that the corpus's real
# queries measure against exhaustive search (`tms estimate --sample`), beside the curves that
# pseudo-queries of each recipe predict, at the same ladder of settings.
# Usage: estimate_check.sh OUTDIR INDEX:QUERIES.npy ...   (binaries packed by device-pack.sh)
#   RECIPES  pseudo-query recipes, `tms estimate` options, separated by ';' (default: the default
#            recipe, then span queries padded as ColBERT's)
#   DEVICE   where the searches run (default gpu)
set -uo pipefail
out=${1:?OUTDIR}
shift
mkdir -p "$out"
IFS=';' read -r -a recipes <<< "${RECIPES:-;--content-tokens 11}"
curve() { tms info --index "$1" | awk -F"\t" '$1 == "recall_curve" {printf " %s", $5} END {print ""}'; }
for spec in "$@"; do
  idx=${spec%%:*}
  q=${spec#*:}
  name=$(basename "$idx")
  tms estimate --index "$idx" --device "${DEVICE:-gpu}" --sample "$q" 2>&1 | tail -n 1
  echo "$name real queries:$(curve "$idx")"
  for r in "${recipes[@]}"; do
    # shellcheck disable=SC2086
    tms estimate --index "$idx" --device "${DEVICE:-gpu}" $r 2>&1 | tail -n 1
    echo "$name pseudo [${r:-default}]:$(curve "$idx")"
  done
done 2>&1 | tee "$out/estimate-check.txt"
