#!/usr/bin/env bash
# Codec quality: recall@10 of compressed scoring alone (no exact rerank) against exhaustive exact
# MaxSim, per codec setting, on the synthetic corpus. Usage: codec_quality.sh [DOCS] [WORKDIR]
set -euo pipefail
tms=${TMS:-build/tools/tms}
docs=${1:-4000}
w=${2:-$(mktemp -d)}
"$tms" synth --out "$w/c" --docs "$docs" --queries 200 2>/dev/null
"$tms" index --docs "$w/c/docs.npy" --doclens "$w/c/doclens.npy" --doc-ids "$w/c/doc_ids.txt" --out "$w/exact" \
  --keep-vectors --codec residual --nbits 1 --no-progress 2>/dev/null
"$tms" search --index "$w/exact" --queries "$w/c/queries.npy" --out "$w/exact.trec" --k 10 --exhaustive 2>/dev/null
recall() {  # recall@10 of run $1 against $w/exact.trec
  python3 - "$1" "$w/exact.trec" <<'PY'
import sys, collections
def load(p):
    r = collections.defaultdict(list)
    for l in open(p):
        q, _, d, rank, s, _ = l.split()
        r[q].append(d)
    return r
a, e = load(sys.argv[1]), load(sys.argv[2])
print("%.4f" % (sum(len(set(a[q][:10]) & set(e[q][:10])) / len(e[q][:10]) for q in e) / len(e)))
PY
}
echo "codec	bytes/token	recall@10 vs exact"
for spec in "pq --pq-m 8" "pq --pq-m 16" "pq --pq-m 32" "pq --pq-m 64" "residual --nbits 1" "residual --nbits 2" "residual --nbits 4"; do
  name=$(echo "$spec" | sed 's/pq --pq-m /pq/;s/residual --nbits /res/')
  "$tms" index --docs "$w/c/docs.npy" --doclens "$w/c/doclens.npy" --doc-ids "$w/c/doc_ids.txt" --out "$w/$name" \
    --codec $spec --no-progress 2>/dev/null
  "$tms" search --index "$w/$name" --queries "$w/c/queries.npy" --out "$w/$name.trec" --k 10 --nprobe 64 \
    --ncandidates 0 --rerank 0 2>/dev/null
  bpt=$("$tms" info --index "$w/$name" | awk -F'\t' '$1=="code_bytes_per_token"{print $2}')
  echo "$name	$bpt	$(recall "$w/$name.trec")"
done
