"""TileMaxSim: late-interaction (ColBERT-style) search on GPUs and CPUs, from Python.

    import tilemaxsim
    tilemaxsim.build_index("idx", documents, ids, keep_vectors=True)   # list of [len_i, dim] arrays
    s = tilemaxsim.Searcher("idx")
    ids, scores = s.search(queries, k=10)                              # [n_queries, tokens, dim]
    ids, scores = s.rerank(queries, [["doc3", "doc9"], ...])          # exact MaxSim of given candidates
    # or text, through any encoder with PyLate's encode(texts, is_query=...):
    tilemaxsim.build_index("idx", texts=passages, ids=ids, model=model, keep_vectors=True)
    ids, scores = tilemaxsim.Searcher("idx").search_text(["what is maxsim?"], model, k=10)

Documents and queries may be numpy arrays (float32, float16; bfloat16 as ml_dtypes'), torch
tensors (CPU or CUDA; bfloat16 too) or nested lists. Errors raise ValueError (bad input),
FileNotFoundError (no index) or tilemaxsim.Error, with the engine's one-line message. Every
long call releases the GIL; a search is split into batches, so Ctrl-C stops it between two.
"""
from __future__ import annotations

import json
import warnings
import sys

import numpy as np

from . import _build_config, _libs

_libs.preload_cuda_libraries(_build_config.CUDA)
from . import _core  # noqa: E402  (after cuBLAS is loaded)
from ._core import Error, __version__

__all__ = ["__version__", "Error", "Searcher", "build_index", "add_documents", "delete_documents", "index_info",
           "search_defaults", "estimate_recall", "encode", "set_log_level", "Client", "ServerError", "serve"]

search_defaults = _core.search_defaults  # dict of Searcher.search's engine defaults


_told_no_gpu = False


def _say_no_gpu():
    """A build with CUDA (the GPU wheel) on a machine without a visible GPU: one line, once."""
    global _told_no_gpu
    if not _told_no_gpu and _core.log_level() in ("info", "debug"):
        print("tilemaxsim: no CUDA GPU is visible (no NVIDIA driver, or no device): running on the CPU",
              file=sys.stderr)
    _told_no_gpu = True


def set_log_level(level):
    """What the engine prints on stderr: "error", "warning", "info" (the default: summaries and,
    on a terminal, progress bars) or "debug" (also where a build's time went). The environment's
    TMS_LOG_LEVEL sets it at import."""
    _core.set_log_level(str(level))

# The peers' names (fast-plaid, PyLate) for the same options, accepted as aliases.
BUILD_ALIASES = {"nbits": "residual_nbits"}
SEARCH_ALIASES = {"top_k": "k", "n_ivf_probe": "nprobe", "n_full_scores": "ncandidates"}


def _unalias(given, aliases, what):
    """Keywords with the peers' names renamed to ours; both names given is a TypeError."""
    out, named_by = {}, {}
    for name, value in given.items():
        ours = aliases.get(name, name)
        if ours in out:
            raise TypeError(f"{what}: {named_by[ours]!r} and {name!r} name the same option; give one")
        out[ours], named_by[ours] = value, name
    return out


# IndexBuildOptions fields a build takes as keywords (besides overwrite, progress, device).
BUILD_OPTIONS = ("codec", "n_centroids", "kmeans_iters", "max_train_tokens", "train_tokens_per_centroid", "pq_m", "pq_nbits", "residual_nbits",
                 "keep_vectors", "chunk_docs", "shards", "seed", "threads", "ivf_memory_entries", "text_field",
                 "text_tokenizer", "spans_field", "pool_factor")


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _as_array(x, what):
    """x as a C-contiguous numpy array and its engine dtype ("f32", "f16", "bf16"), without a copy
    where the layout allows (a CPU torch tensor or a contiguous numpy array is used in place)."""
    if _is_torch(x):
        import torch

        t = x.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        if t.dtype == torch.bfloat16:
            return t.view(torch.int16).numpy().view(np.uint16), "bf16"
        if t.dtype not in (torch.float16, torch.float32):
            t = t.float()
        x = t.numpy()
    a = np.asarray(x)
    if a.dtype.name == "bfloat16":  # ml_dtypes
        return np.ascontiguousarray(a).view(np.uint16), "bf16"
    if a.dtype == np.float16:
        return np.ascontiguousarray(a), "f16"
    if a.dtype == np.float32:
        return np.ascontiguousarray(a), "f32"
    if a.dtype.kind in "fiu":
        return np.ascontiguousarray(a, dtype=np.float32), "f32"
    raise ValueError(f"{what}: unsupported dtype {a.dtype} (float32, float16 or bfloat16)")


