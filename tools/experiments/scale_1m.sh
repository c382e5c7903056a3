#!/usr/bin/env bash
# #55 on a GPU machine, one device call: DOCS (1M) documents streamed into the index as they are
# generated (scale_stream.py; 2-bit residual, no vectors), the truth, `tms bench search`; the same
# corpus built from files (a whole-corpus training sample) and a pooled (factor 2) streamed build,
# each measured against the same truth. Files land in OUTDIR.
# Usage: [DOCS=1000000] scale_1m.sh OUTDIR      (tms on PATH; the corpus in /dev/shm)
set -uo pipefail
out=${1:?OUTDIR}
here=$(cd "$(dirname "$0")" && pwd)
n=${DOCS:-1000000}
d=/dev/shm/sc; rm -rf $d; mkdir -p "$out"
python3 $here/scale_stream.py --tms "$(command -v tms)" --docs $n --out $d --queries 1000 --save $d/files -- \
  --nbits 2 --device gpu | tee $out/scale-stream-$n-2bit.json
tms bench search --index $d/index --queries $d/queries.npy --truth $d/truth.run --device gpu \
  --json $out/scale-search-$n-2bit.json 2>&1 | tail -n 14
rm -rf $d/index
/usr/bin/time -v tms index --docs $d/files --out $d/files-index --nbits 2 --device gpu --no-progress --no-estimate \
  2> $d/f.log
grep -E "tms index|Maximum resident|Elapsed" $d/f.log | tee $out/files-build-$n-2bit.txt
rm -rf $d/files
tms bench search --index $d/files-index --queries $d/queries.npy --truth $d/truth.run --device gpu --single 0 \
  --concurrency 64 --json $out/files-search-$n-2bit.json 2>&1 | tail -n 8
rm -rf $d/files-index
python3 $here/scale_stream.py --tms "$(command -v tms)" --docs $n --out $d/p2 --queries 1000 --no-truth -- \
  --nbits 2 --device gpu --pool-factor 2 | tee $out/scale-stream-$n-2bit-pool2.json
tms bench search --index $d/p2/index --queries $d/queries.npy --truth $d/truth.run --device gpu --single 0 \
  --concurrency 64 --json $out/scale-search-$n-2bit-pool2.json 2>&1 | tail -n 8
rm -rf $d
