"""fast-plaid on the same embeddings as a tms benchmark, one JSON row in `tms bench search`'s schema.

Builds a fast-plaid index (PyPI fast-plaid, built for the machine's torch) from docs.npy +
doclens.npy (per-document views of the memory-mapped array), searches queries.npy in one call
(batch queries/s) and one query at a time (p50 / p99), and scores recall@k against a TREC run
taken as the truth (qids 0, 1, ... in query order, as `tms bench search --truth-out` writes it).

  python3 fast_plaid_peer.py --corpus DIR --truth exact.trec --out row.json [--nbits 2] [--k 10]
      [--queries Q.npy]

`tms bench search --peer fast-plaid` runs it in the same call, on a temporary copy of its truth.

DIR holds docs.npy, doclens.npy, doc_ids.txt and queries.npy (`tms synth`'s layout).
"""
import argparse
import json
import os
import shutil
import time
from importlib import metadata

import numpy as np
import torch
from fast_plaid import search


def read_truth(path, k):
    truth = {}
    for line in open(path):
        qid, _, doc, rank, _, _ = line.split()
        if int(rank) <= k:
            truth.setdefault(int(qid), set()).add(doc)
    return truth


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", required=True)
    ap.add_argument("--truth", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--queries", help="query embeddings .npy (default: DIR/queries.npy)")
    ap.add_argument("--index", default="/tmp/fast-plaid-index")
    ap.add_argument("--nbits", type=int, default=2)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--single", type=int, default=100, help="one-query calls for p50 / p99")
    a = ap.parse_args()
    docs = np.load(os.path.join(a.corpus, "docs.npy"), mmap_mode="r")
    lens = np.load(os.path.join(a.corpus, "doclens.npy")).astype(np.int64)
    ids = open(os.path.join(a.corpus, "doc_ids.txt")).read().split()
    queries = torch.from_numpy(np.load(a.queries or os.path.join(a.corpus, "queries.npy"))).to("cuda")
    offsets = np.concatenate([[0], np.cumsum(lens)])
    tensors = [torch.from_numpy(np.asarray(docs[offsets[i]:offsets[i + 1]])) for i in range(len(lens))]
    shutil.rmtree(a.index, ignore_errors=True)
    fp = search.FastPlaid(index=a.index, device="cuda")
    t0 = time.perf_counter()
    fp.create(documents_embeddings=tensors, nbits=a.nbits)
    build_s = time.perf_counter() - t0
    index_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(a.index) for f in fs)
    fp.search(queries_embeddings=queries[:8], top_k=a.k, show_progress=False)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    res = fp.search(queries_embeddings=queries, top_k=a.k, show_progress=False)
    batch_s = time.perf_counter() - t0
    lat = []
    for i in range(min(a.single, len(queries))):
        t0 = time.perf_counter()
        fp.search(queries_embeddings=queries[i:i + 1], top_k=a.k, show_progress=False)
        lat.append((time.perf_counter() - t0) * 1e3)
    truth = read_truth(a.truth, a.k)
    hit = sum(len(truth.get(q, set()) & {ids[d] for d, _ in r[:a.k]}) for q, r in enumerate(res))
    total = sum(len(v) for v in truth.values())
    row = {"system": "fast-plaid-" + metadata.version("fast-plaid"), "index": f"residual{a.nbits}",
           "batch_qps": round(len(queries) / batch_s, 1), "p50_ms": round(float(np.percentile(lat, 50)), 3),
           "p99_ms": round(float(np.percentile(lat, 99)), 3), "concurrent_qps_64": None,
           "recall_at_10": round(hit / max(total, 1), 4), "build_s": round(build_s, 1), "index_bytes": index_bytes}
    json.dump(row, open(a.out, "w"))
    print(json.dumps(row))


if __name__ == "__main__":
    main()
