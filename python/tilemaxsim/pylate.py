"""A TileMaxSim index behind PyLate's index interface (pylate/indexes/base.py):

    from pylate import models, retrieve
    from tilemaxsim.pylate import TileMaxSimIndex

    index = TileMaxSimIndex(index_folder="indexes", index_name="docs", override=True)
    index.add_documents(documents_ids=ids, documents_embeddings=model.encode(docs, is_query=False))
    retriever = retrieve.ColBERT(index=index)
    results = retriever.retrieve(queries_embeddings=model.encode(queries, is_query=True), k=10)

PyLate itself is not needed to use it. `results[q]` is a list of {"id", "score"}, best first.
"""
from __future__ import annotations

import os

from . import Searcher, _ids, _is_id_collection, add_documents, build_index, delete_documents


class TileMaxSimIndex:
    """index_folder / index_name is the index directory. override: the first add_documents
    replaces an index already there (only one TileMaxSim wrote). device: where searches run
    ("auto", "cpu", "gpu", "0,1"). Build options (IndexBuildOptions' fields) apply to the first
    add_documents, which builds the index; the default keeps the fp16 vectors (exact rerank, and
    subset searches score exactly)."""

    def __init__(self, index_folder="indexes", index_name="tilemaxsim", override=False, device="auto",
                 **build_options):
        self.path = os.path.join(index_folder, index_name)
        self.device = device
        self.build_options = {"keep_vectors": True, **build_options}
        self._override = override
        self._searcher = None
        if not override and os.path.exists(self.path):
            self._searcher = Searcher(self.path, device)

    def add_documents(self, documents_ids, documents_embeddings, batch_size=None, **kwargs):
        """Adds documents (ids and their [tokens, dim] embeddings); the first call builds the index."""
        embeddings = list(documents_embeddings)
        documents_ids = _ids(documents_ids, "documents_ids", len(embeddings))
        if self._searcher is None:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            build_index(self.path, embeddings, documents_ids, overwrite=self._override, **self.build_options)
            self._override = False
        else:
            add_documents(self.path, embeddings, documents_ids)
        self._searcher = Searcher(self.path, self.device)
        return self

    def remove_documents(self, documents_ids):
        """Deletes documents by id."""
        delete_documents(self.path, documents_ids)
        self._searcher = Searcher(self.path, self.device)
        return self

    def __call__(self, queries_embeddings, k=10, subset=None, **kwargs):
        """The k best documents of each query as lists of {"id", "score"}. subset: the allowed
        document ids, one list for every query or one list per query (scored exactly: needs the
        stored vectors); ids the index lacks are ignored."""
        if self._searcher is None:
            raise ValueError(f"{self.path}: no documents added yet")
        if subset is None:
            ids, scores = self._searcher.search(queries_embeddings, k=k)
        else:
            n = len(queries_embeddings)
            rows = list(subset) if _is_id_collection(subset) else [subset]  # a str is one id
            per_query = bool(rows) and all(_is_id_collection(r) for r in rows)
            cands = rows if per_query else [rows] * n
            if len(cands) != n:
                raise ValueError(f"subset: {len(cands)} lists for {n} queries")
            ids, scores = self._searcher.rerank(queries_embeddings, cands, k=k, skip_unknown=True)
        return [[{"id": d, "score": float(s)} for d, s in zip(qi, qs)] for qi, qs in zip(ids, scores)]
