#!/usr/bin/env bash
# BM25, MaxSim and hybrid search on the man-page corpus (realtext_prep.py, then realtext_encode.py):
# the pages' text (docs.tsv.gz, as encoded) is the index's text field; each query is a page's NAME
# line, its embeddings and its text. MRR@10 and recall@10 against the qrels, and queries/s of each
# mode, from one index (MODES: tms search options per row, separated by |).
# Usage: hybrid_realtext.sh PREPDIR ENCDIR OUTDIR [DEVICE (cpu)] [TOKENIZER]
set -euo pipefail
prep=${1:?PREPDIR}
enc=${2:?ENCDIR}
out=${3:?OUTDIR}
device=${4:-cpu}
tokenizer=${5:-unicode61}
mkdir -p "$out"
w=$out/work
mkdir -p "$w"
python3 - "$prep" "$enc" "$w" <<'PY'
import gzip, json, sys
prep, enc, w = sys.argv[1:4]
text = {}
with gzip.open(f"{prep}/docs.tsv.gz", "rt") as f:
    for line in f:
        name, t = line.rstrip("\n").split("\t", 1)
        text[name] = t
ids = open(f"{enc}/doc_ids.txt").read().split()
with open(f"{w}/meta.jsonl", "w") as f:
    for d in ids:
        f.write(json.dumps({"text": text[d]}) + "\n")
q = dict(line.rstrip("\n").split("\t", 1) for line in open(f"{prep}/queries.tsv"))
with open(f"{w}/query_text.txt", "w") as f:
    for qid in open(f"{enc}/query_ids.txt").read().split():
        f.write(q[qid].replace("\n", " ") + "\n")
PY
tms index --docs "$enc/docs.npy" --doclens "$enc/doclens.npy" --doc-ids "$enc/doc_ids.txt" --out "$w/idx" \
  --keep-vectors --metadata "$w/meta.jsonl" --text-field text --text-tokenizer "$tokenizer" --device "$device" \
  --no-progress --overwrite 2>&1 | tail -n 1
q="--queries $enc/queries.npy --query-ids $enc/query_ids.txt --query-text $w/query_text.txt"
{
  echo "$(wc -l < "$enc/doc_ids.txt") pages, $(wc -l < "$enc/query_ids.txt") queries, $device, tokenizer $tokenizer, $(date -u +%F)"
  printf "| mode | MRR@10 | recall@10 | queries/s |\n|---|---|---|---|\n"
  modes=${MODES:-"maxsim|bm25|hybrid|hybrid --bm25-weight 0.7|hybrid --fusion weighted|hybrid --fusion weighted --bm25-weight 0.3"}
  IFS='|' read -r -a mlist <<< "$modes"
  for m in "${mlist[@]}"; do
    tms search --index "$w/idx" $q --mode $m --out "$w/run.trec" --k 10 --device "$device" --no-progress \
      2> "$w/search.log"
    qps=$(grep -o '([0-9.]* queries/s' "$w/search.log" | tr -d '(' | cut -d' ' -f1)
    ev=$(tms eval --run "$w/run.trec" --qrels "$enc/qrels.tsv" --metrics mrr@10,recall@10 2>&1)
    mrr=$(echo "$ev" | awk '$1 == "mrr@10" {print $3}')
    rec=$(echo "$ev" | awk '$1 == "recall@10" {print $3}')
    printf "| %s | %s | %s | %s |\n" "$m" "$mrr" "$rec" "$qps"
  done
} | tee "$out/hybrid-realtext-$device-$tokenizer.md"
rm -rf "$w"
