#!/usr/bin/env bash
# GPU validation in one call on the GPU machine (binaries packed by shared/tools/device-pack.sh):
# CUDA tests, CPU tests, then the demo and a 20K-document end to end on GPU and on CPU.
# Usage: gpu_e2e.sh OUTDIR
set -uo pipefail
out=${1:?OUTDIR}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== CUDA tests"; tms_cuda_tests 2>&1 | tail -n 25 | tee "$out/cuda_tests.txt"
echo "== CPU tests"; tms_tests --gtest_brief=1 2>&1 | tail -n 5 | tee "$out/cpu_tests.txt"
for dev in gpu cpu; do
  echo "== demo --device $dev"; tms demo --device $dev --dir /tmp/demo-$dev 2>&1 | tee "$out/demo-$dev.txt"
done
d=/tmp/e2e
tms synth --out $d --docs 20000 --queries 500
tms index --docs $d/docs.npy --doclens $d/doclens.npy --doc-ids $d/doc_ids.txt --out $d/index --keep-vectors \
  --no-progress 2>&1 | tee "$out/index.txt"
for dev in gpu cpu; do
  for mode in "" --exhaustive; do
    tag=$dev${mode:+-exh}
    tms search --index $d/index --queries $d/queries.npy --query-ids $d/query_ids.txt --out $d/$tag.trec \
      --k 100 --device $dev $mode 2>&1 | tee -a "$out/search.txt"
    echo "== $tag" >> "$out/eval.txt"; tms eval --run $d/$tag.trec --qrels $d/qrels.tsv >> "$out/eval.txt"
  done
done
cat "$out/eval.txt"
