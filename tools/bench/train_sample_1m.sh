#!/usr/bin/env bash
# Does a larger k-means / codec training sample make compressed scores rank better? At 1M
# documents on one GPU, 32,768 centroids either way: PQ-16 and 2-bit residual trained on
# 262,144 sampled tokens (today's default, 8 a centroid) and on 2,097,152 (64 a centroid), each
# searched at the defaults without the exact rerank (compressed-only) and, for PQ, with it;
# recall@10 against the exhaustive run of the PQ + vectors index.
# Usage: train_sample_1m.sh OUTDIR [DOCS]   (DEV=cpu CENTROIDS=256: a dry run without a GPU)
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
dev=${DEV:-gpu}
cents=${CENTROIDS:-32768}
mkdir -p "$out"
d=/dev/shm/cuts-$docs
[ -f $d/queries.npy ] || tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
build() {  # name, sample, index flags...
  local name=$1 sample=$2; shift 2
  echo "{\"max_train_tokens\": $sample}" > /tmp/sample-$sample.json
  rm -rf /tmp/ts-$name
  tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/ts-$name \
    --config /tmp/sample-$sample.json --centroids $cents --device $dev --no-progress "$@" 2>&1 | tail -n 1
}
bench="tms bench search --queries $d/queries.npy --device $dev --single 0 --concurrency 1"
build pq-262k 262144 --keep-vectors
$bench --index /tmp/ts-pq-262k --truth-out /tmp/ts-exact.trec --sweep-rerank 0 --json $out/pq-262k.json 2>&1 | tail -n 3
rm -rf /tmp/ts-pq-262k
build pq-2m 2097152 --keep-vectors
$bench --index /tmp/ts-pq-2m --truth /tmp/ts-exact.trec --sweep-rerank 0 --json $out/pq-2m.json 2>&1 | tail -n 3
rm -rf /tmp/ts-pq-2m
for s in 262144 2097152; do
  build res2-$s $s --codec residual --nbits 2
  $bench --index /tmp/ts-res2-$s --truth /tmp/ts-exact.trec --json $out/res2-$s.json 2>&1 | tail -n 2
  rm -rf /tmp/ts-res2-$s
done