def _id(x, what):
    """One external id as the engine takes it: a str, bytes (UTF-8) or an integer."""
    if isinstance(x, str):
        return x
    if isinstance(x, bytes):
        return x.decode()
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return str(int(x))
    raise TypeError(f"{what}: an id must be a str, bytes or an integer, got {type(x).__name__}")


def _ids(x, what, n=None):
    """External ids as a list of str from any iterable of ids (list, tuple, set, numpy array,
    generator). A single str or bytes is one id, never its characters: where `n` ids are needed
    (one per document) it is accepted only for n == 1."""
    if isinstance(x, (str, bytes)):
        if n is not None and n != 1:
            raise TypeError(f"{what}: a single {type(x).__name__} is one id, and {n} documents need {n} "
                            f"ids (a list of them)")
        return [_id(x, what)]
    if isinstance(x, np.ndarray):
        if x.ndim != 1:
            raise TypeError(f"{what}: expected a 1-d array of ids, got shape {x.shape}")
        x = x.tolist()
    try:
        items = iter(x)
    except TypeError:
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            return [_id(x, what)]
        raise TypeError(f"{what}: expected ids (a list, set or array of str or int), got {type(x).__name__}") from None
    return [_id(i, what) for i in items]


def _is_id_collection(x):
    """True for a collection of ids (a row of a per-query subset), not for one id."""
    return not isinstance(x, (str, bytes, int, np.integer)) and hasattr(x, "__iter__")


def _count(value, name, lo=0, hi=2**31 - 1):
    """An integer option checked as the engine takes it (a 32-bit int), as a ValueError naming it."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return int(value)


def _documents(documents, lengths):
    """Documents as one token array [n_tokens, dim] plus per-document lengths: a list of
    [len_i, dim] arrays is concatenated (one copy); one flat array with `lengths` is used as is."""
    if lengths is not None:
        tokens, dtype = _as_array(documents, "documents")
        lens = np.asarray(lengths, dtype=np.int64)
        return tokens, dtype, lens
    if isinstance(documents, (list, tuple)):
        if not documents:
            raise ValueError("documents: empty list")
        parts, dtypes = [], set()
        for i, d in enumerate(documents):
            a, dt = _as_array(d, f"documents[{i}]")
            if a.ndim != 2:
                raise ValueError(f"documents[{i}]: expected [tokens, dim], got shape {a.shape}")
            parts.append(a)
            dtypes.add(dt)
        if len(dtypes) > 1:
            raise ValueError(f"documents: mixed dtypes {sorted(dtypes)}")
        dims = {p.shape[1] for p in parts}
        if len(dims) > 1:
            raise ValueError(f"documents: ragged dimensions {sorted(dims)}")
        lens = np.array([p.shape[0] for p in parts], dtype=np.int64)
        return np.concatenate(parts, axis=0), dtypes.pop(), lens
    raise ValueError("documents: a list of [tokens, dim] arrays, or one [n_tokens, dim] array with lengths=")


def _queries(queries):
    """Queries as [n_queries, q_tokens, dim] plus lengths: one 3-d array (every query padded to
    the same tokens), a single [tokens, dim] query, or a list of [len_i, dim] arrays (padded here,
    their lengths kept so that padding is never scored)."""
    if isinstance(queries, (list, tuple)) and queries and not np.isscalar(queries[0]) and np.ndim(queries[0]) == 2:
        parts = [_as_array(q, f"queries[{i}]") for i, q in enumerate(queries)]
        dtypes = {dt for _, dt in parts}
        if len(dtypes) > 1:
            raise ValueError(f"queries: mixed dtypes {sorted(dtypes)}")
        dims = {a.shape[1] for a, _ in parts}
        if len(dims) > 1:
            raise ValueError(f"queries: ragged dimensions {sorted(dims)}")
        qt = max(a.shape[0] for a, _ in parts)
        out = np.zeros((len(parts), qt, dims.pop()), dtype=parts[0][0].dtype)
        for i, (a, _) in enumerate(parts):
            out[i, : a.shape[0]] = a
        return out, dtypes.pop(), np.array([a.shape[0] for a, _ in parts], dtype=np.int32)
    a, dt = _as_array(queries, "queries")
    if a.ndim == 2:
        a = a[None]
    if a.ndim != 3:
        raise ValueError(f"queries: expected [n_queries, tokens, dim], got shape {a.shape}")
    return np.ascontiguousarray(a), dt, None


def _metadata(metadata, metadata_types):
    """Metadata as the engine takes it: JSON object texts, and declared types "name:type,..."."""
    if metadata is None:
        return [], ""
    objects = []
    for i, m in enumerate(metadata):
        if not isinstance(m, dict):
            raise ValueError(f"metadata: item {i}: expected a dict, got {type(m).__name__}")
        objects.append(json.dumps(m))
    if isinstance(metadata_types, dict):
        metadata_types = ",".join(f"{k}:{v}" for k, v in metadata_types.items())
    return objects, metadata_types or ""


def _texts(texts, what):
    """Texts as a list of str: a single str is one text, never its characters."""
    if isinstance(texts, str):
        return [texts]
    if isinstance(texts, (bytes, bytearray)) or not hasattr(texts, "__iter__"):
        raise TypeError(f"{what}: expected a str or an iterable of str, got {type(texts).__name__}")
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"{what}[{i}]: expected a str, got {type(t).__name__}")
    if not texts:
        raise ValueError(f"{what}: no texts")
    return texts


def encode(model, texts, is_query):
    """Token embeddings of `texts` from `model`: any object with PyLate's
    `encode(texts, is_query=...)` (pylate.models.ColBERT, or an encoder of your own) returning one
    [tokens, dim] array or tensor per text (a padded [n, tokens, dim] batch is split by text)."""
    if not callable(getattr(model, "encode", None)):
        raise TypeError(f"model: expected an encoder with encode(texts, is_query=...) (e.g. pylate.models.ColBERT), "
                        f"got {type(model).__name__}")
    texts = _texts(texts, "queries" if is_query else "texts")
    out = model.encode(texts, is_query=is_query)
    padded = (_is_torch(out) or isinstance(out, np.ndarray)) and getattr(out, "ndim", 0) == 3 and out.dtype != object
    out = [out[i] for i in range(out.shape[0])] if padded else list(out)
    if len(out) != len(texts):
        raise ValueError(f"model.encode returned {len(out)} embeddings for {len(texts)} texts")
    return out


def _documents_or_texts(documents, texts, model, what):
    """The documents' embeddings: given, or encoded from `texts` by `model` (one of the two)."""
    if texts is None and model is None:
        if documents is None:
            raise TypeError(f"{what}: give documents (embeddings), or texts= and model=")
        return documents
    if documents is not None:
        raise TypeError(f"{what}: give documents or texts=, not both")
    if texts is None or model is None:
        raise TypeError(f"{what}: texts= needs model= (an encoder with encode(texts, is_query=...)) and the other way round")
    return encode(model, texts, is_query=False)


