#!/usr/bin/env python3
"""Encode a realtext_prep.py folder into ColBERT-shaped token embeddings.

A plain BERT forward pass of all-MiniLM-L6-v2 (6 post-LN layers, hidden 384,
12 heads, exact-erf GELU) runs over every document and query, batched by
length; a sequence attends only to its own wordpieces.  Then, as ColBERT does:

  documents  every wordpiece's final hidden state except padding and pure
             punctuation ([CLS] and [D] stay);
  queries    all 32 positions, the [MASK] padding included; the [MASK]s attend
             to the query's wordpieces but are not attended to (ColBERT's
             default, attend_to_mask_tokens=False);

are projected to --dim by a PCA fitted on a sample of document token vectors
(standing in for ColBERT's learned 768 -> 128 linear layer; uncentred unless
--center) and L2-normalised.

OUTDIR gets exactly what `tms synth` writes:
  docs.npy       float16 [n_tokens, dim]
  doclens.npy    int32 [n_docs]
  doc_ids.txt    one id per line
  queries.npy    float16 [n_queries, 32, dim]
  query_ids.txt  one id per line
  qrels.tsv      BEIR TSV with header (query-id, corpus-id, score)
plus encode.json (settings, counts, timings).

torch runs it on cuda (or cpu); without torch, a numpy path does the same
arithmetic (slow: meant for a --limit subset).  The stored hidden states of
the first few documents and queries are recomputed, one at a time, by the
numpy path and by Hugging Face's BertModel (when transformers is installed),
and must agree (cosine >= 0.999) or nothing is written.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np

QUERY_LEN = 32


def die(msg):
    sys.exit(f"realtext_encode.py: {msg}")


# --------------------------------------------------------------------------
# numpy BERT (fp32), the reference path
# --------------------------------------------------------------------------

def erf(x):
    """Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7): numpy has no erf."""
    s = np.sign(x)
    a = np.abs(x)
    t = 1.0 / (1.0 + 0.3275911 * a)
    y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t
                - 0.284496736) * t + 0.254829592) * t * np.exp(-a * a)
    return s * y


def gelu(x):
    """BERT's "gelu": the exact erf form, not the tanh approximation."""
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


class NumpyBert:
    """fp32 BERT encoder over the (float16-stored) weights of model.npz."""

    def __init__(self, weights, cfg):
        self.w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()
                  if k not in ("vocab_ids", "punct")}
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]

    def __call__(self, ids, lens):
        """ids int [B, L], lens int [B] -> final hidden states float32 [B, L, H].
        Keys at positions >= lens are masked out; those positions' own outputs
        are still computed (queries keep them for their [MASK]s)."""
        w, B, L = self.w, ids.shape[0], ids.shape[1]
        x = (w["embeddings.word_embeddings.weight"][ids]
             + w["embeddings.position_embeddings.weight"][:L][None]
             + w["embeddings.token_type_embeddings.weight"][0])
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"],
                       self.eps)
        H = x.shape[-1]
        d = H // self.heads
        # Additive key mask: -inf-like for keys past each sequence's length.
        bias = np.where(np.arange(L)[None, :] < lens[:, None], 0.0, -1e9).astype(np.float32)
        bias = bias[:, None, None, :]
        for i in range(self.layers):
            p = f"encoder.layer.{i}."
            lin = lambda t, n: t @ w[p + n + ".weight"].T + w[p + n + ".bias"]
            split = lambda t: t.reshape(B, L, self.heads, d).transpose(0, 2, 1, 3)
            q = split(lin(x, "attention.self.query"))
            k = split(lin(x, "attention.self.key"))
            v = split(lin(x, "attention.self.value"))
            s = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(B, L, H)
            x = layer_norm(x + lin(ctx, "attention.output.dense"),
                           w[p + "attention.output.LayerNorm.weight"],
                           w[p + "attention.output.LayerNorm.bias"], self.eps)
            h = gelu(lin(x, "intermediate.dense"))
            x = layer_norm(x + lin(h, "output.dense"), w[p + "output.LayerNorm.weight"],
                           w[p + "output.LayerNorm.bias"], self.eps)
        return x


# --------------------------------------------------------------------------
# torch BERT, same arithmetic
# --------------------------------------------------------------------------

