"""TileMaxSim from Python in one screen: build, search (approximate and exhaustive), filter,
add, delete. Runs on the CPU in seconds (on a GPU where the package has one):

    PYTHONPATH=build/python python3 examples/quickstart.py     # or after pip install

CI runs it (ctest -R example_quickstart)."""
import tempfile

import numpy as np

import tilemaxsim

rng = np.random.default_rng(0)
dim = 64


def unit(x):  # ColBERT-style models output unit token vectors
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float32)


# 300 documents of 20-60 tokens: a list of [tokens, dim] arrays, as model.encode(docs) returns.
docs = [unit(rng.standard_normal((rng.integers(20, 61), dim))) for _ in range(300)]
ids = [f"doc{i}" for i in range(len(docs))]
metadata = [{"group": i % 3, "year": 2000 + i % 25} for i in range(len(docs))]  # filterable attributes

# 20 queries of 32 tokens, each drawn from one document's tokens plus noise: the answer is known.
sources = rng.choice(len(docs), size=20, replace=False)
queries = np.stack([unit(docs[s][rng.integers(0, len(docs[s]), 32)] + 0.5 * rng.standard_normal((32, dim)) / dim**0.5)
                    for s in sources])  # [20, 32, dim]

with tempfile.TemporaryDirectory() as tmp:
    path = f"{tmp}/idx"
    # keep_vectors: fp16 vectors beside the codes, for exact rerank and exhaustive search.
    tilemaxsim.build_index(path, docs, ids, keep_vectors=True, metadata=metadata, progress=False)
    s = tilemaxsim.Searcher(path)  # device="auto": a GPU when there is one, else the CPU
    print(f"{s.info['n_docs']} documents, {s.info['n_tokens']} tokens, codec {s.info['codec']}, on {s.device}")

    ids_approx, scores = s.search(queries, k=10)                   # PLAID-style pipeline
    ids_exact, _ = s.search(queries, k=10, exhaustive=True)        # exact MaxSim over every document
    recall = np.mean([len(set(a) & set(e)) / 10 for a, e in zip(ids_approx, ids_exact)])
    print(f"recall@10 of the approximate search against exhaustive: {recall:.3f}")
    print(f"query 0: top hit {ids_approx[0][0]} (score {scores[0][0]:.2f}), its source doc{sources[0]}")
    for q, src in enumerate(sources):
        assert f"doc{src}" in ids_approx[q], f"query {q}: source doc{src} not in its top 10 {ids_approx[q]}"

    # Filtered search: an SQL expression over the metadata, applied before scoring.
    g = int(sources[0]) % 3
    hits, _ = s.search(queries[:1], k=5, filter=f"group = {g} AND year >= 2005")
    print(f"query 0 with filter 'group = {g} AND year >= 2005': {hits[0]}")
    assert all(int(d[3:]) % 3 == g and 2000 + int(d[3:]) % 25 >= 2005 for d in hits[0]), hits[0]

    # Updates: add a near-copy of query 0 (it becomes the top hit), then delete it again.
    s.add([queries[0]], ["new0"], metadata=[{"group": g, "year": 2024}])
    top, _ = s.search(queries[:1], k=1)
    assert top[0] == ["new0"], f"after add: top hit {top[0]}, expected new0"
    s.delete(["new0"])
    top, _ = s.search(queries[:1], k=10)
    assert "new0" not in top[0] and f"doc{sources[0]}" in top[0], f"after delete: {top[0]}"
    print(f"added and deleted new0; now {s.info['n_live_docs']} live documents")
print("quickstart: OK")
