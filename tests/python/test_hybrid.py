"""BM25 and hybrid search over an index's text (SQLite FTS5 beside the metadata): BM25 alone equals
FTS5's ranking computed here with Python's sqlite3; hybrid search at BM25 weight 0 is MaxSim's
ranking, at weight 1 BM25's; filters bind both halves; after adds, deletes and a compaction the
index searches as a fresh build over the same documents; the CLI's runs equal the package's.

Run with PYTHONPATH=BUILD/python (ctest pytest_python) and TMS_BIN for the CLI.
"""
import json
import os
import sqlite3
import subprocess

import numpy as np
import pytest

tilemaxsim = pytest.importorskip("tilemaxsim")
TMS = os.environ.get("TMS_BIN")

WORDS = ("maxsim late interaction token vector search index query document engine gpu kernel recall "
         "bm25 lexical hybrid fusion rank score shard centroid probe rerank colbert plaid text").split()


def fts_query(text):
    """The engine's translation (index/metadata/metadata.h FtsQuery), written again here."""
    words = [w for w in text.split() if any(c.isalnum() or ord(c) >= 0x80 for c in w)]
    return " OR ".join('"' + w.replace('"', '""') + '"' for w in words)


def fts_rank(texts, query, k, allowed=None, tokenize="unicode61"):
    """FTS5's own BM25 ranking of `texts` (rowid = position) for `query`: [(rowid, -bm25)]."""
    c = sqlite3.connect(":memory:")
    c.execute(f"CREATE VIRTUAL TABLE t USING fts5(body, tokenize='{tokenize}')")
    c.executemany("INSERT INTO t(rowid, body) VALUES (?, ?)", list(enumerate(texts)))
    q = fts_query(query)
    if not q:
        return []
    rows = c.execute("SELECT rowid, bm25(t) FROM t WHERE t MATCH ? ORDER BY rank, rowid", (q,)).fetchall()
    return [(r, -s) for r, s in rows if allowed is None or r in allowed][:k]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("hybrid")
    rng = np.random.default_rng(11)
    n = 300
    lens = rng.integers(8, 30, size=n)
    centers = rng.standard_normal((20, 32)).astype(np.float32)
    docs = []
    for m in lens:
        x = centers[rng.integers(0, 20, size=m)] + 0.3 * rng.standard_normal((m, 32)).astype(np.float32)
        docs.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16))
    texts = [" ".join(rng.choice(WORDS, size=int(rng.integers(3, 15)))) for _ in range(n)]
    q = centers[rng.integers(0, 20, size=(10, 8))] + 0.3 * rng.standard_normal((10, 8, 32)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=2, keepdims=True)).astype(np.float16)
    qtexts = [" ".join(rng.choice(WORDS, size=3)) + (" what's?" if i % 3 == 0 else "") for i in range(10)]
    return {"dir": d, "docs": docs, "ids": [f"d{i}" for i in range(n)], "texts": texts, "queries": q,
            "qtexts": qtexts}


def build(corpus, path, sel, **kw):
    tilemaxsim.build_index(path, [corpus["docs"][i] for i in sel], [corpus["ids"][i] for i in sel],
                           keep_vectors=True, n_centroids=16, estimate=False, text_field="text",
                           metadata=[{"text": corpus["texts"][i], "g": i % 2} for i in sel], **kw)


