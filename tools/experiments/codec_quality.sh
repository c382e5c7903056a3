#!/usr/bin/env bash
# Codec quality: recall@10 of compressed scoring alone (no exact rerank) against exhaustive exact
# MaxSim, per codec setting: every candidate scored (--nprobe 64 --ncandidates 0 --rerank 0, the
# codec's own bound) and the default search of an index without vectors.
# Usage: codec_quality.sh [DOCS | CORPUS_DIR] [WORKDIR] [CODEC_SPEC...]
#   DOCS: a `tms synth` corpus of that many documents (default 4000); CORPUS_DIR: one holding
#   docs.npy, doclens.npy, queries.npy (realtext_encode.py, heldout_corpus.py).
#   CODEC_SPEC: `tms index` codec flags, quoted ("pq --pq-m 32"); default: PQ-8..64, 1/2/4-bit residual.
set -euo pipefail
tms=${TMS:-build/tools/tms}
src=${1:-4000}
w=${2:-$(mktemp -d)}
shift $(($# < 2 ? $# : 2))
specs=("$@")
[[ ${#specs[@]} -gt 0 ]] || specs=("pq --pq-m 8" "pq --pq-m 16" "pq --pq-m 32" "pq --pq-m 64" "residual --nbits 1"
  "residual --nbits 2" "residual --nbits 4")
mkdir -p "$w"
if [[ -d $src ]]; then
  c=$src
else
  c=$w/c
  [[ -f $c/queries.npy ]] || "$tms" synth --out "$c" --docs "$src" --queries 200 2>/dev/null
fi
if [[ ! -f $w/exact.trec ]]; then
  "$tms" index --docs "$c/docs.npy" --doclens "$c/doclens.npy" --out "$w/exact" --keep-vectors --codec residual \
    --nbits 1 --no-progress --no-estimate --overwrite 2>/dev/null
  "$tms" search --index "$w/exact" --queries "$c/queries.npy" --out "$w/exact.trec" --k 10 --exhaustive 2>/dev/null
fi
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
echo "# corpus $src"
echo "codec	bytes/token	recall@10 every candidate scored	recall@10 default search	build estimate at the defaults"
for spec in "${specs[@]}"; do
  name=$(echo "$spec" | sed 's/pq --pq-m /pq/;s/residual --nbits /res/;s/ /_/g')
  # shellcheck disable=SC2086
  "$tms" index --docs "$c/docs.npy" --doclens "$c/doclens.npy" --out "$w/$name" --codec $spec --no-progress \
    --overwrite 2>/dev/null
  "$tms" search --index "$w/$name" --queries "$c/queries.npy" --out "$w/$name.all.trec" --k 10 --nprobe 64 \
    --ncandidates 0 --rerank 0 2>/dev/null
  "$tms" search --index "$w/$name" --queries "$c/queries.npy" --out "$w/$name.trec" --k 10 2>/dev/null
  bpt=$("$tms" info --index "$w/$name" | awk -F'\t' '$1=="code_bytes_per_token"{print $2}')
  est=$("$tms" info --index "$w/$name" | awk -F'\t' '$1=="estimated_recall@10"{print $2}')
  echo "$name	$bpt	$(recall "$w/$name.all.trec")	$(recall "$w/$name.trec")	${est:--}"
done
