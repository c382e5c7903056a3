#!/usr/bin/env bash
# Issue #28's table in one device call: on the 1M corpus, tms (PQ-16 + vectors, and 2-bit residual
# without vectors) and fast-plaid (nbits = 2, tools/bench/fast_plaid_peer.py), recall@10 of each
# against the exhaustive run of the PQ + vectors index. fast-plaid's wheels must be importable.
# Usage: peer_1m.sh OUTDIR [DOCS]
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
d=/dev/shm/cuts-$docs
[ -f $d/queries.npy ] || tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
bench="tms bench search --queries $d/queries.npy --device gpu --single 100 --concurrency 64"
rm -rf /tmp/peer-pq /tmp/peer-res2
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/peer-pq --keep-vectors --no-progress 2>&1 | tail -n 1
$bench --index /tmp/peer-pq --truth-out $out/exact.trec --json $out/tms-pq.json 2>&1 | tail -n 2
rm -rf /tmp/peer-pq
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/peer-res2 --codec residual --nbits 2 --no-progress 2>&1 | tail -n 1
$bench --index /tmp/peer-res2 --truth $out/exact.trec --json $out/tms-res2.json 2>&1 | tail -n 2
rm -rf /tmp/peer-res2
python3 "$here/fast_plaid_peer.py" --corpus $d --truth $out/exact.trec --out $out/fast-plaid.json --nbits 2
rm -f $out/exact.trec