class TorchBert:
    def __init__(self, weights, cfg, device, fp16):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.device = torch.device(device)
        self.fp16 = fp16 and self.device.type == "cuda"
        self.w = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)).to(self.device)
                  for k, v in weights.items() if k not in ("vocab_ids", "punct")}
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.eps = cfg["layer_norm_eps"]

    def __call__(self, ids, lens):
        torch, F, w = self.torch, self.F, self.w
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16,
                                                    enabled=self.fp16):
            ids = torch.from_numpy(ids.astype(np.int64)).to(self.device)
            lens = torch.from_numpy(lens.astype(np.int64)).to(self.device)
            B, L = ids.shape
            x = (w["embeddings.word_embeddings.weight"][ids]
                 + w["embeddings.position_embeddings.weight"][:L][None]
                 + w["embeddings.token_type_embeddings.weight"][0])
            H = x.shape[-1]
            x = F.layer_norm(x, (H,), w["embeddings.LayerNorm.weight"],
                             w["embeddings.LayerNorm.bias"], self.eps)
            d = H // self.heads
            keep = (torch.arange(L, device=self.device)[None, :] < lens[:, None])
            keep = keep[:, None, None, :]          # [B, 1, 1, L]: which keys count
            for i in range(self.layers):
                p = f"encoder.layer.{i}."
                lin = lambda t, n: F.linear(t, w[p + n + ".weight"], w[p + n + ".bias"])
                split = lambda t: t.view(B, L, self.heads, d).transpose(1, 2)
                q = split(lin(x, "attention.self.query"))
                k = split(lin(x, "attention.self.key"))
                v = split(lin(x, "attention.self.value"))
                ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)
                ctx = ctx.transpose(1, 2).reshape(B, L, H)
                x = F.layer_norm(x + lin(ctx, "attention.output.dense"), (H,),
                                 w[p + "attention.output.LayerNorm.weight"],
                                 w[p + "attention.output.LayerNorm.bias"], self.eps)
                h = F.gelu(lin(x, "intermediate.dense"))          # exact erf GELU
                x = F.layer_norm(x + lin(h, "output.dense"), (H,),
                                 w[p + "output.LayerNorm.weight"],
                                 w[p + "output.LayerNorm.bias"], self.eps)
            return x.float().cpu().numpy()


def hf_reference(weights, cfg):
    """Hugging Face's BertModel over the same (pruned, float16-stored) weights
    as a callable like NumpyBert's, in float32 on the CPU; None without
    transformers.  An independent implementation to check ours against."""
    try:
        import torch
        from transformers import BertConfig, BertModel
    except ImportError:
        return None
    conf = BertConfig(vocab_size=weights["embeddings.word_embeddings.weight"].shape[0],
                      hidden_size=cfg["hidden_size"],
                      num_hidden_layers=cfg["num_hidden_layers"],
                      num_attention_heads=cfg["num_attention_heads"],
                      intermediate_size=cfg["intermediate_size"],
                      hidden_act=cfg["hidden_act"], layer_norm_eps=cfg["layer_norm_eps"],
                      max_position_embeddings=cfg["max_position_embeddings"],
                      type_vocab_size=2)
    m = BertModel(conf, add_pooling_layer=False).eval()
    state = {k: torch.from_numpy(np.asarray(v, dtype=np.float32)) for k, v in weights.items()
             if k not in ("vocab_ids", "punct")}
    missing, unexpected = m.load_state_dict(state, strict=False)
    if unexpected or any(not k.endswith("_ids") for k in missing):
        die(f"model.npz does not fit BertModel (missing {missing}, unexpected {unexpected})")

    def run(ids, lens):
        L = ids.shape[1]
        mask = (np.arange(L)[None, :] < lens[:, None]).astype(np.int64)
        with torch.inference_mode():
            out = m(input_ids=torch.from_numpy(ids.astype(np.int64)),
                    attention_mask=torch.from_numpy(mask),
                    token_type_ids=torch.zeros(ids.shape, dtype=torch.int64))
        return out.last_hidden_state.numpy()
    return run


def min_cosine(a, b):
    a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
    return float((np.sum(a * b, -1) / np.linalg.norm(a, axis=-1)
                  / np.linalg.norm(b, axis=-1)).min())


# --------------------------------------------------------------------------
# batching
# --------------------------------------------------------------------------

