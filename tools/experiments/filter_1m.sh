#!/usr/bin/env bash
# Filtered search at 1M documents on one GPU: the synthetic 1M corpus of search_1m.sh
# with metadata (tenant = d % 200, g = d % 100000), a PQ-16 + fp16 index built with --metadata,
# then `tms bench search` unfiltered and with filters allowing 80%, 50%, 20%, 5%, 0.5% of the
# documents and 10 documents; each row's recall@10 is against exhaustive search restricted to the
# same filter.
# Usage: filter_1m.sh OUTDIR [DOCS]   (binaries packed by shared/tools/device-pack.sh)
set -euo pipefail
out=${1:?OUTDIR}
docs=${2:-1000000}
dev=${DEV:-gpu}  # DEV=cpu: a dry run on a machine without a GPU
mkdir -p "$out"
d=/dev/shm/filter-$docs
idx=/tmp/filter-idx
if [ ! -f $d/queries.npy ]; then
  tms synth --out $d --docs "$docs" --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
fi
python3 -c "
import sys
with open('$d/meta.jsonl', 'w') as f:
    for i in range($docs):
        f.write('{\"tenant\": %d, \"g\": %d}\n' % (i % 200, i % 100000))
"
(nvidia-smi --query-gpu=name --format=csv,noheader || echo cpu) > "$out/gpu.txt"
rm -rf $idx
/usr/bin/time -f "index: %e s, %M KB" tms index --docs $d/docs.npy --doclens $d/doclens.npy \
  --doc-ids $d/doc_ids.txt --metadata $d/meta.jsonl --out $idx --keep-vectors --no-progress --no-estimate 2>&1 | tail -n 2
tms info --index $idx | grep -E "^(documents|metadata)" || true
cat $idx/vectors.f16 > /dev/null  # written with direct I/O: opens below start from a warm page cache
bench="tms bench search --index $idx --queries $d/queries.npy --device $dev --single 100 --concurrency 1"
$bench --json $out/unfiltered.json 2>&1 | tail -n 2
i=0
for f in "tenant < 160" "tenant < 100" "tenant < 40" "tenant < 10" "tenant = 7" "g = 7"; do
  i=$((i + 1))
  echo "filter: $f"
  $bench --filter "$f" --json $out/filter-$i.json 2>&1 | tail -n 2
done
rm -rf $idx