def _progress(progress):
    """Progress bars: as asked, or (None) when standard error is a terminal."""
    return sys.stderr.isatty() if progress is None else bool(progress)


def _is_stream(documents, lengths):
    """A stream of batches: any iterable that is not an array or a list of arrays (a generator,
    an iterator, a list of (documents, ids[, metadata]) tuples)."""
    if documents is None or lengths is not None or isinstance(documents, (str, bytes, dict)):
        return False
    if isinstance(documents, (list, tuple)):
        return bool(documents) and isinstance(documents[0], tuple)
    if hasattr(documents, "shape") or hasattr(documents, "__array__"):
        return False
    return hasattr(documents, "__iter__")


def _batch(batch, i):
    """One batch of a stream: (documents, ids[, metadata]) or documents alone (ids numbered on)."""
    if isinstance(batch, tuple):
        if not 1 <= len(batch) <= 3:
            raise ValueError(f"batch {i}: expected (documents, ids[, metadata]), got a tuple of {len(batch)}")
        return batch + (None,) * (3 - len(batch))
    if isinstance(batch, (list, np.ndarray)) or hasattr(batch, "shape"):
        return batch, None, None
    raise ValueError(f"batch {i}: expected (documents, ids[, metadata]) or a list of [tokens, dim] arrays, "
                     f"got {type(batch).__name__}")


def _build_stream(path, batches, options, overwrite, progress, device, metadata_types, expected_tokens):
    """build_index from a stream of batches: each is encoded and written as it comes
    (IndexStreamBuilder), so the collection is never held."""
    b = _core.StreamBuilder(str(path), json.dumps(options), overwrite, _progress(progress), device,
                            int(expected_tokens or 0))
    try:
        for i, batch in enumerate(batches, 1):
            docs, bids, bmeta = _batch(batch, i)
            if isinstance(docs, (list, tuple)) and not docs:
                continue
            tokens, dtype, lens = _documents(docs, None)
            b.add(tokens, dtype, lens, _ids(bids, f"batch {i}: ids", len(lens)) if bids is not None else [],
                  *_metadata(bmeta, metadata_types))
        return b.finish()
    except BaseException:
        del b  # an unfinished build leaves nothing at `path`, now rather than when the traceback goes
        raise


