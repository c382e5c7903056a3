#!/usr/bin/env bash
# Search on the real-text corpus: man pages encoded by all-MiniLM-L6-v2 (realtext_prep.py
# here, realtext_encode.py on the GPU machine), then PQ-16 + vectors and 2-bit residual indexes,
# `tms bench search` at the defaults with sweeps (recall@10 against exhaustive search), and MRR@10
# of the default and exhaustive runs against the qrels. Also the disk's write bandwidth (the bound
# of builds with vectors). Usage: realtext_search.sh PREPDIR OUTDIR   (binaries packed by
# shared/tools/device-pack.sh; torch on the machine)
set -uo pipefail
prep=${1:?PREPDIR}
out=${2:?OUTDIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
d=/dev/shm/rt
python3 "$here/realtext_encode.py" "$prep" $d --device cuda 2>&1 | tail -n 2
cp $d/encode.json "$out/" 2>/dev/null
q="--queries $d/queries.npy --query-ids $d/query_ids.txt"
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/rt-pq --keep-vectors \
  --no-progress 2>&1 | tail -n 2 | tee "$out/index-pq.txt"
tms bench search --index /tmp/rt-pq --queries $d/queries.npy --device gpu --single 100 --concurrency 64 \
  --sweep-nprobe 4,16,32 --sweep-ncandidates 256,4096 --sweep-rerank 64,1024 --truth-out "$out/exact-qidx.trec" \
  --json "$out/search-pq.json" 2>&1 | tee "$out/search-pq.txt"
for mode in default exhaustive; do
  extra=""; [ $mode = exhaustive ] && extra="--exhaustive"
  tms search --index /tmp/rt-pq $q --out "$out/run-$mode.trec" --k 10 --device gpu --no-progress $extra 2>/dev/null
  echo "== $mode"; tms eval --run "$out/run-$mode.trec" --qrels $d/qrels.tsv --metrics mrr@10,recall@10
done 2>&1 | tee "$out/eval.txt"
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out /tmp/rt-res2 --codec residual \
  --nbits 2 --no-progress 2>&1 | tail -n 1 | tee "$out/index-res2.txt"
tms bench search --index /tmp/rt-res2 --queries $d/queries.npy --device gpu --truth "$out/exact-qidx.trec" \
  --sweep-ncandidates 4096 --json "$out/search-res2.json" 2>&1 | tail -n 4 | tee "$out/search-res2.txt"
rm -f "$out"/*.trec
# Sequential write bandwidth of the index's file system, direct I/O, 8 GB.
dd if=/dev/zero of=/tmp/dd.bin bs=64M count=128 oflag=direct 2>&1 | tail -n 1 | tee "$out/disk.txt"
rm -f /tmp/dd.bin
