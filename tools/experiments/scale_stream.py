#!/usr/bin/env python3
"""MS MARCO-shaped scale run that needs no input files: a synthetic corpus generated batch by batch
(seeded per batch, so it can be generated again), streamed into `tms index --docs -` (the index is
built as the documents come: nothing of the corpus is stored), then generated again to compute
the exhaustive top-k of the queries exactly (MaxSim over every document: torch on the GPU when
there is one, else numpy), which `tms bench search --truth` measures recall against.

Shape: document lengths like ColBERTv2's on MS MARCO (most 40-110 tokens, capped at 180), 32-token
queries, unit fp16 tokens from clustered topics with document-specific tokens (as `tms synth`).

  scale_stream.py --tms TMS --docs 8800000 --out DIR [--queries 1000] [-- tms index flags...]

Writes DIR/queries.npy, DIR/truth.run (TREC, qids 0..n-1), DIR/build.txt (the index's summary, its
time and peak RSS) and builds DIR/index; prints one JSON line of the build's figures.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

WORDS = 48  # words per topic


def cuda_torch():
    """torch when it has a GPU (the corpus's values are then drawn there: numpy alone draws about
    100M a second, an hour for MS MARCO), else None."""
    try:
        import torch
        return torch if torch.cuda.is_available() else None
    except ImportError:
        return None


class Corpus:
    def __init__(self, n_docs, dim, seed, batch):
        self.n, self.dim, self.seed, self.batch = n_docs, dim, seed, batch
        rng = np.random.default_rng(seed)
        self.n_topics = int(min(max(8, n_docs // 25), 16384))
        centers = unit(rng.standard_normal((self.n_topics, 1, dim), dtype=np.float32))
        words = unit(0.6 * centers + 0.8 * unit(rng.standard_normal((self.n_topics, WORDS, dim), dtype=np.float32)))
        self.words = words.reshape(-1, dim)  # [topics * WORDS, dim]
        self.torch = cuda_torch()
        if self.torch:
            self.words_dev = self.torch.from_numpy(self.words).cuda()

    def batches(self):
        for b0 in range(0, self.n, self.batch):
            yield b0, self.make(b0, min(self.n, b0 + self.batch))

    def make(self, d0, d1):
        """Documents [d0, d1): (tokens fp16 [t, dim], lengths int64 [d1 - d0]), the same every time."""
        rng = np.random.default_rng([self.seed, d0])
        n = d1 - d0
        lens = np.clip(np.rint(rng.normal(75, 25, n)), 8, 180).astype(np.int64)
        topic = rng.integers(0, self.n_topics, n)
        t = int(lens.sum())
        doc_of = np.repeat(np.arange(n), lens)
        word = topic[doc_of] * WORDS + rng.integers(0, WORDS, t)
        mine = rng.random(t) < 0.25  # document-specific tokens
        sd = 0.45 / np.sqrt(self.dim)
        if self.torch:
            th = self.torch
            g = th.Generator(device="cuda").manual_seed(int(rng.integers(0, 2**62)))
            x = self.words_dev[th.from_numpy(word).cuda()] + sd * th.randn((t, self.dim), generator=g, device="cuda")
            own = th.randn((n, self.dim), generator=g, device="cuda")
            own = own / own.norm(dim=1, keepdim=True)
            m = th.from_numpy(mine).cuda()
            r = th.randn((int(mine.sum()), self.dim), generator=g, device="cuda")
            x[m] = 0.7 * own[th.from_numpy(doc_of[mine]).cuda()] + 0.7 * r / r.norm(dim=1, keepdim=True)
            x = x / x.norm(dim=1, keepdim=True)
            return x.half().cpu().numpy(), lens
        x = self.words[word] + sd * rng.standard_normal((t, self.dim), dtype=np.float32)
        own = unit(rng.standard_normal((n, self.dim), dtype=np.float32))
        x[mine] = 0.7 * own[doc_of[mine]] + 0.7 * unit(rng.standard_normal((int(mine.sum()), self.dim),
                                                                           dtype=np.float32))
        return unit(x).astype(np.float16), lens


def write_npy(f, a):
    """np.save to a pipe (np.save asks a file object for its position, which a pipe has not)."""
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(a))
    f.write(memoryview(np.ascontiguousarray(a)).cast("B"))


def unit(x):
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def make_queries(corpus, n_queries, q_tokens, seed):
    """Queries from documents spread over the corpus: noisy copies of a few of their tokens and
    words of their topic (as tms synth's)."""
    rng = np.random.default_rng([seed, 7])
    rel = np.sort(rng.choice(corpus.n, size=n_queries, replace=False))
    out = np.zeros((n_queries, q_tokens, corpus.dim), dtype=np.float32)
    made = (-1, None, None)  # the batch generated last (rel is sorted: each batch once)
    for q, d in enumerate(rel):
        b0 = d // corpus.batch * corpus.batch
        if made[0] != b0:
            made = (b0, *corpus.make(b0, min(corpus.n, b0 + corpus.batch)))
        _, toks, lens = made
        off = np.concatenate([[0], np.cumsum(lens)])
        doc = toks[off[d - b0]:off[d - b0 + 1]].astype(np.float32)
        pick = doc[rng.integers(0, len(doc), q_tokens)]
        noise = rng.standard_normal((q_tokens, corpus.dim), dtype=np.float32) / np.sqrt(corpus.dim)
        out[q] = unit(pick + 0.8 * noise)
    return out.astype(np.float16), rel


def block_scores(queries, toks, lens, qd, torch):
    """MaxSim of every query against each document of a block: [nq, n_docs]."""
    nq, qt, dim = queries.shape
    n = len(lens)
    if qd is not None:
        sim = qd @ torch.from_numpy(toks).cuda().float().T  # [nq * qt, t], fp32 as the engine accumulates
        seg = torch.repeat_interleave(torch.arange(n, device="cuda"), torch.from_numpy(lens).cuda())
        mx = torch.full((nq * qt, n), -65504.0, device="cuda", dtype=sim.dtype)
        mx.scatter_reduce_(1, seg.expand(nq * qt, -1), sim, reduce="amax")
        return mx.float().view(nq, qt, n).sum(1).cpu().numpy()
    sim = queries.reshape(-1, dim).astype(np.float32) @ toks.astype(np.float32).T
    off = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return np.maximum.reduceat(sim, off, axis=1).reshape(nq, qt, n).sum(1)


def exact_topk(corpus, queries, k):
    """The exhaustive top-k (MaxSim over every document) of each query, generating the corpus again."""
    dev = "cuda" if corpus.torch else None
    nq, qt, dim = queries.shape
    best_s = np.full((nq, k), -np.inf, dtype=np.float32)
    best_d = np.full((nq, k), -1, dtype=np.int64)
    if dev:
        torch = corpus.torch
        torch.backends.cuda.matmul.allow_tf32 = False
        qd = torch.from_numpy(queries.reshape(-1, dim)).to(dev).float()
    # Scored in blocks of whole documents whose similarity matrix [nq * qt, tokens] stays small.
    room = ((4 << 30) if dev else (256 << 20)) // (4 * nq * qt)
    for b0, (all_toks, all_lens) in corpus.batches():
        ends = np.cumsum(all_lens)
        first = 0
        while first < len(all_lens):
            t0 = 0 if first == 0 else int(ends[first - 1])
            last = max(first + 1, int(np.searchsorted(ends, t0 + room, side="right")))
            toks, lens = all_toks[t0:int(ends[last - 1])], all_lens[first:last]
            scores = block_scores(queries, toks, lens, qd if dev else None, corpus.torch)
            n = len(lens)
            cat_s = np.concatenate([best_s, scores], axis=1)
            cat_d = np.concatenate([best_d, np.broadcast_to(np.arange(b0 + first, b0 + first + n), (nq, n))], axis=1)
            # best k, ties to the lower document (the engine's order)
            order = np.lexsort((cat_d, -cat_s), axis=1)[:, :k]
            best_s = np.take_along_axis(cat_s, order, 1)
            best_d = np.take_along_axis(cat_d, order, 1)
            first = last
    return best_d, best_s


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tms", required=True)
    ap.add_argument("--docs", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--queries", type=int, default=1000)
    ap.add_argument("--q-tokens", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=20000, help="documents per generated batch")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--no-truth", action="store_true")
    ap.add_argument("--save", help="also write the corpus here as shards (docs_*.npy + doclens_*.npy, what "
                                   "`tms index --docs DIR` reads): a build from files to compare the stream with")
    args, index_flags = ap.parse_known_args()
    index_flags = [f for f in index_flags if f != "--"]
    os.makedirs(args.out, exist_ok=True)
    corpus = Corpus(args.docs, args.dim, args.seed, args.batch)
    expected = int(args.docs * 75)
    cmd = ["/usr/bin/time", "-v", args.tms, "index", "--docs", "-", "--out", f"{args.out}/index", "--overwrite",
           "--no-progress", "--no-estimate", "--expected-tokens", str(expected)] + index_flags
    t0 = time.time()
    p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    tokens = 0
    try:
        if args.save:
            os.makedirs(args.save, exist_ok=True)
        for b0, (toks, lens) in corpus.batches():
            tokens += len(toks)
            write_npy(p.stdin, toks)
            write_npy(p.stdin, lens)
            if args.save:
                np.save(f"{args.save}/docs_{b0 // args.batch:06d}.npy", toks)
                np.save(f"{args.save}/doclens_{b0 // args.batch:06d}.npy", lens)
        p.stdin.close()
    except BrokenPipeError:
        pass
    err = p.stderr.read().decode()
    rc = p.wait()
    wall = time.time() - t0
    with open(f"{args.out}/build.txt", "w") as f:
        f.write(err)
    if rc != 0:
        sys.exit(f"scale_stream: tms index failed ({rc}):\n{err}")
    rss_kb = int(next(line.split()[-1] for line in err.splitlines() if "Maximum resident set size" in line))
    summary = [line for line in err.splitlines() if line.startswith("tms index:")]
    size = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(f"{args.out}/index") for f in fs)
    result = {"docs": args.docs, "tokens": tokens, "build_s": round(wall, 2), "tokens_per_s": round(tokens / wall),
              "peak_rss_gb": round(rss_kb / 2**20, 3), "index_gb": round(size / 1e9, 3),
              "bytes_per_token": round(size / tokens, 2), "index_flags": index_flags, "summary": summary}
    queries, rel = make_queries(corpus, args.queries, args.q_tokens, args.seed)
    np.save(f"{args.out}/queries.npy", queries)
    if not args.no_truth:
        t1 = time.time()
        best_d, best_s = exact_topk(corpus, queries, args.k)
        with open(f"{args.out}/truth.run", "w") as f:
            for q in range(len(queries)):
                for r in range(args.k):
                    if best_d[q, r] >= 0:
                        f.write(f"{q} Q0 {best_d[q, r]} {r + 1} {best_s[q, r]:.6f} exact\n")
        result["truth_s"] = round(time.time() - t1, 2)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
