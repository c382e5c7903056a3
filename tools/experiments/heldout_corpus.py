#!/usr/bin/env python3
"""Corpora unlike `tms synth`, for measuring the default search's recall where the synthetic
corpus flatters it (tools/experiments/heldout_recall.sh runs them):

  noisy96   dim 96, fp32, not normalised, heavy noise around few topics, lengths 1-300,
            10% of documents exact duplicates of others, queries of 32 tokens (a document's
            tokens with noise, the rest padding copies as ColBERT's [MASK] tokens are);
  unit160   dim 160, fp16, unit tokens, many small topics, lengths 4-60, queries of 24 tokens
            drawn from several documents of one topic.

  heldout_corpus.py KIND OUT_DIR [--docs N] [--queries N] [--seed S]
writes OUT_DIR/docs.npy, doclens.npy, queries.npy."""
import argparse
import os

import numpy as np


def noisy96(rng, n_docs, n_queries, noise=1.5):
    dim, topics = 96, 40
    centers = rng.standard_normal((topics, dim)).astype(np.float32) * 2.0
    lens = rng.integers(1, 301, n_docs)
    docs = []
    for n in lens:
        own = rng.choice(topics, size=3, replace=False)  # a document mixes three topics
        x = centers[rng.choice(own, size=n)] + noise * rng.standard_normal((n, dim)).astype(np.float32)
        docs.append(x * rng.uniform(0.5, 2.0))  # token norms vary by document
    dup = rng.choice(n_docs, size=n_docs // 10, replace=False)
    for i in dup:  # exact duplicates of other documents
        docs[i] = docs[int(rng.integers(0, n_docs))].copy()
    q = np.zeros((n_queries, 32, dim), np.float32)
    for i in range(n_queries):
        d = docs[int(rng.integers(0, n_docs))]
        take = min(len(d), int(rng.integers(4, 20)))
        rows = d[rng.choice(len(d), size=take, replace=False)] + 1.0 * rng.standard_normal((take, dim))
        q[i, :take] = rows
        q[i, take:] = rows.mean(axis=0)  # padding: one vector repeated, as [MASK] tokens tend to be
    return docs, q


def unit160(rng, n_docs, n_queries):
    dim, topics = 160, 2000
    centers = rng.standard_normal((topics, dim)).astype(np.float32)
    lens = rng.integers(4, 61, n_docs)
    doc_topic = rng.integers(0, topics, n_docs)
    docs = []
    for n, t in zip(lens, doc_topic):
        sub = centers[(t + rng.integers(0, 3, n)) % topics]  # a topic and its neighbours
        x = sub + 0.8 * rng.standard_normal((n, dim)).astype(np.float32)
        docs.append(x / np.linalg.norm(x, axis=1, keepdims=True))
    q = np.zeros((n_queries, 24, dim), np.float32)
    for i in range(n_queries):
        t = int(rng.integers(0, topics))
        x = centers[(t + rng.integers(0, 3, 24)) % topics] + 0.9 * rng.standard_normal((24, dim))
        q[i] = x / np.linalg.norm(x, axis=1, keepdims=True)
    return docs, q.astype(np.float16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("kind", choices=["noisy96", "unit160"])
    ap.add_argument("out")
    ap.add_argument("--docs", type=int, default=8000)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--noise", type=float, default=1.5, help="noisy96: the tokens' noise (topic centres: 2)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    docs, q = noisy96(rng, a.docs, a.queries, a.noise) if a.kind == "noisy96" else unit160(rng, a.docs, a.queries)
    os.makedirs(a.out, exist_ok=True)
    dtype = np.float32 if a.kind == "noisy96" else np.float16
    np.save(os.path.join(a.out, "docs.npy"), np.concatenate(docs).astype(dtype))
    np.save(os.path.join(a.out, "doclens.npy"), np.array([len(d) for d in docs], np.int64))
    np.save(os.path.join(a.out, "queries.npy"), q)
    print(f"{a.kind}: {len(docs)} documents, {sum(len(d) for d in docs)} tokens, {len(q)} queries -> {a.out}")


if __name__ == "__main__":
    main()
