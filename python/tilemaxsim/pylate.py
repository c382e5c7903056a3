"""A TileMaxSim index behind PyLate's index interface (pylate/indexes/base.py, PyLate 1.6):

    from pylate import models, retrieve
    from tilemaxsim.pylate import TileMaxSimIndex

    index = TileMaxSimIndex(index_folder="indexes", index_name="docs", override=True)
    index.add_documents(documents_ids=ids, documents_embeddings=model.encode(docs, is_query=False))
    retriever = retrieve.ColBERT(index=index)
    results = retriever.retrieve(queries_embeddings=model.encode(queries, is_query=True), k=10)

`results[q]` is a list of {"id", "score"}, best first. The index is end to end, as PyLate's PLAID:
retrieve.ColBERT hands it the queries and returns its ranking as is. When PyLate is importable the
class is a `pylate.indexes.base.Base`; PyLate itself is not needed to use it. Ids are kept as str.
"""
from __future__ import annotations

import os

import numpy as np

from . import Error, Searcher, _ids, _is_id_collection, add_documents, build_index, delete_documents

try:  # PyLate's abstract base, when PyLate is installed: isinstance(index, Base) holds
    from pylate.indexes.base import Base as _Base
except ImportError:
    _Base = object


def _query_list(queries_embeddings):
    """PyLate's queries as a list of [tokens, dim] arrays: one 2-d query (what encode("text",
    is_query=True) returns), a 3-d batch, or a list of 2-d (or [1, tokens, dim]) arrays."""
    q = queries_embeddings
    if hasattr(q, "ndim") and not isinstance(q, (list, tuple)):
        if q.ndim == 2:
            return [q]
        if q.ndim == 3:
            return [q[i] for i in range(q.shape[0])]
        raise ValueError(f"queries_embeddings: expected [tokens, dim] or [queries, tokens, dim], got shape "
                         f"{tuple(q.shape)}")
    out = []
    for i, x in enumerate(q):
        x = x if hasattr(x, "ndim") else np.asarray(x, dtype=np.float32)
        if x.ndim == 3 and x.shape[0] == 1:
            x = x[0]
        if x.ndim != 2:
            raise ValueError(f"queries_embeddings[{i}]: expected [tokens, dim], got shape {tuple(x.shape)}")
        out.append(x)
    return out


class TileMaxSimIndex(_Base):
    """index_folder / index_name is the index directory. override: the first add_documents
    replaces an index already there (only one TileMaxSim wrote). device: where searches run
    ("auto", "cpu", "gpu", "0,1"). search_options: Searcher.search's keywords for every query
    (nprobe, target_recall, ...). Build options (IndexBuildOptions' fields) apply to the first
    add_documents, which builds the index; the default keeps the fp16 vectors (exact rerank,
    exact subset searches, get_documents_embeddings)."""

    is_end_to_end_index = True  # __call__ returns the final ranking (PyLate's retrieve passes it on)

    def __init__(self, index_folder="indexes", index_name="tilemaxsim", override=False, device="auto",
                 search_options=None, **build_options):
        self.path = os.path.join(index_folder, index_name)
        self.device = device
        self.search_options = dict(search_options or {})
        self.build_options = {"keep_vectors": True, **build_options}
        self._override = override
        self._searcher = None
        self._reader = None  # a CPU searcher reading vectors from disk, when self._searcher's are on a GPU
        if not override and os.path.exists(self.path):
            self._searcher = Searcher(self.path, device)

    def _opened(self):
        self._searcher = Searcher(self.path, self.device)
        self._reader = None
        return self

    def add_documents(self, documents_ids, documents_embeddings, batch_size=None, metadata=None, **kwargs):
        """Adds documents (ids and their [tokens, dim] embeddings, and optionally a dict of
        attributes each, which __call__(filter=...) selects by); the first call builds the index.
        An id already in the index is a ValueError (update_documents replaces)."""
        return self._add(documents_ids, documents_embeddings, metadata, replace=False)

    def update_documents(self, documents_ids, documents_embeddings, metadata=None, **kwargs):
        """Replaces the documents of these ids (adding those the index does not hold)."""
        return self._add(documents_ids, documents_embeddings, metadata, replace=True)

    def _add(self, documents_ids, documents_embeddings, metadata, replace):
        embeddings = list(documents_embeddings) if not hasattr(documents_embeddings, "ndim") or \
            documents_embeddings.ndim != 2 else [documents_embeddings]
        ids = _ids(documents_ids, "documents_ids", len(embeddings))
        if self._searcher is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            options = dict(self.build_options)
            if sum(len(e) for e in embeddings) < 256 and "codec" not in options:
                options["codec"] = "residual"  # PQ trains on 256 tokens at least; PLAID's codec does not
            build_index(self.path, embeddings, ids, overwrite=self._override, metadata=metadata, **options)
            self._override = False
        else:
            add_documents(self.path, embeddings, ids, replace=replace, metadata=metadata)
        return self._opened()

    def remove_documents(self, documents_ids):
        """Deletes documents by id (an id the index does not hold is a KeyError)."""
        if self._searcher is None:
            raise ValueError(f"{self.path}: no documents added yet")
        delete_documents(self.path, documents_ids)
        return self._opened()

    def __call__(self, queries_embeddings, k=10, subset=None, filter=None, **kwargs):
        """The k best documents of each query as lists of {"id", "score"}, best first. subset:
        the allowed document ids, one collection for every query or one per query (ids the index
        lacks are ignored; an empty one allows nothing); filter: an SQL expression over the
        documents' metadata (Searcher.search)."""
        if self._searcher is None:
            raise ValueError(f"{self.path}: no documents added yet")
        queries = _query_list(queries_embeddings)
        if subset is not None:
            rows = list(subset) if _is_id_collection(subset) else [subset]  # a str is one id
            if rows and all(_is_id_collection(r) for r in rows) and len(rows) != len(queries):
                raise ValueError(f"subset: {len(rows)} lists for {len(queries)} queries (one list, or one per query)")
            subset = rows
        ids, scores = self._searcher.search(queries, k=k, subset=subset, filter=filter, **self.search_options)
        return [[{"id": d, "score": float(s)} for d, s in zip(qi, qs)] for qi, qs in zip(ids, scores)]

    def get_documents_embeddings(self, documents_ids):
        """The stored token vectors of documents, nested as given (documents_ids[q] a list of ids):
        out[q][i] is a float32 [tokens, dim] array (the index keeps them in fp16). KeyError for an
        id the index does not hold."""
        if self._searcher is None:
            raise ValueError(f"{self.path}: no documents added yet")
        groups = [_ids(g, f"documents_ids[{i}]") for i, g in enumerate(documents_ids)]
        flat = [d for g in groups for d in g]
        try:
            vectors = self._searcher.document_vectors(flat)
        except Error:  # held only on a GPU: read them from disk instead
            if self._reader is None:
                self._reader = Searcher(self.path, "cpu", vectors="disk")
            vectors = self._reader.document_vectors(flat)
        out, at = [], 0
        for g in groups:
            out.append([v.astype(np.float32) for v in vectors[at: at + len(g)]])
            at += len(g)
        return out
