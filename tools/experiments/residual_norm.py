#!/usr/bin/env python3
"""Does normalising decoded 2-bit residual vectors rank better?

PLAID decodes a token as centroid + bucket weights and L2-normalises the result before MaxSim;
TileMaxSim's compressed scoring uses centroid + residual as decoded, unnormalised. This scores
every document of a `tms synth` corpus both ways (numpy, fp32, no candidate generation), after a
spherical k-means (4 iterations, as the engine) and PLAID's 2-bit buckets (cutoffs at the
residual values' quartiles, weights at the octiles between them), and prints recall@10 of each
against exact MaxSim on the stored vectors.

  tms synth --out /tmp/syn5k --docs 5000 --queries 200 --min-doc-len 50 --max-doc-len 150
  python3 tools/experiments/residual_norm.py /tmp/syn5k [--centroids 2048]

Meant for small corpora (it holds every score in memory and runs on the CPU).
"""
import argparse

import numpy as np


def kmeans(sample, k, iters, rng):
    c = sample[rng.choice(len(sample), k, replace=False)].copy()
    for _ in range(iters):
        a = assign(sample, c)
        s = np.zeros_like(c)
        np.add.at(s, a, sample)
        nz = np.linalg.norm(s, axis=1) > 0
        c[nz] = s[nz] / np.linalg.norm(s[nz], axis=1, keepdims=True)
    return c


def assign(x, c):
    return np.concatenate([np.argmax(x[i:i + 65536] @ c.T, axis=1) for i in range(0, len(x), 65536)])


def maxsim(queries, tokens, starts):
    out = np.zeros((len(queries), len(starts)), np.float32)
    for qi, q in enumerate(queries):
        out[qi] = np.maximum.reduceat(q @ tokens.T, starts, axis=1).sum(0)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("corpus", help="a folder as `tms synth` writes it")
    ap.add_argument("--centroids", type=int, default=2048)
    ap.add_argument("--sample", type=int, default=262144, help="k-means sample (tokens)")
    args = ap.parse_args()
    x = np.load(f"{args.corpus}/docs.npy").astype(np.float32)
    lens = np.load(f"{args.corpus}/doclens.npy")
    queries = np.load(f"{args.corpus}/queries.npy").astype(np.float32)
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
    rng = np.random.default_rng(0)
    c = kmeans(x[rng.choice(len(x), min(len(x), args.sample), replace=False)], args.centroids, 4, rng)
    a = assign(x, c)
    r = x - c[a]
    vals = r[rng.choice(len(r), min(len(r), 200000), replace=False)].ravel()
    cut = np.quantile(vals, np.arange(1, 4) / 4)
    weights = np.quantile(vals, (np.arange(4) + 0.5) / 4)
    decoded = c[a] + weights[np.searchsorted(cut, r)]
    exact = np.argsort(-maxsim(queries, x, starts), axis=1)[:, :10]
    for name, d in (("as decoded", decoded),
                    ("normalised", decoded / np.linalg.norm(decoded, axis=1, keepdims=True))):
        top = np.argsort(-maxsim(queries, d, starts), axis=1)[:, :10]
        rec = np.mean([len(set(exact[i]) & set(top[i])) / 10 for i in range(len(top))])
        print(f"2-bit residual, {name}: recall@10 {rec:.4f} (every document scored)")
    print(f"mean norm of the decoded vectors: {np.linalg.norm(decoded, axis=1).mean():.4f}")


if __name__ == "__main__":
    main()