def length_batches(lens, batch_tokens, max_batch):
    """Index batches of similar length (sorted), each padded to its longest
    member with at most batch_tokens padded positions or max_batch sequences."""
    order = np.argsort(lens, kind="stable")[::-1]
    batches, cur = [], []
    for i in order:
        longest = lens[cur[0]] if cur else lens[i]
        if cur and ((len(cur) + 1) * longest > batch_tokens or len(cur) >= max_batch):
            batches.append(np.array(cur))
            cur = []
        cur.append(i)
    if cur:
        batches.append(np.array(cur))
    return batches


def run_encoder(model, seqs, lens, attend, batch_tokens, pad_id, keep_fn, out, offsets,
                label):
    """Run model over variable-length sequences and scatter the kept hidden
    states into out[offsets[i]:...] (float16), in sequence order.
    Sequence i is lens[i] wordpieces long and attends to its first attend[i]
    (documents: all of them; queries: all but the [MASK] padding).
    keep_fn(ids [n], hidden [n, H]) -> rows to keep, for one sequence."""
    t0, done = time.time(), 0
    batches = length_batches(lens, batch_tokens, 4096)
    for bi, idx in enumerate(batches):
        L = int(lens[idx].max())
        ids = np.full((len(idx), L), pad_id, dtype=np.int64)
        for r, i in enumerate(idx):
            ids[r, :lens[i]] = seqs[i][:lens[i]]
        h = model(ids, attend[idx].astype(np.int64))
        for r, i in enumerate(idx):
            n = int(lens[i])
            rows = keep_fn(ids[r, :n], h[r, :n])
            out[offsets[i]:offsets[i] + len(rows)] = rows
        done += len(idx)
        if bi % 50 == 49 or bi == len(batches) - 1:
            print(f"  {label}: {done}/{len(lens)} sequences, {time.time() - t0:.1f} s",
                  flush=True)


