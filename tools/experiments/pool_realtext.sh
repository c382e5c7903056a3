#!/usr/bin/env bash
# Token pooling (tms index --pool-factor) on an encoded real-text corpus (realtext_encode.py's
# folder): for each factor, the index's tokens and bytes, and MRR@10 / recall@10 against the
# qrels and queries/s of the default and of the exhaustive search.
# Usage: pool_realtext.sh ENCDIR OUTDIR [DEVICE (cpu)] [FACTORS ("1 2 3 4")]
set -euo pipefail
enc=${1:?ENCDIR}
out=${2:?OUTDIR}
device=${3:-cpu}
factors=${4:-"1 2 3 4"}
w=$out/work
mkdir -p "$w"
{
  echo "$(wc -l < "$enc/doc_ids.txt") documents, $(wc -l < "$enc/query_ids.txt") queries, $device, $(date -u +%F)"
  printf "| pool factor | tokens | index MB | build s | search | MRR@10 | recall@10 | queries/s |\n|---|---|---|---|---|---|---|---|\n"
  for f in $factors; do
    t0=$(date +%s.%N)
    tms index --docs "$enc/docs.npy" --doclens "$enc/doclens.npy" --doc-ids "$enc/doc_ids.txt" --out "$w/idx" \
      --keep-vectors --pool-factor "$f" --device "$device" --no-progress --overwrite 2> "$w/index.log"
    build=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
    tokens=$(grep -o '[0-9]* tokens' "$w/index.log" | head -n 1 | cut -d' ' -f1)
    mb=$(du -sm "$w/idx" | cut -f1)
    for mode in default exhaustive; do
      extra=""; [ "$mode" = exhaustive ] && extra="--exhaustive"
      tms search --index "$w/idx" --queries "$enc/queries.npy" --query-ids "$enc/query_ids.txt" --out "$w/run.trec" \
        --k 10 --device "$device" --no-progress $extra 2> "$w/search.log"
      qps=$(grep -o '([0-9.]* queries/s' "$w/search.log" | tr -d '(' | cut -d' ' -f1)
      ev=$(tms eval --run "$w/run.trec" --qrels "$enc/qrels.tsv" --metrics mrr@10,recall@10 2>&1)
      mrr=$(echo "$ev" | awk '$1 == "mrr@10" {print $3}')
      rec=$(echo "$ev" | awk '$1 == "recall@10" {print $3}')
      printf "| %s | %s | %s | %s | %s | %s | %s | %s |\n" "$f" "$tokens" "$mb" "$build" "$mode" "$mrr" "$rec" "$qps"
    done
  done
} | tee "$out/pool-realtext-$device.md"
rm -rf "$w"