def build_index(path, documents=None, ids=None, lengths=None, *, texts=None, model=None, overwrite=False,
                progress=None, device="auto", metadata=None, metadata_types=None, estimate=True, estimate_sample=None,
                expected_tokens=None, target_recall=None, **options):
    """Builds an index at `path` from `documents` (a list of [len_i, dim] arrays, as
    model.encode(..., is_query=False) returns, or one [n_tokens, dim] array with `lengths`), or
    from `texts` encoded by `model` (anything with PyLate's encode(texts, is_query=...)).
    `ids`: external ids (default "0".."n-1"). `metadata`: a dict of attributes per document (in
    document order, or each naming its document by "id"), which Searcher.search(filter=...)
    filters by; `metadata_types`: declared column types ({"year": "integer"}; others inferred).
    Options as IndexBuildOptions' fields, e.g. keep_vectors=True, codec="residual", shards=4.
    `documents` may also be a stream: any iterable of batches (documents, ids[, metadata]) or of
    document lists alone (ids numbered on), e.g. a generator over an encoder's output; each batch
    is encoded and written as it comes, so memory stays bounded whatever the collection's size
    (the model trains on the stream's first documents, max_train_tokens of them: shuffle a
    collection ordered by topic). `expected_tokens`: the stream's size, roughly, which sets the
    centroid and shard counts (default: sized for 2^27 tokens, about 1M documents).
    With keep_vectors, the build ends by measuring its recall (estimate_recall; on
    `estimate_sample`, queries of your own, when given) unless estimate=False. Returns the
    build's counts. fast-plaid's `nbits` is accepted for residual_nbits (either chooses the residual
    codec). codec="auto" (documents given whole, without keep_vectors): PQ of dim/8
    sub-quantizers, then twice and four times as many, each built and measured by its compressed
    estimate until one reaches `target_recall` (default 0.99), else the last (tms index --codec
    auto). progress: bars on
    standard error (None: when it is a terminal)."""
    options = _unalias(options, BUILD_ALIASES, "build_index")
    auto_codec = options.get("codec") == "auto"
    if target_recall is not None and not auto_codec:
        raise ValueError("build_index: target_recall is the codes' target with codec='auto' (searches take "
                         "theirs from Searcher.search(target_recall=...))")
    if auto_codec:
        why = ("keep_vectors: the exact rerank makes up for the codes (use codec='pq')" if options.get("keep_vectors")
               else "estimate=False: the choice is the estimate's" if not estimate
               else "pq_m / residual_nbits: the choice is the estimate's"
               if {"pq_m", "residual_nbits"} & set(options) else
               "a stream of batches: the estimate needs the documents whole" if _is_stream(documents, lengths)
               else None)
        if why:
            raise ValueError(f"build_index: codec='auto' with {why}")
    unknown = sorted(set(options) - set(BUILD_OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (known: {', '.join(BUILD_OPTIONS)})")
    if "residual_nbits" in options:  # the residual codec's bits: alone, they choose that codec (fast-plaid's nbits)
        if options.setdefault("codec", "residual") != "residual":
            raise ValueError(f"residual_nbits (nbits) is the residual codec's bits per dimension; codec={options['codec']!r} "
                             "takes pq_m and pq_nbits")
    if _is_stream(documents, lengths):
        if ids is not None or metadata is not None or texts is not None or model is not None:
            raise TypeError("build_index: a stream of batches carries its own ids and metadata "
                            "((documents, ids[, metadata]) each); ids=, metadata=, texts= and model= are for "
                            "documents given whole")
        counts = _build_stream(path, documents, options, overwrite, progress, device, metadata_types,
                               expected_tokens)
        if estimate and options.get("keep_vectors"):
            estimate_recall(path, device=device, sample=estimate_sample)
        return counts
    if expected_tokens is not None:
        raise TypeError("build_index: expected_tokens sizes a stream of batches; documents given whole are "
                        "counted (drop expected_tokens)")
    documents = _documents_or_texts(documents, texts, model, "build_index")
    tokens, dtype, lens = _documents(documents, lengths)
    ids = _ids(ids, "ids", len(lens)) if ids is not None else []
    meta = _metadata(metadata, metadata_types)
    if auto_codec:
        return _build_auto_codec(path, tokens, dtype, lens, ids, meta, options, overwrite, progress, device,
                                 estimate_sample, 0.99 if target_recall is None else float(target_recall))
    counts = _core.build_index(str(path), tokens, dtype, lens, ids, json.dumps(options), overwrite,
                               _progress(progress), device, *meta)
    if estimate and options.get("keep_vectors"):
        estimate_recall(path, device=device, sample=estimate_sample)
    elif estimate:  # no stored vectors: the documents given are the truth
        try:
            estimate_recall(path, device=device, sample=estimate_sample, documents=tokens, lengths=lens)
        except (ValueError, RuntimeError) as e:  # the index is complete and usable without it
            warnings.warn(f"build_index: no recall estimate ({e}); estimate_recall(path, documents=...) "
                          "measures it later")
    return counts


def _build_auto_codec(path, tokens, dtype, lens, ids, meta, options, overwrite, progress, device, sample, target):
    """build_index(codec="auto"): as `tms index --codec auto` (tools/tms/index.cpp), the ladder of
    tms::NextAutoCodecPqM, each build on the first's centroids, replacing the one before it once
    complete."""
    first, m = None, 0
    while True:
        step = dict(options, codec="pq", pq_m=m)
        if first:  # on the first step's centroids (k-means once): only the codes change
            step.update(centroids_from=str(path), n_centroids=0)
        counts = _core.build_index(str(path), tokens, dtype, lens, ids, json.dumps(step),
                                   overwrite, _progress(progress), device, *meta)
        overwrite = True
        info = index_info(path)
        try:
            estimate_recall(path, device=device, sample=sample, documents=tokens, lengths=lens)
        except (ValueError, RuntimeError) as e:  # the index is complete and usable without it
            warnings.warn(f"build_index: codec='auto': no estimate to judge PQ-{info['pq_m']} by ({e}); keeping it")
            return counts
        first = first or info["pq_m"]
        nxt, reaches, recall = _core.auto_codec_next(str(path), target, first)
        if not nxt:
            if not reaches:
                warnings.warn(f"build_index: codec='auto': no PQ up to {info['pq_m']} sub-quantizers reaches "
                              f"recall {target:.2f}; keeping PQ-{info['pq_m']} (estimated {recall:.4f}); "
                              "keep_vectors=True reranks exactly")
            return counts
        m = nxt


def estimate_recall(path, queries=0, device="auto", *, sample=None, documents=None, lengths=None):
    """Measures the index's approximate search against exhaustive search on pseudo-queries
    (token sets of its documents, perturbed), or on `sample` (queries of your own, as
    Searcher.search takes them: a sample of real ones measures their recall, which pseudo-queries
    only approximate), at the default and deeper settings, and stores the result with the index
    (searches take their parameters for target_recall from it). An index without stored vectors
    is measured against `documents` (with `lengths`, as build_index takes them): the ones it was
    built from, in order; the estimate is then of the compressed ranking ("compressed": True).
    Returns {"queries", "sample", "compressed", "k", "points": [{"nprobe", "ncandidates",
    "rerank", "recall", "se"}, ...]} ("se": the standard error of "recall" over the queries; a
    target is reached where recall - 1.645 se reaches it)."""
    docs = (None, "", [])
    if documents is not None:
        tokens, ddtype, dlens = _documents(documents, lengths)
        if ddtype == "bf16":  # the truth reads fp16 or fp32
            tokens, ddtype = (tokens.astype(np.uint32) << 16).view(np.float32), "f32"
        docs = (tokens, ddtype, [int(x) for x in dlens])
    if sample is None:
        return _core.estimate_recall(str(path), queries, device, None, "", [], *docs)
    q, dtype, lens = _queries(sample)
    return _core.estimate_recall(str(path), queries, device, q, dtype, [] if lens is None else list(lens), *docs)


def add_documents(path, documents=None, ids=None, lengths=None, *, texts=None, model=None, replace=False, progress=None,
                  metadata=None, metadata_types=None):
    """Adds documents (as build_index takes them: embeddings, or texts= with model=; metadata
    too) with their external ids to the index at `path`, in one commit; replace=True replaces
    documents whose ids it already holds (without it, such an id is a ValueError and nothing is
    added)."""
    if ids is None:
        raise TypeError("add_documents: ids= is required (one external id per document)")
    documents = _documents_or_texts(documents, texts, model, "add_documents")
    tokens, dtype, lens = _documents(documents, lengths)
    _core.add_documents(str(path), tokens, dtype, lens, _ids(ids, "ids", len(lens)), replace, _progress(progress),
                        *_metadata(metadata, metadata_types))


def delete_documents(path, ids):
    """Deletes documents by external id (an iterable of ids, or one id), in one commit; returns
    how many it deleted (ids deleted before are skipped). An id the index never held is a
    KeyError (nothing deleted)."""
    ids = _ids(ids, "ids")
    return len(set(ids)) - _core.delete_documents(str(path), ids)


def index_info(path):
    """What the index at `path` holds (documents, tokens, dim, codec, shards, ...)."""
    return _core.index_info(str(path))


class Searcher:
    """An opened index. device: "auto" (GPUs when present), "cpu", "gpu" / "all", or GPUs "0,1".
    vectors: where the stored fp16 vectors live, "auto", "gpu", "host", "disk" or "none" (tms
    search --vectors). filter_time_ms, filter_max_bytes: the bounds of a filter's evaluation (None:
    the engine's, 5 s and 16 MiB; past either a search with a filter raises ValueError).
    record_queries: keep a uniform sample of at most this many of the queries searched
    (served_queries()), to measure the recall estimate on them.

    search() and rerank() return (ids, scores): per query a list of external ids and a float32
    array of their scores, best first."""

    def __init__(self, path, device="auto", *, load_vectors=True, threads=0, progress=False, batch=256,
                 vectors="auto", filter_time_ms=None, filter_max_bytes=None, record_queries=0):
        self.path = str(path)
        d = _core.searcher_defaults()
        limits = {name: _count(d[name] if v is None else v, name, 1, hi) for name, v, hi in
                  (("filter_time_ms", filter_time_ms, 2**62), ("filter_max_bytes", filter_max_bytes, 2**31 - 1))}
        self._open = dict(device=device, load_vectors=load_vectors, threads=threads, progress=progress,
                          vectors=vectors, record_queries=_count(record_queries, "record_queries", 0, 2**31 - 1),
                          **limits)
        self.batch = _count(batch, "batch", 1)
        self._reopen()

    @property
    def info(self):
        return self._s.info()

    @property
    def device(self):
        return self._s.device()

    def _batches(self, queries, run, outputs=2):
        """run's `outputs` lists (ids, scores, ...) of each batch, concatenated."""
        q, dtype, lens = _queries(queries)
        out = None
        for q0 in range(0, q.shape[0], self.batch):  # Ctrl-C lands between two batches
            l = lens[q0: q0 + self.batch] if lens is not None else []
            part = run(np.ascontiguousarray(q[q0: q0 + self.batch]), dtype, l, q0)
            out = [list(p) for p in part] if out is None else [o + list(p) for o, p in zip(out, part)]
        return tuple(out) if out is not None else tuple([] for _ in range(outputs))

    def search(self, queries, k=None, *, exhaustive=False, nprobe=None, ncandidates=None, rerank=None,
               pruning=None, filter=None, subset=None, target_recall=None, mode="maxsim", texts=None,
               fusion="weighted", bm25_weight=0.5, lexical_candidates=100, adaptive=True, certify=False,
               certify_steps=-1, return_certificates=False, **aliases):
        """The k best documents of each query (k: 10 by default; the engine's SearchOptions as
        keywords; None: the engine's default, search_defaults()). filter: an SQL boolean
        expression over the metadata ("tenant = 7 AND year >= 2024"; values are bound, never
        pasted into SQL); subset: the external ids a search may return, one iterable for every
        query or a list of one per query. Both apply before scoring (not to the top-k).
        target_recall: the speed/recall knob; with the index's recall estimate
        (build_index(keep_vectors=True) measures it), nprobe, ncandidates and rerank left at None
        come from the cheapest measured setting that reaches it (below the default 0.99 also
        settings cheaper than the defaults); a small index is searched exhaustively (cheaper
        and exact); plan() returns the setting. 0: as given. fast-plaid's
        names are accepted too: top_k (k), n_ivf_probe (nprobe), n_full_scores (ncandidates).
        mode: "maxsim" (the query embeddings), "bm25" (the query `texts` alone, BM25 over the index's
        text, build_index(text_field=...); queries may then be None) or "hybrid" (both: BM25's best
        lexical_candidates join the MaxSim candidates, every one scored exactly, the rankings fused
        by fusion "weighted" (scores scaled to [0, 1]) or "rrf" (reciprocal rank) with BM25's weight
        bm25_weight); scores are then the fused
        ones. texts: one str per query.
        adaptive (with target_recall, stored vectors and a rerank): each query starts at the defaults
        (the estimate's setting where that is cheaper), and one whose exact top k was not among the
        first 1.6 k of its compressed ranking (its codes did not settle it) is searched once more,
        certify_steps deeper (-1: at least 2, as deep as the estimate's setting), keeping the best
        of both; False: every query at the estimate's setting.
        certify=True: after the exact rerank, a query whose k-th score does not clear what the documents
        left out could score (judged by how its reranked documents' exact scores exceed their
        approximate ones) is searched once more, certify_steps deeper (-1: as deep as the index's
        estimated setting for target_recall). return_certificates: also return, per query,
        certified (1, 0, or -1 where the search does not certify: certify=False, exhaustive, no
        vectors) and depth (the steps deeper its second search went, not certified or not
        settled; 0: searched once): (ids, scores, certified, depth)."""
        k, args = self._options("search", k, nprobe, ncandidates, rerank, pruning, target_recall, aliases)
        if mode not in ("maxsim", "bm25", "hybrid"):
            raise ValueError(f"mode {mode!r}: expected 'maxsim', 'bm25' or 'hybrid'")
        if mode != "maxsim":
            if texts is None or isinstance(texts, str):
                texts = [texts] if isinstance(texts, str) else texts
                if texts is None:
                    raise ValueError(f"mode {mode!r} needs texts= (one str per query)")
            texts = [str(t) for t in texts]
            if queries is None and mode == "bm25":  # no embeddings: a query of zero tokens each
                queries = np.zeros((len(texts), 1, self.info["dim"]), np.float16)
            if queries is None:
                raise ValueError("mode 'hybrid' needs the query embeddings (queries) beside texts=")
            if len(texts) != len(queries):
                raise ValueError(f"texts: {len(texts)} for {len(queries)} queries (one str per query)")
        else:
            texts = []
        args = args[:4] + (filter or "",) + args[4:]
        # subset: one collection of ids (a str is one id), or one collection per query.
        if isinstance(subset, np.ndarray) and subset.ndim == 2:
            subset = list(subset)
        rows = list(subset) if _is_id_collection(subset) and not isinstance(subset, np.ndarray) else None
        per_query = bool(rows) and all(_is_id_collection(r) for r in rows)
        if subset is None:
            sets = lambda q0, n: []
        elif per_query:
            lists = [_ids(r, f"subset[{i}]") for i, r in enumerate(rows)]

            def sets(q0, n):
                if len(lists[q0: q0 + n]) != n:
                    raise ValueError(f"subset: {len(lists)} lists for more queries (one list, or one per query)")
                return lists[q0: q0 + n]
        else:
            shared = [_ids(subset if rows is None else rows, "subset")]
            sets = lambda q0, n: shared
        steps = _count(certify_steps, "certify_steps", -1, 8)
        ids, scores, certified, depth = self._batches(queries, lambda q, dt, l, q0: self._s.search(
            q, dt, l, k, exhaustive, *args, sets(q0, q.shape[0]), mode, texts[q0: q0 + q.shape[0]], fusion,
            float(bm25_weight), int(lexical_candidates), bool(certify), steps, bool(adaptive)), outputs=4)
        if return_certificates:
            return ids, scores, np.array(certified, np.int8), np.array(depth, np.int8)
        return ids, scores

    def _options(self, what, k, nprobe, ncandidates, rerank, pruning, target_recall, aliases):
        """k and the engine's search settings (nprobe, ncandidates, rerank, pruning, target_recall),
        peers' names resolved and None taken from search_defaults()."""
        unknown = sorted(set(aliases) - set(SEARCH_ALIASES))
        if unknown:
            raise TypeError(f"{what}() got an unexpected keyword argument {unknown[0]!r}")
        named = {n: v for n, v in (("k", k), ("nprobe", nprobe), ("ncandidates", ncandidates)) if v is not None}
        named = _unalias({**named, **aliases}, SEARCH_ALIASES, what)
        k, nprobe, ncandidates = named.get("k", 10), named.get("nprobe"), named.get("ncandidates")
        d = search_defaults()
        pick = lambda v, name: d[name] if v is None else v
        return _count(k, "k", 1), (_count(pick(nprobe, "nprobe"), "nprobe", 1),
                                   _count(pick(ncandidates, "ncandidates"), "ncandidates"),
                                   _count(pick(rerank, "rerank"), "rerank"), pick(pruning, "pruning"),
                                   pick(target_recall, "target_recall"))

    def plan(self, k=None, *, exhaustive=False, nprobe=None, ncandidates=None, rerank=None, pruning=None,
             target_recall=None, **aliases):
        """The settings search() runs with these keywords: {"exhaustive", "nprobe", "ncandidates",
        "rerank", "target_recall", "deeper_steps"} (the steps deeper a query its codes did not
        settle is searched again, 0 where none is), target_recall resolved against the index's recall estimate
        (a target below the default 0.99 may choose settings cheaper than the defaults), and
        exhaustive where the index is small enough for it to be the cheaper (at most `rerank`
        live documents on a CPU, 2 x `ncandidates` on a GPU)."""
        k, (nprobe, ncandidates, rerank, pruning, target_recall) = self._options(
            "plan", k, nprobe, ncandidates, rerank, pruning, target_recall, aliases)
        return self._s.plan(k, exhaustive, nprobe, ncandidates, rerank, pruning, target_recall)

    def search_text(self, queries, model, k=None, **options):
        """search() of query texts (a str is one query) encoded by `model` (anything with PyLate's
        encode(texts, is_query=...), e.g. pylate.models.ColBERT); options as search() takes."""
        return self.search(encode(model, queries, is_query=True), k, **options)

    def rerank(self, queries, candidate_ids, k=0, *, skip_unknown=False):
        """Exact MaxSim of each query's candidates (external ids), best first (the best k when
        k > 0): a first stage's (BM25's) results reranked. An id the index does not hold is a
        ValueError unless skip_unknown."""
        k = _count(k, "k")
        cands = [_ids(cs, f"candidate_ids[{i}]") for i, cs in enumerate(candidate_ids)]
        return self._batches(queries, lambda q, dt, l, q0: self._s.rerank(
            q, dt, l, cands[q0: q0 + q.shape[0]], k, skip_unknown))

    def document_vectors(self, ids):
        """The stored vectors of documents by external id (an iterable of ids, or one id): a list
        of float16 [tokens, dim] arrays. KeyError for an id the index does not hold; needs an
        index built with keep_vectors=True whose vectors this searcher holds on the host or reads
        from disk (vectors="host" or "disk"; on a GPU searcher with vectors="gpu" they are only
        on the device)."""
        return [a.view(np.float16) for a in self._s.document_vectors(_ids(ids, "ids"))]

    def served_queries(self):
        """A uniform sample of the queries this Searcher searched since it was (re)opened, at most
        record_queries of them (Searcher(..., record_queries=N); none without): a float16
        [n, tokens, dim] array, shorter queries padded with zero rows (which change no ranking).
        estimate_recall(path, sample=s.served_queries()) measures the recall curve on the queries
        the index really gets, and searches then plan from it."""
        q, _ = self._s.served()
        return q.view(np.float16)

    def add(self, documents=None, ids=None, lengths=None, *, texts=None, model=None, replace=False, metadata=None,
            metadata_types=None):
        """Adds documents (embeddings, or texts= with model=; and their metadata) to the index
        (add_documents), then refreshes this searcher (refresh())."""
        add_documents(self.path, documents, ids, lengths, texts=texts, model=model, replace=replace, metadata=metadata,
                      metadata_types=metadata_types)
        self.refresh()

    def delete(self, ids):
        """Deletes documents by external id (delete_documents), then refreshes this searcher
        (refresh()); returns how many it deleted."""
        n = delete_documents(self.path, ids)
        self.refresh()
        return n

    def explain(self, queries, ids):
        """Why documents matched: for each query and each of its documents (ids[q], e.g. its
        search hits), a dict {"doc_tokens": int32 array, the document token that gave each query
        token its maximum; "similarities": float32 array, those similarities (their sum is the
        MaxSim score); "from_codes": True when they come from the decoded codes, not the stored
        vectors; "spans": int32 array [query tokens, 2], each best token's [start, end) character
        offsets into the document's text, when the index keeps spans (build_index(spans_field=))
        and the document has them, else None}. Highlight a passage with spans, or with doc_tokens
        (its token positions as encoded)."""
        out = []
        def run(q, dt, l, q0):
            lists = [[str(x) for x in r] for r in ids[q0: q0 + q.shape[0]]]
            for per_query in self._s.explain(q, dt, l, lists):
                out.append([{"doc_tokens": t, "similarities": s, "from_codes": c, "spans": sp}
                            for t, s, c, sp in per_query])
            return [], []
        if len(ids) != len(queries):
            raise ValueError(f"ids: {len(ids)} lists for {len(queries)} queries")
        self._batches(queries, run)
        return out

    def refresh(self):
        """Sees the index as it is now (writes by this or another process): only the documents
        added since are read and placed, beside the ones already loaded (their memory, on the
        GPU too, is shared, not loaded again); deletions apply at once. After a compaction or a
        rebuild the index is opened whole. Searches give what a searcher opened now would."""
        self._s.refresh()

    def _reopen(self):
        o = self._open
        self._s = _core.Searcher(self.path, o["device"], o["load_vectors"], o["threads"], o["progress"],
                                 o["vectors"], o["filter_time_ms"], o["filter_max_bytes"], o["record_queries"])
        if _build_config.CUDA and o["device"] == "auto" and self._s.device() == "cpu":
            _say_no_gpu()


from .client import Client, ServerError, serve  # noqa: E402  (tms serve's client)
