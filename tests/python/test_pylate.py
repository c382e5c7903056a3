"""The PyLate adapter through PyLate itself (pylate from PyPI): a tiny random ColBERT model made
here (no download) encodes a small corpus, TileMaxSimIndex serves retrieve.ColBERT, and the results
are checked against exact MaxSim (pylate.rank.rerank) and PyLate's own PLAID index on the same
embeddings.

Skipped where PyLate is not installed; scripts/test.sh runs it in a virtual environment with
pylate (scripts/pylate_env.sh).
"""
from __future__ import annotations

import os
import string
import time

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

pylate = pytest.importorskip("pylate")
from pylate import indexes, models, rank, retrieve  # noqa: E402
from pylate.indexes.base import Base  # noqa: E402

import tilemaxsim  # noqa: E402
from tilemaxsim.pylate import TileMaxSimIndex  # noqa: E402

WORDS = ("fruit fruits apple apples banana healthy health good food eat car cars engine road drive fast speed "
         "music song songs guitar play piano cat cats dog dogs pet animal city river mountain water sea boat "
         "ship train rail sky star moon sun rain snow cold hot search index document query vector token red "
         "green blue small big new old").split()
N_DOCS, K = 60, 5


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A random 2-layer BERT with a WordPiece vocabulary of its own, saved and loaded as PyLate loads
    any checkpoint (it adds the ColBERT projection)."""
    import torch
    from transformers import BertConfig, BertModel, BertTokenizerFast

    folder = tmp_path_factory.mktemp("tiny-bert")
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + list(string.ascii_lowercase) + \
        [f"##{c}" for c in string.ascii_lowercase] + list(string.punctuation) + list(string.digits) + WORDS
    (folder / "vocab.txt").write_text("\n".join(dict.fromkeys(vocab)) + "\n")
    # Positional: transformers 5 ignores a `vocab_file=` keyword (every word would be [UNK]).
    tokenizer = BertTokenizerFast(str(folder / "vocab.txt"), do_lower_case=True)
    assert tokenizer.tokenize("fruits") == ["fruits"]
    torch.manual_seed(0)
    config = BertConfig(vocab_size=len(tokenizer), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=128)
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return models.ColBERT(model_name_or_path=str(folder), device="cpu", embedding_size=32)


@pytest.fixture(scope="module")
def data(model):
    rng = np.random.default_rng(7)
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(N_DOCS)]
    queries = [" ".join(rng.choice(WORDS, size=2)) for _ in range(8)]
    docs = model.encode(texts, is_query=False, show_progress_bar=False)
    qs = model.encode(queries, is_query=True, show_progress_bar=False)
    ids = [f"doc{i}" for i in range(N_DOCS)]
    exact = rank.rerank(documents_ids=[ids] * len(qs), queries_embeddings=qs, documents_embeddings=[docs] * len(qs),
                        device="cpu")
    return {"ids": ids, "docs": docs, "queries": qs, "exact": exact}


@pytest.fixture(scope="module")
def index(data, tmp_path_factory):
    index = TileMaxSimIndex(index_folder=str(tmp_path_factory.mktemp("tms")), index_name="docs", override=True,
                            device="cpu")
    return index.add_documents(documents_ids=data["ids"], documents_embeddings=data["docs"])


def recall(results, reference, k=K):
    return np.mean([len({r["id"] for r in got[:k]} & {r["id"] for r in ref[:k]}) / k
                    for got, ref in zip(results, reference)])


def test_is_a_pylate_index(index):
    assert isinstance(index, Base) and index.is_end_to_end_index is True


def test_retrieve_through_pylate_equals_exact_maxsim(index, data):
    results = retrieve.ColBERT(index=index).retrieve(queries_embeddings=data["queries"], k=K)
    assert len(results) == len(data["queries"])
    for row, ref in zip(results, data["exact"]):
        assert len(row) == K and all(set(r) == {"id", "score"} for r in row)
        assert [r["score"] for r in row] == sorted((r["score"] for r in row), reverse=True)
        ref_scores = {r["id"]: r["score"] for r in ref}
        for r in row:  # exact MaxSim on the stored fp16 vectors
            assert r["score"] == pytest.approx(ref_scores[r["id"]], rel=5e-3, abs=1e-3)
    assert recall(results, data["exact"]) >= 0.95


def test_one_query_subsets_and_filters(index, data, tmp_path):
    qs = data["queries"]
    one = retrieve.ColBERT(index=index).retrieve(queries_embeddings=qs[0], k=2)  # a single [tokens, dim] query
    assert len(one) == 1 and [r["id"] for r in one[0]] == [r["id"] for r in data["exact"][0][:2]]
    got = index(qs[:2], k=3, subset=["doc1", "doc2", "not-there"])
    assert [{r["id"] for r in row} for row in got] == [{"doc1", "doc2"}] * 2
    got = index(qs[:2], k=3, subset=[["doc1"], ["doc2", "doc3"]])
    assert {r["id"] for r in got[0]} == {"doc1"} and {r["id"] for r in got[1]} == {"doc2", "doc3"}
    assert index(qs[:2], k=3, subset=[]) == [[], []]
    with_meta = TileMaxSimIndex(index_folder=str(tmp_path), index_name="m", override=True, device="cpu")
    with_meta.add_documents(data["ids"], data["docs"], metadata=[{"even": i % 2 == 0} for i in range(N_DOCS)])
    got = with_meta(qs[:3], k=10, filter="even = 1")
    assert all(int(r["id"][3:]) % 2 == 0 for row in got for r in row) and all(len(row) == 10 for row in got)


def test_documents_embeddings_come_from_the_stored_vectors(index, data):
    got = index.get_documents_embeddings([["doc0", "doc5"], ["doc2"]])
    assert [len(g) for g in got] == [2, 1]
    for g, i in ((got[0][0], 0), (got[0][1], 5), (got[1][0], 2)):
        np.testing.assert_allclose(g, np.asarray(data["docs"][i], dtype=np.float32), atol=2e-3)  # fp16 of them
    with pytest.raises(KeyError, match="'nope' is not in the index"):
        index.get_documents_embeddings([["nope"]])


def test_updates_and_python_worded_errors(data, tmp_path):
    index = TileMaxSimIndex(index_folder=str(tmp_path), index_name="u", override=True, device="cpu")
    index.add_documents(data["ids"][:40], data["docs"][:40])
    with pytest.raises(ValueError, match=r"ids\[0\]: id 'doc0' is already in the index \(pass replace=True"):
        index.add_documents(["doc0"], data["docs"][:1])
    index.update_documents(["doc0"], data["docs"][50:51])  # replaced by another document's vectors
    np.testing.assert_allclose(index.get_documents_embeddings([["doc0"]])[0][0],
                               np.asarray(data["docs"][50], dtype=np.float32), atol=2e-3)
    index.remove_documents(["doc1"])
    assert "doc1" not in {r["id"] for r in index(data["queries"][:1], k=40)[0]}
    with pytest.raises(KeyError, match=r"ids\[0\]: no document 'nope'"):
        index.remove_documents(["nope"])


def test_against_pylates_plaid_on_the_same_embeddings(index, data, tmp_path):
    """PyLate's own PLAID index (fast-plaid) beside ours, through the same retriever: recall@5
    against exact MaxSim and queries/s (printed), both on this CPU."""
    pytest.importorskip("fast_plaid")
    plaid = indexes.PLAID(index_folder=str(tmp_path), index_name="plaid", override=True, device="cpu", nbits=4,
                          kmeans_niters=4, n_ivf_probe=8, n_full_scores=256, show_progress=False, use_triton=False,
                          seed=42)
    plaid.add_documents(documents_ids=data["ids"], documents_embeddings=data["docs"])
    rows = {}
    for name, idx in (("plaid", plaid), ("tilemaxsim", index)):
        retriever = retrieve.ColBERT(index=idx)
        retriever.retrieve(queries_embeddings=data["queries"], k=K)  # warm
        t0 = time.perf_counter()
        got = retriever.retrieve(queries_embeddings=data["queries"], k=K)
        rows[name] = (recall(got, data["exact"]), len(data["queries"]) / (time.perf_counter() - t0))
    print("\nrecall@5 vs exact, queries/s:", {n: (round(r, 3), round(q, 1)) for n, (r, q) in rows.items()})
    assert rows["tilemaxsim"][0] >= rows["plaid"][0]


def test_text_in_through_the_pylate_model(model, data, tmp_path):
    """build_index(texts=, model=) and Searcher.search_text with PyLate's model give what the
    embeddings it encodes give."""
    rng = np.random.default_rng(7)  # the texts of the data fixture
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(N_DOCS)]
    queries = [" ".join(rng.choice(WORDS, size=2)) for _ in range(8)]
    tilemaxsim.build_index(tmp_path / "t", texts=texts, ids=data["ids"], model=model, keep_vectors=True,
                           n_centroids=16, progress=False)
    tilemaxsim.build_index(tmp_path / "e", data["docs"], data["ids"], keep_vectors=True, n_centroids=16,
                           progress=False)
    by_text = tilemaxsim.Searcher(tmp_path / "t", "cpu").search_text(queries, model, k=K, exhaustive=True)
    by_emb = tilemaxsim.Searcher(tmp_path / "e", "cpu").search(data["queries"], k=K, exhaustive=True)
    assert by_text[0] == by_emb[0]
    np.testing.assert_allclose(np.array(by_text[1]), np.array(by_emb[1]), rtol=1e-5)
    one = tilemaxsim.Searcher(tmp_path / "t", "cpu").search_text(queries[0], model, k=K, exhaustive=True)
    assert one[0] == by_emb[0][:1]  # a str is one query


def test_a_stream_of_batches_straight_from_the_pylate_encoder(model, data, tmp_path):
    """build_index over a generator of PyLate's encode() batches (nothing held whole) builds the
    index the same encodings build given at once."""
    rng = np.random.default_rng(7)  # the texts of the data fixture
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 9)))) for _ in range(N_DOCS)]
    ids = data["ids"]

    def batches(size=7):
        for a in range(0, len(texts), size):
            yield model.encode(texts[a:a + size], is_query=False, show_progress_bar=False), ids[a:a + size]

    tilemaxsim.build_index(tmp_path / "s", batches(), keep_vectors=True, n_centroids=16, progress=False)
    whole = [d for docs, _ in batches() for d in docs]  # the same encodings, held and given at once
    tilemaxsim.build_index(tmp_path / "e", whole, ids, keep_vectors=True, n_centroids=16, progress=False)
    a = tilemaxsim.Searcher(tmp_path / "s", "cpu").search(data["queries"], k=K, exhaustive=True)
    b = tilemaxsim.Searcher(tmp_path / "e", "cpu").search(data["queries"], k=K, exhaustive=True)
    assert a[0] == b[0]
    np.testing.assert_allclose(np.array(a[1]), np.array(b[1]), rtol=1e-5)