# --------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(
        description="Encode a realtext_prep.py folder with all-MiniLM-L6-v2 into "
                    "ColBERT-shaped, PCA-projected, L2-normalised float16 token "
                    "embeddings in `tms synth`'s layout.")
    ap.add_argument("prepdir", help="folder written by realtext_prep.py")
    ap.add_argument("outdir", help="output folder (created; existing files replaced)")
    ap.add_argument("--dim", type=int, default=128,
                    help="projected dimension, 32..hidden size (default: %(default)s)")
    ap.add_argument("--device", default=None,
                    help="cuda, cpu (both torch) or numpy (default: cuda if torch sees a "
                         "GPU, else cpu if torch is installed, else numpy)")
    ap.add_argument("--fp16", action="store_true",
                    help="float16 autocast on cuda (default: float32)")
    ap.add_argument("--limit", type=int, default=0,
                    help="encode only the first N documents and the queries whose "
                         "relevant documents include one of them (0: all)")
    ap.add_argument("--pca-sample", type=int, default=200000,
                    help="document token vectors the PCA is fitted on (default: %(default)s)")
    ap.add_argument("--center", action="store_true",
                    help="subtract the sample mean before projecting (textbook PCA; "
                         "default: uncentred, a bias-free linear map like ColBERT's)")
    ap.add_argument("--batch-tokens", type=int, default=0,
                    help="padded wordpieces per forward batch (default: 65536 on cuda, "
                         "8192 otherwise)")
    ap.add_argument("--seed", type=int, default=0, help="PCA sample seed (default: %(default)s)")
    ap.add_argument("--no-check", action="store_true",
                    help="skip recomputing a few sequences with the reference implementations")
    args = ap.parse_args()

    prep, out = Path(args.prepdir), Path(args.outdir)
    for f in ("meta.json", "tokens.npz", "model.npz", "doc_ids.txt", "query_ids.txt",
              "qrels.txt"):
        if not (prep / f).is_file():
            die(f"{prep} has no {f}: is it a realtext_prep.py folder?")
    meta = json.loads((prep / "meta.json").read_text())
    cfg = meta["config"]
    H = cfg["hidden_size"]
    if not 32 <= args.dim <= H:
        die(f"--dim must be in 32..{H}, got {args.dim}")
    if args.limit < 0:
        die(f"--limit must be >= 0, got {args.limit}")
    if args.batch_tokens < 0 or args.pca_sample < args.dim:
        die("--batch-tokens must be >= 0 and --pca-sample >= --dim")

    # --- backend -----------------------------------------------------------
    try:
        import torch
    except ImportError:
        torch = None
    device = args.device or ("cuda" if torch is not None and torch.cuda.is_available()
                             else "cpu" if torch is not None else "numpy")
    if device not in ("cuda", "cpu", "numpy"):
        die(f"--device must be cuda, cpu or numpy, got {device}")
    if device != "numpy" and torch is None:
        if args.device:
            die(f"--device {device} needs torch, which is not installed (numpy: no torch)")
        device = "numpy"
    if device == "cuda" and not torch.cuda.is_available():
        die("--device cuda: torch sees no GPU")
    batch_tokens = args.batch_tokens or (65536 if device == "cuda" else 8192)

    # --- inputs --------------------------------------------------------------
    t_start = time.time()
    try:
        tok = dict(np.load(prep / "tokens.npz"))
        weights = dict(np.load(prep / "model.npz"))
    except (OSError, ValueError) as e:
        die(f"{prep}: cannot read tokens.npz/model.npz: {e}")
    punct = weights["punct"].astype(bool)
    sp = meta["special"]
    doc_lens = tok["doc_lens"].astype(np.int64)
    doc_off = np.concatenate([[0], np.cumsum(doc_lens)])
    doc_flat = tok["doc_tokens"].astype(np.int64)
    q_tokens = tok["query_tokens"].astype(np.int64)
    q_lens = tok["query_lens"].astype(np.int64)
    doc_ids = (prep / "doc_ids.txt").read_text().split("\n")[:-1]
    query_ids = (prep / "query_ids.txt").read_text().split("\n")[:-1]
    if len(doc_ids) != len(doc_lens) or len(query_ids) != len(q_lens):
        die(f"{prep}: id files and tokens.npz disagree on counts")
    qrels = [l.split() for l in (prep / "qrels.txt").read_text().splitlines() if l.strip()]

    n_docs = len(doc_ids) if not args.limit else min(args.limit, len(doc_ids))
    kept_docs = set(doc_ids[:n_docs])
    qrels = [r for r in qrels if r[2] in kept_docs]
    has_rel = {r[0] for r in qrels}
    q_sel = [i for i, q in enumerate(query_ids) if q in has_rel]
    doc_seqs = [doc_flat[doc_off[i]:doc_off[i + 1]] for i in range(n_docs)]
    doc_lens = doc_lens[:n_docs]
    q_tokens, q_lens = q_tokens[q_sel], q_lens[q_sel]
    query_ids = [query_ids[i] for i in q_sel]
    doc_ids = doc_ids[:n_docs]
    if not q_sel:
        die("no query has a relevant document among the encoded ones")

    # Kept document rows: all wordpieces but pure punctuation ([CLS], [D] and
    # [SEP] are not punctuation, so no document is left empty).
    out_lens = np.array([int((~punct[s]).sum()) for s in doc_seqs], dtype=np.int32)
    out_off = np.concatenate([[0], np.cumsum(out_lens)])
    n_tok = int(out_off[-1])
    if n_tok < args.dim:
        die(f"{n_tok} document tokens are too few to fit a {args.dim}-dimensional projection")
    print(f"{n_docs} documents ({int(doc_lens.sum())} wordpieces, {n_tok} kept without "
          f"punctuation), {len(q_sel)} queries; device {device}"
          f"{' fp16' if args.fp16 and device == 'cuda' else ''}", flush=True)

    # --- forward -----------------------------------------------------------
    if device == "numpy":
        model = NumpyBert(weights, cfg)
    else:
        model = TorchBert(weights, cfg, device, args.fp16)
    # Padding ids are [MASK]: padded keys are masked out and padded rows dropped,
    # so the id only has to be a valid one.
    t0 = time.time()
    doc_h = np.empty((n_tok, H), dtype=np.float16)
    run_encoder(model, doc_seqs, doc_lens, doc_lens, batch_tokens, sp["mask"],
                lambda ids, h: h[~punct[ids]], doc_h, out_off, "documents")
    q_h = np.empty((len(q_sel) * QUERY_LEN, H), dtype=np.float16)
    run_encoder(model, list(q_tokens), np.full(len(q_sel), QUERY_LEN), q_lens,
                batch_tokens, sp["mask"], lambda ids, h: h, q_h,
                np.arange(len(q_sel)) * QUERY_LEN, "queries")
    t_fwd = time.time() - t0
    if not (np.isfinite(doc_h).all() and np.isfinite(q_h).all()):
        die("non-finite hidden states (float16 overflow?): rerun without --fp16")

    # --- the stored hidden states of a few sequences, recomputed one at a time
    # by references: numpy, and Hugging Face's BertModel if installed.
    checks = {}
    if not args.no_check:
        # numpy, unbatched: catches padding/scatter mistakes on any device.
        refs = {"numpy": NumpyBert(weights, cfg)}
        hf = hf_reference(weights, cfg)
        if hf is not None:
            refs["transformers"] = hf
        k = min(4, n_docs, len(q_sel))
        for name, ref in refs.items():
            cos = []
            for i in range(k):
                n = int(doc_lens[i])
                want = ref(doc_seqs[i][None], np.array([n]))[0][~punct[doc_seqs[i]]]
                cos.append(min_cosine(want, doc_h[out_off[i]:out_off[i + 1]]))
                want = ref(q_tokens[i][None], q_lens[i:i + 1])[0]
                cos.append(min_cosine(want, q_h[i * QUERY_LEN:(i + 1) * QUERY_LEN]))
            checks[name] = float(min(cos))
            print(f"stored hidden states vs {name}, {k} documents + {k} queries: "
                  f"min cosine {checks[name]:.6f}", flush=True)
            if checks[name] < 0.999:
                die(f"hidden states disagree with {name} (min cosine "
                    f"{checks[name]:.6f} < 0.999)")

    # --- projection fitted on a document token sample ------------------------
    # Default: the top eigenvectors of the uncentred second moment E[x x^T], a
    # linear map without bias like ColBERT's Linear(hidden, dim, bias=False),
    # so the vectors keep BERT's shared direction (ColBERT's are anisotropic
    # too).  --center subtracts the sample mean first (textbook PCA), which
    # spreads them around the sphere instead.
    t0 = time.time()
    rng = np.random.default_rng(args.seed)
    sample = doc_h[np.sort(rng.choice(n_tok, min(args.pca_sample, n_tok), replace=False))]
    sample = sample.astype(np.float64)
    mean = sample.mean(0) if args.center else np.zeros(H)
    centred = sample - mean
    evals, evecs = np.linalg.eigh(centred.T @ centred / len(sample))   # ascending
    comps = evecs[:, ::-1][:, :args.dim].astype(np.float32)
    explained = float(evals[::-1][:args.dim].sum() / evals.sum())
    mean = mean.astype(np.float32)

    def project(h):
        out = np.empty((len(h), args.dim), dtype=np.float16)
        for a in range(0, len(h), 262144):
            p = (h[a:a + 262144].astype(np.float32) - mean) @ comps
            p /= np.linalg.norm(p, axis=1, keepdims=True)
            out[a:a + 262144] = p
        return out

    docs = project(doc_h)
    queries = project(q_h).reshape(len(q_sel), QUERY_LEN, args.dim)
    t_pca = time.time() - t0

    # --- write ---------------------------------------------------------------
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "docs.npy", docs)
    np.save(out / "doclens.npy", out_lens)
    (out / "doc_ids.txt").write_text("".join(d + "\n" for d in doc_ids))
    np.save(out / "queries.npy", queries)
    (out / "query_ids.txt").write_text("".join(q + "\n" for q in query_ids))
    (out / "qrels.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                   + "".join(f"{r[0]}\t{r[2]}\t{r[3]}\n" for r in qrels))
    info = {
        "prepdir": str(prep), "docs": n_docs, "queries": len(q_sel), "tokens": n_tok,
        "dim": args.dim, "device": device, "fp16": bool(args.fp16 and device == "cuda"),
        "pca_sample": int(len(sample)), "pca_center": bool(args.center),
        "pca_explained": explained,
        "check_min_cosine": checks, "forward_s": round(t_fwd, 2),
        "pca_s": round(t_pca, 2), "total_s": round(time.time() - t_start, 2),
    }
    (out / "encode.json").write_text(json.dumps(info, indent=1) + "\n")
    print(f"PCA {H} -> {args.dim}{' centred' if args.center else ''} keeps "
          f"{100 * explained:.1f}% of the {'variance' if args.center else 'second moment'}; "
          f"forward {t_fwd:.1f} s, PCA+projection {t_pca:.1f} s, "
          f"{time.time() - t_start:.1f} s in all")
    print(f"docs.npy {docs.shape} ({os.path.getsize(out / 'docs.npy') / 1e6:.1f} MB), "
          f"queries.npy {queries.shape}, {len(qrels)} qrels -> {out}")


if __name__ == "__main__":
    main()
