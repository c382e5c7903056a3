#!/usr/bin/env bash
# Does a larger k-means / codec training sample make compressed scores rank better? For each
# training-tokens-per-centroid value PER (the sample is max(262,144, PER x centroids) tokens, at
# most max_train_tokens), a PQ-16 + vectors index and a 2-bit residual index of CORPUS, each
# searched at the fixed defaults (--no-estimate: no target-recall tuning) with and without the
# exact rerank; recall@10 against the exhaustive run of the first PQ + vectors index.
# With PEER=1 also fast-plaid (nbits 2) on the same embeddings (its wheels importable).
# Usage: train_sample.sh CORPUS OUTDIR [PER ...]    (default PER: 8 64; CORPUS as `tms synth`
# writes it; DEV=cpu: a dry run without a GPU)
set -euo pipefail
d=${1:?CORPUS}
out=${2:?OUTDIR}
shift 2
pers=${*:-8 64}
dev=${DEV:-gpu}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
build() {  # name, per, index flags...
  local name=$1 per=$2; shift 2
  echo "{\"train_tokens_per_centroid\": $per}" > /tmp/per-$per.json
  rm -rf /tmp/ts-$name
  tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/ts-$name \
    --config /tmp/per-$per.json --device $dev --no-progress --no-estimate "$@" 2>&1 | tail -n 1 | tee $out/index-$name.txt
}
bench="tms bench search --queries $d/queries.npy --device $dev --single 0 --concurrency 1"
truth="--truth-out $out/exact.trec"
for per in $pers; do
  build pq-$per $per --keep-vectors
  $bench --index /tmp/ts-pq-$per $truth --sweep-rerank 0 --json $out/pq-$per.json 2>&1 | tail -n 3
  truth="--truth $out/exact.trec"
  rm -rf /tmp/ts-pq-$per
  build res2-$per $per --codec residual --nbits 2
  $bench --index /tmp/ts-res2-$per $truth --json $out/res2-$per.json 2>&1 | tail -n 2
  rm -rf /tmp/ts-res2-$per
done
if [ "${PEER:-0}" = 1 ]; then
  python3 "$here/fast_plaid_peer.py" --corpus $d --truth $out/exact.trec --out $out/fast-plaid.json --nbits 2
fi
rm -f $out/exact.trec