def test_bm25_is_fts5s_ranking_and_filters_bind_it(corpus, tmp_path):
    idx = tmp_path / "idx"
    build(corpus, idx, range(300))
    s = tilemaxsim.Searcher(idx, "cpu")
    ids, scores = s.search(None, k=15, mode="bm25", texts=corpus["qtexts"])
    for qi, qt in enumerate(corpus["qtexts"]):
        want = fts_rank(corpus["texts"], qt, 15)
        assert ids[qi] == [f"d{r}" for r, _ in want], qt
        np.testing.assert_allclose(scores[qi], [x for _, x in want], rtol=1e-5)
    even = {i for i in range(300) if i % 2 == 0}
    ids, _ = s.search(None, k=15, mode="bm25", texts=corpus["qtexts"], filter="g = 0")
    for qi, qt in enumerate(corpus["qtexts"]):
        assert ids[qi] == [f"d{r}" for r, _ in fts_rank(corpus["texts"], qt, 15, even)], qt
    ids, _ = s.search(None, k=5, mode="bm25", texts=["?? !!", ""] + corpus["qtexts"][2:])  # no word: no hits
    assert ids[0] == [] and ids[1] == []
    with pytest.raises(ValueError, match="needs texts="):
        s.search(corpus["queries"], mode="bm25")
    with pytest.raises(ValueError, match="texts: 2 for 10 queries"):
        s.search(corpus["queries"], mode="hybrid", texts=["a", "b"])
    plain = tmp_path / "plain"
    tilemaxsim.build_index(plain, corpus["docs"][:50], n_centroids=8, estimate=False)
    with pytest.raises(Exception, match="this index has no text"):
        tilemaxsim.Searcher(plain, "cpu").search(None, mode="bm25", texts=["maxsim"])
    with pytest.raises(ValueError, match="reserved by SQLite FTS5"):
        tilemaxsim.build_index(tmp_path / "r", corpus["docs"][:50], metadata=[{"rank": "a"}] * 50,
                               text_field="rank", n_centroids=8, estimate=False)
    with pytest.raises(Exception, match="text field 'body'"):
        tilemaxsim.build_index(tmp_path / "x", corpus["docs"][:50], metadata=[{"text": "a"}] * 50,
                               text_field="body", n_centroids=8, estimate=False)


def test_hybrid_weights_give_each_ranking(corpus, tmp_path):
    idx = tmp_path / "idx"
    build(corpus, idx, range(300))
    s = tilemaxsim.Searcher(idx, "cpu")
    q, qt = corpus["queries"], corpus["qtexts"]
    exact, _ = s.search(q, k=10, exhaustive=True)
    bm25, _ = s.search(None, k=10, mode="bm25", texts=qt)
    for fusion in ("rrf", "weighted"):
        only_maxsim, _ = s.search(q, k=10, mode="hybrid", texts=qt, bm25_weight=0, exhaustive=True, fusion=fusion)
        assert only_maxsim == exact, fusion
        only_bm25, _ = s.search(q, k=10, mode="hybrid", texts=qt, bm25_weight=1, fusion=fusion)
        assert only_bm25 == bm25, fusion
        mixed, sc = s.search(q, k=10, mode="hybrid", texts=qt, fusion=fusion)
        assert all(len(m) == 10 for m in mixed) and all(np.all(np.diff(x) <= 0) for x in sc)
    # filters bind both halves
    mixed, _ = s.search(q, k=10, mode="hybrid", texts=qt, filter="g = 1")
    assert all(int(d[1:]) % 2 == 1 for m in mixed for d in m)


@pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
def test_updates_and_compaction_keep_the_text_exact(corpus, tmp_path):
    idx, fresh = tmp_path / "upd", tmp_path / "fresh"
    build(corpus, idx, range(200))
    s = tilemaxsim.Searcher(idx, "cpu")
    s.add([corpus["docs"][i] for i in range(200, 300)], [f"d{i}" for i in range(200, 300)],
          metadata=[{"text": corpus["texts"][i], "g": i % 2} for i in range(200, 300)])
    gone = [f"d{i}" for i in range(0, 300, 7)]
    s.delete(gone)
    ids, _ = s.search(None, k=20, mode="bm25", texts=corpus["qtexts"])
    assert not set(gone) & {d for x in ids for d in x}  # deleted documents never come back
    subprocess.run([TMS, "compact", "--index", idx], check=True, capture_output=True)
    s.refresh()
    keep = [i for i in range(300) if i % 7]
    build(corpus, fresh, keep)
    f = tilemaxsim.Searcher(fresh, "cpu")
    for kw in ({"mode": "bm25"}, {"mode": "hybrid"}, {"mode": "hybrid", "fusion": "weighted", "bm25_weight": 0.3}):
        a = s.search(None if kw["mode"] == "bm25" else corpus["queries"], k=10, texts=corpus["qtexts"], **kw)
        b = f.search(None if kw["mode"] == "bm25" else corpus["queries"], k=10, texts=corpus["qtexts"], **kw)
        assert a[0] == b[0], kw
        for x, y in zip(a[1], b[1]):
            np.testing.assert_allclose(x, y, rtol=1e-5)


@pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
def test_cli_runs_equal_the_packages(corpus, tmp_path):
    idx = tmp_path / "idx"
    build(corpus, idx, range(300), text_tokenizer="porter")
    np.save(tmp_path / "q.npy", corpus["queries"])
    (tmp_path / "q.txt").write_text("\n".join(corpus["qtexts"]) + "\n")
    s = tilemaxsim.Searcher(idx, "cpu")
    for mode in ("bm25", "hybrid"):
        out = tmp_path / f"{mode}.trec"
        r = subprocess.run([TMS, "search", "--index", idx, "--queries", tmp_path / "q.npy", "--query-text",
                            tmp_path / "q.txt", "--mode", mode, "--out", out, "--device", "cpu", "--k", "10",
                            "--no-progress"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        run = {}
        for line in open(out):
            qid, _, doc, _, score, _ = line.split()
            run.setdefault(int(qid), []).append(doc)
        ids, _ = s.search(corpus["queries"], k=10, mode=mode, texts=corpus["qtexts"])
        assert [run.get(i, []) for i in range(10)] == ids, mode
    # --explain: one JSON line per hit, its explanation summing to the hit's MaxSim score
    r = subprocess.run([TMS, "search", "--index", idx, "--queries", tmp_path / "q.npy", "--out", tmp_path / "m.trec",
                        "--explain", tmp_path / "why.jsonl", "--exhaustive", "--device", "cpu", "--k", "3",
                        "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(x) for x in open(tmp_path / "why.jsonl")]
    assert len(lines) == 30 and all(abs(sum(x["similarities"]) - x["score"]) < 2e-3 for x in lines)
    assert lines[0]["query"] == "0" and not lines[0]["from_codes"]
    r = subprocess.run([TMS, "search", "--index", idx, "--queries", tmp_path / "q.npy", "--out", tmp_path / "m.trec",
                        "--explain", tmp_path / "q.npy", "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode != 0 and "--explain" in r.stderr  # never over an input
        # porter stems: "searching" finds "search"
    ids, _ = s.search(None, k=3, mode="bm25", texts=["searching"])
    assert ids[0] and all("search" in corpus["texts"][int(d[1:])] for d in ids[0])
    r = subprocess.run([TMS, "search", "--index", idx, "--queries", tmp_path / "q.npy", "--mode", "bm25", "--out",
                        tmp_path / "x.trec", "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode != 0 and "--mode bm25 needs --query-text" in r.stderr


def test_explanations_sum_to_the_scores(corpus, tmp_path):
    """Searcher.explain: per query token the best document token and its similarity; the sum is
    the exhaustive score, the positions are the document's tokens."""
    idx = tmp_path / "idx"
    build(corpus, idx, range(300))
    s = tilemaxsim.Searcher(idx, "cpu")
    q = corpus["queries"]
    ids, scores = s.search(q, k=5, exhaustive=True)
    ex = s.explain(q, ids)
    for qi in range(len(q)):
        for j, d in enumerate(ids[qi]):
            e = ex[qi][j]
            assert not e["from_codes"] and len(e["doc_tokens"]) == q.shape[1]
            assert abs(float(e["similarities"].sum()) - float(scores[qi][j])) < 2e-3
            rows = s.document_vectors([d])[0].astype(np.float32)
            sims = q[qi].astype(np.float32) @ rows.T
            np.testing.assert_array_equal(e["doc_tokens"], sims.argmax(axis=1))
            np.testing.assert_allclose(e["similarities"], sims.max(axis=1), atol=1e-4)
    with pytest.raises(KeyError, match="'nope' is not in the index"):
        s.explain(q[:1], [["nope"]])


def word_spans(text, n):
    """n token spans over `text`: token t is word t % words (a stand-in for a tokenizer's offsets)."""
    starts, at = [], 0
    for w in text.split(" "):
        starts.append((at, at + len(w)))
        at += len(w) + 1
    return [list(starts[t % len(starts)]) for t in range(n)]


@pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
def test_explanations_name_the_matched_passages(corpus, tmp_path):
    """With each document's token spans given at index time (spans_field), an explanation gives
    each query token's best document token as character offsets into the document's text, for
    the documents built and added, through Python, the CLI and after a compaction; bad spans are
    refused naming the document."""
    idx = tmp_path / "idx"
    docs, texts = corpus["docs"], corpus["texts"]
    meta = [{"text": texts[i], "spans": word_spans(texts[i], len(docs[i]))} for i in range(300)]
    tilemaxsim.build_index(idx, docs[:250], corpus["ids"][:250], keep_vectors=True, n_centroids=16, estimate=False,
                           text_field="text", spans_field="spans", metadata=meta[:250])
    tilemaxsim.add_documents(idx, docs[250:], corpus["ids"][250:], metadata=meta[250:])
    q = corpus["queries"]

    def check(searcher):
        ids, _ = searcher.search(q, k=5, exhaustive=True)
        assert any(int(d[1:]) >= 250 for r in ids for d in r)  # added documents explained too
        for qi, (row, ex) in enumerate(zip(ids, searcher.explain(q, ids))):
            for d, e in zip(row, ex):
                i = int(d[1:])
                want = np.array(word_spans(texts[i], len(docs[i])), dtype=np.int32)[e["doc_tokens"]]
                np.testing.assert_array_equal(e["spans"], want)
                assert all(texts[i][a:b] in texts[i].split(" ") for a, b in e["spans"])
        return ids

    ids = check(tilemaxsim.Searcher(idx, "cpu"))
    np.save(tmp_path / "q.npy", q)
    r = subprocess.run([TMS, "search", "--index", idx, "--queries", tmp_path / "q.npy", "--out", tmp_path / "r.trec",
                        "--k", "5", "--exhaustive", "--explain", tmp_path / "e.jsonl", "--device", "cpu",
                        "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    lines = [json.loads(l) for l in (tmp_path / "e.jsonl").read_text().splitlines()]
    assert len(lines) == 50 and all(len(x["spans"]) == q.shape[1] for x in lines)
    first = lines[0]
    i = int(first["doc"][1:])
    assert first["spans"] == [word_spans(texts[i], len(docs[i]))[t] for t in first["doc_tokens"]]
    tilemaxsim.delete_documents(idx, ["d3"])
    subprocess.run([TMS, "compact", "--index", idx], check=True, capture_output=True)
    check(tilemaxsim.Searcher(idx, "cpu"))

    bad = dict(meta[251])
    for spans, why in ((bad["spans"][:-1], f"{len(bad['spans']) - 1} spans for {len(docs[251])} tokens"),
                       ([[0, 10_000]] * len(docs[251]), "is not within the text's"),
                       ([[3, 1]] * len(docs[251]), "is not within the text's"),
                       ([[0]] * len(docs[251]), "expected a [start, end] pair of integers"),
                       (7, "expected an array of [start, end] pairs")):
        with pytest.raises(Exception, match=rf"document 'x': spans: .*{why}" if "[" not in why else "document 'x'"):
            tilemaxsim.add_documents(idx, [docs[251]], ["x"], metadata=[dict(bad, spans=spans)])
        with pytest.raises(Exception, match="document 'x'"):
            tilemaxsim.build_index(tmp_path / "bad", [docs[251]] * 2, ["x", "y"], n_centroids=4, estimate=False,
                                   text_field="text", spans_field="spans", metadata=[dict(bad, spans=spans), bad])
        assert not (tmp_path / "bad").exists()
    for kw, why in (({"text_field": ""}, "a text_field is needed"), ({"pool_factor": 2}, "a pooled token has no one span"),
                    ({"spans_field": "nope"}, "no field of that name")):
        args = dict(n_centroids=4, estimate=False, text_field="text", spans_field="spans", metadata=meta[:20])
        args.update(kw)
        with pytest.raises(Exception, match=why):
            tilemaxsim.build_index(tmp_path / "bad", docs[:20], corpus["ids"][:20], **args)
    # An index without spans explains without them.
    plain = tmp_path / "plain"
    build(corpus, plain, range(100))
    s = tilemaxsim.Searcher(plain, "cpu")
    ids, _ = s.search(q[:2], k=3, exhaustive=True)
    assert all(e["spans"] is None for row in s.explain(q[:2], ids) for e in row)
