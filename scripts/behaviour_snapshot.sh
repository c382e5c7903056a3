#!/usr/bin/env bash
# Runs a fixed set of tms commands (1 and 3 shards, PQ and residual, with and without stored
# vectors, approximate and exhaustive, --filter and --subset, add/delete/compact) and writes their
# outputs under OUT, so that two builds can be compared byte for byte:
#   scripts/behaviour_snapshot.sh OLD_TMS /tmp/a && scripts/behaviour_snapshot.sh NEW_TMS /tmp/b
#   diff -r /tmp/a/out /tmp/b/out
# DEVICE (default cpu) picks where the searches run. A refactoring that moves code leaves the
# outputs identical; anything else is a behaviour change to explain.
set -euo pipefail
if [[ $# -lt 2 ]]; then
  echo "usage: $0 TMS OUT [DEVICE]" >&2
  exit 2
fi
TMS=$(realpath "$1")
OUT=$2
DEVICE=${3:-cpu}
rm -rf "$OUT"
mkdir -p "$OUT/work" "$OUT/out"
W=$OUT/work
R=$OUT/out
export TMS_LOG_LEVEL=warning

"$TMS" synth --out "$W/c" --docs 3000 --queries 40 --dim 64 --seed 7 --min-doc-len 4 \
  --max-doc-len 120 > /dev/null
python3 - "$W" <<'EOF'
import json, sys
w = sys.argv[1]
ids = [l.strip() for l in open(f"{w}/c/doc_ids.txt")] if __import__("os").path.exists(f"{w}/c/doc_ids.txt") else [str(i) for i in range(3000)]
with open(f"{w}/meta.jsonl", "w") as f:
    for i in range(3000):
        f.write(json.dumps({"tenant": i % 7, "year": 2000 + i % 25, "lang": ["en", "de", "fr"][i % 3]}) + "\n")
with open(f"{w}/subset.txt", "w") as f:
    for i in range(0, 3000, 5):
        f.write(f"{ids[i]}\n")
with open(f"{w}/delete.txt", "w") as f:
    for i in range(0, 3000, 11):
        f.write(f"{ids[i]}\n")
EOF
ls "$W/c" > "$R/synth-files.txt"

docs=$W/c/docs.npy
doclens=$W/c/doclens.npy
queries=$W/c/queries.npy
[[ -f $docs ]] || { echo "$0: synth wrote no $docs" >&2; exit 1; }

index() {  # NAME FLAGS...
  local name=$1
  shift
  "$TMS" index --docs "$docs" --doclens "$doclens" --doc-ids "$W/c/doc_ids.txt" --out "$W/$name" --threads 2 --device "$DEVICE" \
    --no-progress --metadata "$W/meta.jsonl" "$@" > "$R/$name.index.txt" 2>&1
  "$TMS" info --index "$W/$name" | grep -v -e $'^index\t' -e '^path' -e 'bytes' -e 'MiB' -e 'GiB' -e '^estimate_measured_at' \
    > "$R/$name.info.txt" || true
}
search() {  # NAME TAG FLAGS...
  local name=$1 tag=$2
  shift 2
  "$TMS" search --index "$W/$name" --queries "$queries" --out "$R/$name.${PHASE:-}$tag.run" --k 20 \
    --device "$DEVICE" --no-progress "$@" > /dev/null 2>&1 || echo "exit $?" > "$R/$name.${PHASE:-}$tag.err"
}
searches() {  # NAME [exhaustive]
  local name=$1
  search "$name" approx
  search "$name" fixed --target-recall 0 --nprobe 4 --ncandidates 256 --rerank 64
  search "$name" interaction --target-recall 0 --pruning interaction
  search "$name" filter --filter "tenant = 3 AND year >= 2010"
  search "$name" filter-text --filter "lang = 'de'" --target-recall 0
  search "$name" subset --subset "$W/subset.txt"
  if [[ ${2:-} == exhaustive ]]; then
    search "$name" exhaustive --exhaustive
    search "$name" exhaustive-filter --exhaustive --filter "tenant = 5"
  fi
}

index pq1 --keep-vectors --centroids 256 --shards 1
searches pq1 exhaustive
index res3 --keep-vectors --nbits 2 --centroids 256 --shards 3
searches res3 exhaustive
index pq3c --centroids 128 --shards 3 --pq-m 16 --no-estimate
searches pq3c

for name in pq1 res3; do
  "$TMS" delete --index "$W/$name" --doc-ids "$W/delete.txt" > "$R/$name.delete.txt" 2>&1
  PHASE=after-delete. searches "$name" exhaustive
  "$TMS" compact --index "$W/$name" > "$R/$name.compact.txt" 2>&1
  search "$name" after-compact
  search "$name" after-compact-exhaustive --exhaustive
done
# Re-add the deleted documents (their rows of the corpus) to the compacted index.
python3 - "$W" <<'EOF'
# Without numpy (the GPU machine may lack it): .npy headers read and written by hand.
import ast, struct, sys
w = sys.argv[1]
def load(path):
    b = open(path, "rb").read()
    n = 2 if b[6] == 1 else 4
    hl = int.from_bytes(b[8:8 + n], "little")
    start = 8 + n + hl
    h = ast.literal_eval(b[8 + n:start].decode("latin1"))
    return h["descr"], h["shape"], b[start:]
def save(path, descr, shape, payload):
    dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
    h = "{'descr': '%s', 'fortran_order': False, 'shape': (%s), }" % (descr, dims)
    h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
    open(path, "wb").write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode("latin1") + payload)
ld, lshape, lb = load(f"{w}/c/doclens.npy")
size = int(ld[-1])
lens = [int.from_bytes(lb[i * size:(i + 1) * size], "little") for i in range(lshape[0])]
dd, dshape, db = load(f"{w}/c/docs.npy")
row = dshape[1] * int(dd[-1])
off = [0]
for n in lens:
    off.append(off[-1] + n)
pick = list(range(0, len(lens), 11))
save(f"{w}/add_docs.npy", dd, (sum(lens[i] for i in pick), dshape[1]),
     b"".join(db[off[i] * row:off[i + 1] * row] for i in pick))
save(f"{w}/add_lens.npy", ld, (len(pick),), b"".join(lb[i * size:(i + 1) * size] for i in pick))
EOF
"$TMS" add --index "$W/pq1" --docs "$W/add_docs.npy" --doclens "$W/add_lens.npy" \
  --doc-ids "$W/delete.txt" > "$R/pq1.add.txt" 2>&1
search pq1 after-add
search pq1 after-add-exhaustive --exhaustive
search pq1 after-add-filter --filter "tenant = 3"
# Timings differ from run to run; everything else must not.
sed -i -E 's/[0-9]+(\.[0-9]+)? ?(s|ms|µs|us|min)\b/T/g; s/[0-9.]+ (docs|tokens|queries)\/s/R/g' \
  "$R"/*.txt
echo "$OUT/out: $(ls "$R" | wc -l) files"
