#!/usr/bin/env bash
# The peer comparison in one device call: on the 1M corpus, tms (PQ-16 + vectors: reranked and
# compressed-only rows; 2-bit residual without vectors) at the fixed defaults, and fast-plaid
# (nbits 2) beside the 2-bit row through `tms bench search --peer fast-plaid`; recall@10 of each
# against the exhaustive run of the PQ + vectors index. fast-plaid's wheels must be importable,
# and this runs from the repository root (the peer's runner is tools/experiments/fast_plaid_peer.py).
# Usage: peer_1m.sh OUTDIR [DOCS]
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
mkdir -p "$out"
d=/dev/shm/cuts-$docs
[ -f $d/queries.npy ] || tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
ix="tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --no-progress --no-estimate"
bench="tms bench search --queries $d/queries.npy --device gpu --single 100 --concurrency 64"
rm -rf /tmp/peer-pq /tmp/peer-res2
$ix --out /tmp/peer-pq --keep-vectors 2>&1 | tail -n 1
$bench --index /tmp/peer-pq --truth-out $out/exact.trec --sweep-rerank 0 --json $out/tms-pq.json 2>&1 | tail -n 3
rm -rf /tmp/peer-pq
$ix --out /tmp/peer-res2 --codec residual --nbits 2 2>&1 | tail -n 1
$bench --index /tmp/peer-res2 --truth $out/exact.trec --sweep-ncandidates 4096 --peer fast-plaid --peer-corpus $d \
  --json $out/tms-res2.json 2>&1 | grep -v "^\s*$" | tail -n 4
rm -rf /tmp/peer-res2 $out/exact.trec
