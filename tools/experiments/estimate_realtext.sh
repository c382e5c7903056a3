#!/usr/bin/env bash
# The recall estimate's recipes against real queries, one device call: the man pages
# alone (9,139 documents) and with the other sections' passages (50,002), both encoded by
# all-MiniLM-L6-v2 (realtext_encode.py, torch on the GPU), and `tms synth` 200K; PQ-16 + vectors
# indexes at the defaults; then estimate_check.sh on each (RECIPES as there).
# Usage: estimate_realtext.sh PREPDIR OUTDIR   (PREPDIR: realtext_prep.py --passages-from
#        /usr/share/man/man{1,2,3,4,5,7,8}; binaries packed by shared/tools/device-pack.sh)
set -uo pipefail
prep=${1:?PREPDIR}
out=${2:?OUTDIR}
mkdir -p "$out"
here=$(cd "$(dirname "$0")" && pwd)
build() {  # corpus dir, index dir
  tms index --docs "$1/docs.npy" --doclens "$1/doclens.npy" --doc-ids "$1/doc_ids.txt" --out "$2" --keep-vectors \
    --no-estimate --no-progress 2>&1 | tail -n 1
}
python3 "$here/realtext_encode.py" "$prep" /dev/shm/rt50 --device cuda 2>&1 | tail -n 1
python3 "$here/realtext_encode.py" "$prep" /dev/shm/rt9 --device cuda --limit 9139 2>&1 | tail -n 1
tms synth --out /dev/shm/syn200 --docs 200000 --queries 1000 --min-doc-len 50 --max-doc-len 150 2>&1 | tail -n 1
for c in rt9 rt50 syn200; do build /dev/shm/$c /tmp/idx-$c; done | tee "$out/indexes.txt"
"$here/estimate_check.sh" "$out" /tmp/idx-rt9:/dev/shm/rt9/queries.npy /tmp/idx-rt50:/dev/shm/rt50/queries.npy \
  /tmp/idx-syn200:/dev/shm/syn200/queries.npy
