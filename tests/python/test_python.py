"""The Python package: results equal the CLI's, rerank equals exhaustive scores, the PyLate
adapter's round trip, bad input as exceptions with the engine's message, and Ctrl-C.

Run with PYTHONPATH=BUILD/python (ctest pytest_python) and TMS_BIN for the CLI comparisons.
"""
import json
import os
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

tilemaxsim = pytest.importorskip("tilemaxsim")
TMS = os.environ.get("TMS_BIN")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("py")
    rng = np.random.default_rng(3)
    lens = rng.integers(8, 40, size=400)
    centers = rng.standard_normal((30, 64)).astype(np.float32)
    docs = []
    for n in lens:
        x = centers[rng.integers(0, 30, size=n)] + 0.3 * rng.standard_normal((n, 64)).astype(np.float32)
        docs.append((x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float16))
    q = centers[rng.integers(0, 30, size=(12, 16))] + 0.3 * rng.standard_normal((12, 16, 64)).astype(np.float32)
    q = (q / np.linalg.norm(q, axis=2, keepdims=True)).astype(np.float16)
    ids = [f"doc{i}" for i in range(len(docs))]
    idx = d / "idx"
    tilemaxsim.build_index(idx, docs, ids, keep_vectors=True, n_centroids=32)
    np.save(d / "queries.npy", q)
    return {"dir": d, "docs": docs, "ids": ids, "queries": q, "index": idx}


def read_trec(path):
    run = {}
    for line in open(path):
        qid, _, doc, _, score, _ = line.split()
        run.setdefault(qid, []).append((doc, float(score)))
    return run


@pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
@pytest.mark.parametrize("mode", [(), ("--exhaustive",)])
def test_search_equals_the_cli(corpus, tmp_path, mode):
    out = tmp_path / "run.trec"
    subprocess.run([TMS, "search", "--index", corpus["index"], "--queries", corpus["dir"] / "queries.npy", "--out",
                    out, "--k", "10", "--device", "cpu", "--no-progress", *mode], check=True, capture_output=True)
    cli = read_trec(out)
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    for q in (corpus["queries"], corpus["queries"].astype(np.float32)):  # fp16 as stored, and fp32 of it
        ids, scores = s.search(q, k=10, exhaustive=bool(mode))
        for i in range(len(ids)):
            assert ids[i] == [d for d, _ in cli[str(i)]]
            assert np.allclose(scores[i], [s for _, s in cli[str(i)]], rtol=1e-5)


def _torch_devices(torch):
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def test_torch_tensors_equal_numpy(corpus):
    torch = pytest.importorskip("torch")
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    for exhaustive in (False, True):
        want = s.search(corpus["queries"], k=10, exhaustive=exhaustive)
        for dev in _torch_devices(torch):
            for q in (corpus["queries"], corpus["queries"].astype(np.float32)):
                got = s.search(torch.from_numpy(q).to(dev), k=10, exhaustive=exhaustive)
                assert got[0] == want[0], dev
                assert all(np.allclose(a, b, rtol=1e-6) for a, b in zip(got[1], want[1])), dev
            # a ragged list of tensors, each query's own length
            ragged = [torch.from_numpy(q[: 8 + i % 8]).to(dev) for i, q in enumerate(corpus["queries"])]
            want_r = s.search([t.cpu().numpy() for t in ragged], k=10, exhaustive=exhaustive)
            assert s.search(ragged, k=10, exhaustive=exhaustive)[0] == want_r[0], dev


def test_torch_bfloat16_equals_float32_of_the_same_values(corpus):
    torch = pytest.importorskip("torch")
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    for dev in _torch_devices(torch):
        qb = torch.from_numpy(corpus["queries"]).to(dev).to(torch.bfloat16)
        got = s.search(qb, k=10, exhaustive=True)
        want = s.search(qb.float().cpu().numpy(), k=10, exhaustive=True)
        assert got[0] == want[0], dev
        assert all(np.array_equal(a, b) for a, b in zip(got[1], want[1])), dev


def test_torch_documents_build_the_numpy_index(corpus, tmp_path):
    torch = pytest.importorskip("torch")
    want = tilemaxsim.Searcher(corpus["index"], "cpu").search(corpus["queries"], k=10, exhaustive=True)
    for dev in _torch_devices(torch):
        docs = [torch.from_numpy(d).to(dev) for d in corpus["docs"]]
        tilemaxsim.build_index(tmp_path / dev, docs, corpus["ids"], keep_vectors=True, n_centroids=32, device="cpu")
        got = tilemaxsim.Searcher(tmp_path / dev, "cpu").search(corpus["queries"], k=10, exhaustive=True)
        assert got[0] == want[0], dev
        assert all(np.array_equal(a, b) for a, b in zip(got[1], want[1])), dev


def _gpu_searcher(index):
    try:
        return tilemaxsim.Searcher(index, "gpu")
    except Exception as e:  # a CPU-only build, or no GPU
        pytest.skip(f"no GPU searcher: {e}")


def test_gpu_searcher_equals_cpu(corpus):
    g = _gpu_searcher(corpus["index"])
    c = tilemaxsim.Searcher(corpus["index"], "cpu")
    assert g.device == "gpu"
    for exhaustive in (False, True):
        want = c.search(corpus["queries"], k=10, exhaustive=exhaustive)
        got = g.search(corpus["queries"], k=10, exhaustive=exhaustive)
        assert got[0] == want[0]
        assert all(np.allclose(a, b, rtol=1e-3) for a, b in zip(got[1], want[1]))
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        got = g.search(torch.from_numpy(corpus["queries"]).cuda(), k=10)
        assert got[0] == g.search(corpus["queries"], k=10)[0]


def test_bfloat16_queries_equal_float32_of_the_same_values(corpus):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    q16 = corpus["queries"].astype(np.float32).astype(ml_dtypes.bfloat16)
    got = s.search(q16, k=10, exhaustive=True)
    want = s.search(q16.astype(np.float32), k=10, exhaustive=True)
    assert got[0] == want[0]
    assert all(np.array_equal(a, b) for a, b in zip(got[1], want[1]))


def test_documents_as_a_list_or_one_array(corpus, tmp_path):
    flat = np.concatenate(corpus["docs"])
    lens = [len(d) for d in corpus["docs"]]
    tilemaxsim.build_index(tmp_path / "flat", flat, corpus["ids"], lengths=lens, keep_vectors=True, n_centroids=32)
    a = tilemaxsim.Searcher(corpus["index"], "cpu").search(corpus["queries"], k=5, exhaustive=True)
    b = tilemaxsim.Searcher(tmp_path / "flat", "cpu").search(corpus["queries"], k=5, exhaustive=True)
    assert a[0] == b[0]
    info = tilemaxsim.index_info(tmp_path / "flat")
    assert info["n_docs"] == 400 and info["dim"] == 64 and info["has_vectors"] and info["unit_norm"]


def test_vectors_on_disk_give_the_same_results(corpus):
    host = tilemaxsim.Searcher(corpus["index"], "cpu", vectors="host")
    disk = tilemaxsim.Searcher(corpus["index"], "cpu", vectors="disk")
    for exhaustive in (False, True):
        a = host.search(corpus["queries"], k=10, exhaustive=exhaustive)
        b = disk.search(corpus["queries"], k=10, exhaustive=exhaustive)
        assert a[0] == b[0]
        assert all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))
    with pytest.raises(ValueError, match="expected auto, gpu, host, disk or none"):
        tilemaxsim.Searcher(corpus["index"], "cpu", vectors="ram")
    none = tilemaxsim.Searcher(corpus["index"], "cpu", vectors="none")
    with pytest.raises(Exception, match="not loaded"):
        none.search(corpus["queries"], exhaustive=True)


def _no_vector_estimate(corpus):
    """An index without vectors is measured at build time against the documents it was given:
    on a sample, each point's recall is what the compressed search of the sample at that point
    finds of the exact top 10 (numpy's MaxSim over the input); and searches plan from it."""
    docs, q = corpus["docs"][:150], corpus["queries"]
    idx = corpus["dir"] / "novec"
    tilemaxsim.build_index(idx, docs, n_centroids=16, device="cpu", estimate_sample=q)
    e = json.loads((idx / "estimate.json").read_text())
    assert e["compressed"] and e["sample"] and e["queries"] == len(q)
    exact = np.stack([[float((qq.astype(np.float32) @ d.astype(np.float32).T).max(axis=1).sum()) for d in docs]
                      for qq in q])
    truth = [set(np.lexsort((np.arange(len(docs)), -row))[:10]) for row in exact]
    s = tilemaxsim.Searcher(idx, "cpu")
    for p in e["points"]:
        got = s.search(q, k=10, target_recall=0, nprobe=p["nprobe"], ncandidates=p["ncandidates"])[0]
        measured = np.mean([len(t & {int(x) for x in g}) / len(t) for t, g in zip(truth, got)])
        assert p["recall"] == pytest.approx(measured, abs=1e-9), p
    if not TMS:
        return
    info = subprocess.run([TMS, "info", "--index", idx], capture_output=True, text=True, check=True).stdout
    assert "estimate_truth\tinput (compressed ranking" in info
    # Pseudo-queries by default; `tms estimate --docs` measures an index without vectors again.
    tilemaxsim.build_index(idx, docs, n_centroids=16, device="cpu", overwrite=True)
    assert json.loads((idx / "estimate.json").read_text())["compressed"]
    np.save(corpus["dir"] / "d.npy", np.concatenate(docs))
    np.save(corpus["dir"] / "l.npy", np.array([len(d) for d in docs]))
    r = subprocess.run([TMS, "estimate", "--index", idx, "--docs", corpus["dir"] / "d.npy", "--doclens",
                        corpus["dir"] / "l.npy", "--device", "cpu", "--queries", "12"], capture_output=True, text=True)
    assert r.returncode == 0 and "compressed ranking against the input" in r.stderr, r.stderr
    assert json.loads((idx / "estimate.json").read_text())["queries"] == 12
    r = subprocess.run([TMS, "estimate", "--index", idx, "--device", "cpu"], capture_output=True, text=True)
    assert r.returncode != 0 and "or the documents the index was built from" in r.stderr, r.stderr


def test_codec_auto_takes_the_fewest_sub_quantizers_that_reach_the_target(tmp_path):
    """build_index(codec="auto"), as tms index --codec auto: PQ of dim/8 sub-quantizers, then
    twice and four times as many, until the compressed estimate reaches the target beyond its
    sampling error (recall - 1.645 se), else the last, with a warning."""
    rng = np.random.default_rng(5)
    noise = [rng.standard_normal((int(n), 64)).astype(np.float32) for n in rng.integers(4, 24, 300)]
    docs = [(d / np.linalg.norm(d, axis=1, keepdims=True)).astype(np.float16) for d in noise]

    def reaches(idx, target):
        e = json.loads((idx / "estimate.json").read_text())
        assert e["compressed"]
        return any(p["recall"] - 1.645 * p["se"] >= target for p in e["points"] if p["nprobe"] >= 8)

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        tilemaxsim.build_index(tmp_path / "deep", docs, codec="auto", n_centroids=64, device="cpu")
    pq_m = tilemaxsim.index_info(tmp_path / "deep")["pq_m"]
    assert pq_m in (8, 16, 32)
    if reaches(tmp_path / "deep", 0.99):  # the first that reaches; those before it did not
        assert not any("keeping PQ" in str(x.message) for x in w)
    else:
        assert pq_m == 32 and any("no PQ up to 32 sub-quantizers reaches recall 0.99" in str(x.message) for x in w)
    tilemaxsim.build_index(tmp_path / "easy", docs, codec="auto", target_recall=0.2, n_centroids=64, device="cpu")
    assert tilemaxsim.index_info(tmp_path / "easy")["pq_m"] == 8 and reaches(tmp_path / "easy", 0.2)
    for kw, needle in (({"keep_vectors": True}, "keep_vectors"), ({"pq_m": 16}, "pq_m"),
                       ({"estimate": False}, "estimate=False")):
        with pytest.raises(ValueError, match=needle):
            tilemaxsim.build_index(tmp_path / "no", docs, codec="auto", device="cpu", **kw)
        assert not (tmp_path / "no").exists()
    with pytest.raises(ValueError, match="codec='auto'"):
        tilemaxsim.build_index(tmp_path / "no", docs, target_recall=0.9, device="cpu")


def test_recall_estimate_is_measured_and_used(corpus):
    assert (corpus["index"] / "estimate.json").exists()  # build_index(keep_vectors=True) measured it
    e = tilemaxsim.estimate_recall(corpus["index"], queries=16, device="cpu")
    assert e["queries"] == 16 and e["k"] == 10
    d = tilemaxsim.search_defaults()
    default = lambda e: next(p for p in e["points"] if (p["nprobe"], p["ncandidates"], p["rerank"]) ==
                             (d["nprobe"], d["ncandidates"], d["rerank"]))
    assert e["points"][0]["nprobe"] < d["nprobe"]  # cheaper settings first, for targets below the default
    assert all(0 <= p["recall"] <= 1 for p in e["points"]) and not e["sample"]
    # A sample of one's own queries: the default point is their recall against exhaustive search.
    e = tilemaxsim.estimate_recall(corpus["index"], device="cpu", sample=corpus["queries"])
    assert e["sample"] and e["queries"] == len(corpus["queries"])
    assert e["measured_at"].endswith("Z") and e["measured_at"][:4].isdigit()  # UTC, ISO 8601
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    truth = s.search(corpus["queries"], k=10, exhaustive=True)[0]
    got = s.search(corpus["queries"], k=10, target_recall=0)[0]
    assert default(e)["recall"] == pytest.approx(np.mean([len(set(t) & set(g)) / len(t) for t, g in zip(truth, got)]))
    with pytest.raises(Exception, match="dimension"):
        tilemaxsim.estimate_recall(corpus["index"], device="cpu", sample=np.zeros((2, 4, 8), np.float32))
    # The build's own estimate of a sample.
    fresh = corpus["dir"] / "sampled"
    tilemaxsim.build_index(fresh, corpus["docs"][:100], keep_vectors=True, n_centroids=16, device="cpu",
                           estimate_sample=corpus["queries"][:5])
    assert json.loads((fresh / "estimate.json").read_text())["queries"] == 5
    a = s.search(corpus["queries"], k=10, target_recall=0)
    b = s.search(corpus["queries"], k=10)
    assert len(a[0]) == len(b[0]) == len(corpus["queries"])
    _no_vector_estimate(corpus)
    with pytest.raises(ValueError, match="target_recall"):
        s.search(corpus["queries"], target_recall=2)


def test_rerank_equals_exhaustive_scores_of_the_candidates(corpus):
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    every_ids, every_scores = s.search(corpus["queries"], k=400, exhaustive=True)
    rng = np.random.default_rng(1)
    cands = [list(rng.choice(corpus["ids"], size=30, replace=False)) for _ in range(len(corpus["queries"]))]
    ids, scores = s.rerank(corpus["queries"], cands)
    for q in range(len(cands)):
        exact = {d: sc for d, sc in zip(every_ids[q], every_scores[q])}
        want = sorted(cands[q], key=lambda d: (-exact[d], int(d[3:])))
        assert ids[q] == want
        assert np.allclose(scores[q], [exact[d] for d in want], rtol=1e-5)
    ids, _ = s.rerank(corpus["queries"], cands, k=3)
    assert all(len(i) == 3 for i in ids)
    with pytest.raises(ValueError, match="'nope' is not in the index"):
        s.rerank(corpus["queries"][:1], [["doc1", "nope"]])
    assert s.rerank(corpus["queries"][:1], [["doc1", "nope"]], skip_unknown=True)[0] == [["doc1"]]


def test_queries_as_a_list_of_ragged_arrays(corpus):
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    full = [q[:n] for q, n in zip(corpus["queries"], [16, 5, 9] * 4)]
    ids, _ = s.search(full, k=5, exhaustive=True)
    one = s.search(corpus["queries"][1][:5], k=5, exhaustive=True)[0][0]  # a single [tokens, dim] query
    assert ids[1] == one


@pytest.mark.parametrize("bad,message", [
    (lambda q: q[:, :, :32], "query dimension 32 differs from the index's 64"),
    (lambda q: np.where(np.arange(64) == 7, np.nan, q.astype(np.float32)), "non-finite value (NaN)"),
    (lambda q: q.astype(np.complex64), "unsupported dtype"),
    (lambda q: q[0, 0], "expected [n_queries, tokens, dim]"),
    (lambda q: [q[0], q[1][:, :10]], "ragged dimensions"),
])
def test_bad_queries_raise_with_the_engines_message(corpus, bad, message):
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    with pytest.raises(ValueError) as e:
        s.search(bad(corpus["queries"]), k=5)
    assert message in str(e.value)


def test_bad_documents_and_options(tmp_path, corpus):
    with pytest.raises(ValueError, match="ragged dimensions"):
        tilemaxsim.build_index(tmp_path / "x", [np.zeros((3, 8), np.float32), np.zeros((3, 9), np.float32)])
    with pytest.raises(ValueError, match="unknown option 'codecs'"):
        tilemaxsim.build_index(tmp_path / "x", corpus["docs"], codecs="pq")
    bad = [d.astype(np.float32) for d in corpus["docs"]]
    bad[3][1, 2] = np.inf
    with pytest.raises(ValueError, match="non-finite"):
        tilemaxsim.build_index(tmp_path / "x", bad, n_centroids=32)
    assert not (tmp_path / "x").exists()
    with pytest.raises(FileNotFoundError, match="no such index"):
        tilemaxsim.Searcher(tmp_path / "missing")


def test_a_string_is_one_id_never_its_characters(corpus, tmp_path):
    """A str where ids are expected is one id (or a TypeError where one id cannot do); numpy
    arrays, sets and generators of ids are ids too."""
    idx = tmp_path / "ids"
    docs = corpus["docs"][:40]
    ids = [str(i) for i in range(1, 41)]  # "1".."40": "17" and its characters "1", "7" are all ids
    tilemaxsim.build_index(idx, docs, ids, keep_vectors=True, n_centroids=8, estimate=False)
    s = tilemaxsim.Searcher(idx, "cpu")
    q = corpus["queries"][:2]
    assert s.search(q, k=5, subset="17")[0] == [["17"], ["17"]]
    assert s.search(q, k=5, subset=b"17")[0] == [["17"], ["17"]]
    for subset in (np.array([17, 18]), {17, "18"}, (i for i in ["17", "18"]), np.array(["17", "18"])):
        assert all(set(r) == {"17", "18"} for r in s.search(q, k=5, subset=subset)[0]), subset
    assert s.search(q, k=5, subset=[np.array([17]), {"18"}])[0] == [["17"], ["18"]]  # one per query
    assert s.rerank(q, ["17", ["18", "19"]], k=5)[0][0] == ["17"]
    with pytest.raises(TypeError, match="an id must be a str, bytes or an integer, got float"):
        s.search(q, k=5, subset=[1.5])
    # Deleting "17" deletes "17" only.
    assert tilemaxsim.delete_documents(idx, "17") == 1
    assert tilemaxsim.delete_documents(idx, ["17"]) == 0  # deleted before
    info = tilemaxsim.index_info(idx)
    assert info["n_deleted"] == 1
    s = tilemaxsim.Searcher(idx, "cpu")
    everything = s.search(q, k=100, exhaustive=True)[0][0]
    assert "17" not in everything and {"1", "7"} <= set(everything)
    # A build needs one id per document: one string for 40 documents is an error, not 40 ids.
    with pytest.raises(TypeError, match="a single str is one id, and 40 documents need 40 ids"):
        tilemaxsim.build_index(tmp_path / "x", docs, "abcdefghij" * 4)
    assert not (tmp_path / "x").exists()
    tilemaxsim.build_index(tmp_path / "one", [docs[0]] * 300, np.arange(300), n_centroids=8, codec="residual")
    assert tilemaxsim.index_info(tmp_path / "one")["n_docs"] == 300


@pytest.mark.parametrize("call,error,message", [
    (lambda s, q: s.search(q, k=2**40), ValueError, "k must be in [1, 2147483647], got 1099511627776"),
    (lambda s, q: s.search(q, k=0), ValueError, "k must be in [1, 2147483647], got 0"),
    (lambda s, q: s.search(q, k="10"), TypeError, "k must be an integer, got str"),
    (lambda s, q: s.search(q, k=5, nprobe=-1), ValueError, "nprobe must be in [1, 2147483647], got -1"),
    (lambda s, q: s.rerank(q, [["doc1"]] * len(q), k=-1), ValueError, "k must be in [0, 2147483647], got -1"),
])
def test_bad_numbers_raise_one_line(corpus, call, error, message):
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    with pytest.raises(error) as e:
        call(s, corpus["queries"])
    assert str(e.value) == message


@pytest.mark.parametrize("batch", [0, -1])
def test_bad_batch_raises(corpus, batch):
    with pytest.raises(ValueError, match=f"batch must be in \\[1, 2147483647\\], got {batch}"):
        tilemaxsim.Searcher(corpus["index"], "cpu", batch=batch)


def test_values_fp16_cannot_hold_are_refused(corpus, tmp_path):
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    q = corpus["queries"].astype(np.float32) * 1e6
    with pytest.raises(ValueError, match="beyond fp16's range"):
        s.search(q, k=5)
    docs = [d.astype(np.float32) for d in corpus["docs"]]
    docs[5][2, 3] = 1e30
    with pytest.raises(ValueError, match="value 1e\\+30 beyond fp16's range"):
        tilemaxsim.build_index(tmp_path / "big", docs, n_centroids=32, keep_vectors=True)
    assert not (tmp_path / "big").exists() and not list(tmp_path.glob("big.tmp-*"))


def test_pylate_adapter_round_trip(corpus, tmp_path):
    from tilemaxsim.pylate import TileMaxSimIndex

    index = TileMaxSimIndex(index_folder=str(tmp_path), index_name="pl", override=True, device="cpu",
                            n_centroids=32)
    docs, ids = corpus["docs"], corpus["ids"]
    assert index.add_documents(documents_ids=ids[:300], documents_embeddings=docs[:300]) is index
    index.add_documents(documents_ids=ids[300:], documents_embeddings=docs[300:])
    queries = [q for q in corpus["queries"]]  # PyLate passes one [tokens, dim] array per query
    res = index(queries, k=5)
    assert len(res) == len(queries) and all(len(r) == 5 for r in res)
    assert set(res[0][0]) == {"id", "score"}
    top = res[0][0]["id"]
    index.remove_documents([top])
    assert top not in [h["id"] for h in index(queries, k=5)[0]]
    # retrieve.ColBERT(index=...).retrieve(...) returns index(queries_embeddings=..., k=..., subset=...)
    sub = index(queries_embeddings=queries, k=3, subset=["doc1", "doc2", "doc3", "doc4", top, "not-there"])
    assert all({h["id"] for h in r} <= {"doc1", "doc2", "doc3", "doc4"} for r in sub)
    assert all(len(r) == 3 for r in sub)
    again = TileMaxSimIndex(index_folder=str(tmp_path), index_name="pl", device="cpu")  # reopens, no override
    assert again(queries, k=5) == index(queries, k=5)


def test_served_queries_sample_and_measure(corpus):
    """Searcher(record_queries=N) keeps a uniform sample of at most N of the queries it searched
    (float16, zero rows padding shorter ones); estimate_recall measures the recall on it."""
    q = corpus["queries"]
    assert tilemaxsim.Searcher(corpus["index"], "cpu").served_queries().shape[0] == 0  # off by default
    s = tilemaxsim.Searcher(corpus["index"], "cpu", record_queries=5)
    for _ in range(3):
        s.search(q, k=3)
    got = s.served_queries()
    assert got.dtype == np.float16 and got.shape == (5,) + q.shape[1:]
    searched = {r.tobytes() for r in q.astype(np.float16)}
    assert all(r.tobytes() in searched for r in got)
    e = tilemaxsim.estimate_recall(corpus["index"], device="cpu", sample=got)
    assert e["sample"] and e["queries"] == 5
    with pytest.raises(ValueError, match="record_queries"):
        tilemaxsim.Searcher(corpus["index"], "cpu", record_queries=-1)


def test_ctrl_c_stops_a_long_search_and_leaves_the_index_intact(corpus, tmp_path):
    script = (
        "import faulthandler, signal, numpy as np, sys, tilemaxsim\n"
        "faulthandler.register(signal.SIGUSR1, all_threads=True)\n"  # where it hangs, if it does
        # A terminal's Ctrl-C, also when this test runs as a background job of a shell without
        # job control, whose children inherit SIGINT ignored (Python then installs no handler).
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        f"s = tilemaxsim.Searcher({str(corpus['index'])!r}, 'cpu', batch=4)\n"
        f"q = np.load({str(corpus['dir'] / 'queries.npy')!r})\n"
        "print('ready', flush=True)\n"
        "while True:\n"
        "    s.search(np.concatenate([q] * 20), k=10, exhaustive=True)\n")
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ))
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)
    p.send_signal(signal.SIGINT)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGUSR1)  # the Python stacks of every thread, then stop it
        time.sleep(2)
        p.kill()
        _, err = p.communicate()
        pytest.fail(f"still running 60 s after SIGINT; its threads:\n{err}")
    assert p.returncode != 0 and "KeyboardInterrupt" in err, err
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    assert len(s.search(corpus["queries"], k=3)[0]) == len(corpus["queries"])


def test_metadata_filter_and_subset(corpus, tmp_path):
    """Metadata given with the documents (and with an add) filters searches before scoring: the
    hits are exhaustive search's restricted to the allowed documents; a subset does the same by
    external ids, one for every query or one per query; values are data, not SQL."""
    idx = tmp_path / "meta"
    meta = [{"tenant": i % 4, "lang": "en" if i % 2 else "it's; 'x'"} for i in range(len(corpus["docs"]))]
    tilemaxsim.build_index(idx, corpus["docs"], corpus["ids"], keep_vectors=True, n_centroids=32, metadata=meta,
                           metadata_types={"tenant": "integer"})
    info = tilemaxsim.index_info(idx)
    assert info["metadata_rows"] == len(corpus["docs"])
    assert info["metadata_columns"] == {"tenant": "integer", "lang": "text"}
    s = tilemaxsim.Searcher(idx, "cpu")
    q = corpus["queries"]
    every, _ = s.search(q, k=len(corpus["docs"]), exhaustive=True)
    allowed = {corpus["ids"][i] for i in range(len(meta)) if meta[i]["tenant"] == 1}
    for exhaustive in (False, True):
        ids, _ = s.search(q, k=10, exhaustive=exhaustive, filter="tenant = 1")
        for i in range(len(ids)):
            assert ids[i] == [d for d in every[i] if d in allowed][:10]
    quoted, _ = s.search(q, k=10, filter="lang = 'it''s; ''x'''")
    assert all(int(d[3:]) % 2 == 0 for hits in quoted for d in hits) and any(quoted)
    with pytest.raises(ValueError, match="yeer"):
        s.search(q, filter="yeer = 1")
    sub = corpus["ids"][:5]
    ids, _ = s.search(q, k=10, subset=sub)
    for i in range(len(ids)):
        assert ids[i] == [d for d in every[i] if d in sub]
    per = [[corpus["ids"][j]] for j in range(len(q))]  # query j may return document j only
    ids, _ = s.search(q, k=10, subset=per)
    assert ids == per
    with pytest.raises(ValueError, match="subset"):
        s.search(q, subset=per[:3])
    # Added documents bring their metadata; an add without it gives them NULLs.
    tilemaxsim.add_documents(idx, corpus["docs"][:2], ["new0", "new1"], metadata=[{"tenant": 9}, {"tenant": 9}])
    s = tilemaxsim.Searcher(idx, "cpu")
    ids, _ = s.search(q[:1], k=10, filter="tenant = 9")
    assert sorted(ids[0]) == ["new0", "new1"]


def test_one_version_everywhere():
    """tms --version, tilemaxsim.__version__ and the wheel's metadata (pyproject's regex over
    include/tilemaxsim/version.h) agree."""
    import re
    import tomllib
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    with open(root / "python" / "pyproject.toml", "rb") as f:
        rule = tomllib.load(f)["tool"]["scikit-build"]["metadata"]["version"]
    m = re.search(rule["regex"], (root / "python" / rule["input"]).read_text(), re.MULTILINE)
    assert rule["result"].format(**m.groupdict()) == tilemaxsim.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", tilemaxsim.__version__)
    if TMS:
        out = subprocess.run([TMS, "--version"], capture_output=True, text=True, check=True).stdout
        assert out.strip() == f"tms {tilemaxsim.__version__}"


def test_refresh_sees_other_writers_and_searches_as_opened(corpus, tmp_path):
    """Searcher.refresh() sees what another writer added and deleted, and then searches as a
    searcher opened now; searches running in other threads meanwhile finish on theirs."""
    import threading
    idx = tmp_path / "refresh"
    tilemaxsim.build_index(idx, corpus["docs"][:300], corpus["ids"][:300], keep_vectors=True, n_centroids=32,
                           estimate=False)
    s = tilemaxsim.Searcher(idx, "cpu")
    q = corpus["queries"]
    stop, errors = threading.Event(), []

    def keep_searching():
        while not stop.is_set():
            try:
                s.search(q, k=5)
            except Exception as e:  # noqa: BLE001 (reported below)
                errors.append(e)

    t = threading.Thread(target=keep_searching)
    t.start()
    for at in range(300, 340, 10):
        tilemaxsim.add_documents(idx, corpus["docs"][at:at + 10], corpus["ids"][at:at + 10])
        tilemaxsim.delete_documents(idx, [corpus["ids"][at - 299]])
        assert s.info["n_docs"] == at  # not before the refresh
        s.refresh()
    stop.set()
    t.join()
    assert not errors
    fresh = tilemaxsim.Searcher(idx, "cpu")
    assert s.info["n_docs"] == fresh.info["n_docs"] == 340 and s.info["n_deleted"] == fresh.info["n_deleted"] == 4
    for kw in ({}, {"exhaustive": True}, {"k": 40, "nprobe": 2, "ncandidates": 60, "rerank": 20}):
        a, b = s.search(q, **kw), fresh.search(q, **kw)
        assert a[0] == b[0], kw
        assert all(np.allclose(x, y) for x, y in zip(a[1], b[1])), kw
    assert not {"doc1", "doc11", "doc21", "doc31"} & {d for ids in s.search(q, k=40)[0] for d in ids}


def test_peer_names_add_with_metadata_and_counts(corpus, tmp_path):
    """fast-plaid's option names are aliases of ours; Searcher.add takes metadata; delete counts
    what it deleted; Searcher.info agrees with index_info."""
    idx = tmp_path / "names"
    docs = corpus["docs"][:60]
    tilemaxsim.build_index(idx, docs, [f"d{i}" for i in range(60)], nbits=4, codec="residual", n_centroids=8,
                           keep_vectors=True, estimate=False, metadata=[{"g": i % 3} for i in range(60)])
    assert tilemaxsim.index_info(idx)["build_config"] and '"residual_nbits":4' in \
        tilemaxsim.index_info(idx)["build_config"].replace(" ", "")
    with pytest.raises(TypeError, match="'nbits' and 'residual_nbits' name the same option"):
        tilemaxsim.build_index(tmp_path / "x", docs, nbits=2, residual_nbits=4, codec="residual")
    tilemaxsim.build_index(tmp_path / "nb", docs, nbits=2, n_centroids=8, estimate=False)  # as fast-plaid's create
    assert tilemaxsim.index_info(tmp_path / "nb")["codec"] == "residual"
    with pytest.raises(ValueError, match="residual_nbits .nbits. is the residual codec's bits"):
        tilemaxsim.build_index(tmp_path / "y", docs, nbits=2, codec="pq")
    s = tilemaxsim.Searcher(idx, "cpu")
    q = corpus["queries"][:3]
    a, b = s.search(q, top_k=4, n_ivf_probe=4, n_full_scores=64), s.search(q, k=4, nprobe=4, ncandidates=64)
    assert a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1])) and len(a[0][0]) == 4
    with pytest.raises(TypeError, match="'k' and 'top_k' name the same option"):
        s.search(q, k=3, top_k=4)
    with pytest.raises(TypeError, match="unexpected keyword argument 'topk'"):
        s.search(q, topk=4)
    s.add(corpus["docs"][60:62], ["new0", "new1"], metadata=[{"g": 7}, {"g": 7}])
    assert sorted(s.search(q, k=5, filter="g = 7")[0][0]) == ["new0", "new1"]
    assert s.info["metadata_rows"] == tilemaxsim.index_info(idx)["metadata_rows"] == 62
    assert s.delete(["new0", "new1", "new1"]) == 2
    assert s.delete(["new0"]) == 0
    with pytest.raises(KeyError, match="no document 'never'"):
        s.delete(["never"])


@pytest.mark.parametrize("progress,shown", [(None, True), (False, False)])
def test_builds_show_progress_on_a_terminal_by_default(tmp_path, progress, shown):
    import pty

    code = ("import numpy as np, tilemaxsim; rng = np.random.default_rng(0); "
            "docs = [rng.standard_normal((20, 64)).astype(np.float32) for _ in range(40)]; "
            f"tilemaxsim.build_index({str(tmp_path / 'i')!r}, docs, n_centroids=8, codec='residual', "
            f"progress={progress!r})")
    master, slave = pty.openpty()
    p = subprocess.Popen([sys.executable, "-c", code], stderr=slave, stdout=subprocess.DEVNULL)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert p.wait(timeout=120) == 0, out
    assert (b"k-means" in out) == shown, out


def test_filter_limits_are_settable(tmp_path, corpus):
    idx = tmp_path / "f"
    docs = corpus["docs"][:40]
    tilemaxsim.build_index(idx, docs, n_centroids=8, codec="residual", estimate=False,
                           metadata=[{"note": "a" * (1 << 20)} for _ in range(40)])
    q = corpus["queries"][:2]
    s = tilemaxsim.Searcher(idx, "cpu", filter_max_bytes=1 << 20)
    with pytest.raises(ValueError, match="filter: a value longer than 1048576 bytes"):
        s.search(q, k=3, filter="length(note || note) > 0")
    s = tilemaxsim.Searcher(idx, "cpu", filter_time_ms=50)
    with pytest.raises(ValueError, match="filter: ran longer than 50 ms"):
        s.search(q, k=3, filter="note LIKE '%" + "a" * 3000 + "b%'")
    assert len(tilemaxsim.Searcher(idx, "cpu").search(q, k=3, filter="note LIKE 'a%'")[0][0]) == 3
    with pytest.raises(ValueError, match="filter_time_ms must be in"):
        tilemaxsim.Searcher(idx, "cpu", filter_time_ms=0)


class HashEncoder:
    """An encoder of our own with PyLate's call shape: each word a fixed random unit vector, queries
    padded with zeros to 8 tokens, returned as one [n, 8, dim] array (what the text path must accept
    from any model)."""

    def __init__(self, dim=32):
        self.dim = dim

    def _vec(self, word):
        v = np.random.default_rng(abs(hash(word)) % 2**32).standard_normal(self.dim).astype(np.float32)
        return v / np.linalg.norm(v)

    def encode(self, texts, is_query=True):
        out = []
        for t in texts:
            vecs = [self._vec(w) for w in t.split()]
            if is_query:
                vecs = (vecs + [np.zeros(self.dim, np.float32)] * 8)[:8]
            out.append(np.stack(vecs))
        return np.stack(out) if is_query else out


def test_text_in_through_any_encoder(tmp_path):
    words = "red green blue cat dog fish car road train sea sky sun moon star rain snow".split()
    rng = np.random.default_rng(3)
    texts = [" ".join([f"word{i}"] + list(rng.choice(words, size=int(rng.integers(3, 8))))) for i in range(80)]
    model = HashEncoder()
    path = tmp_path / "idx"
    tilemaxsim.build_index(path, texts=texts, ids=[f"t{i}" for i in range(80)], model=model, keep_vectors=True,
                           n_centroids=16, progress=False)
    s = tilemaxsim.Searcher(path, "cpu")
    queries = [texts[5], texts[40]]
    got = s.search_text(queries, model, k=3, exhaustive=True)
    want = s.search(model.encode(queries, is_query=True), k=3, exhaustive=True)
    assert got[0] == want[0] and got[0][0][0] == "t5" and got[0][1][0] == "t40"
    assert s.search_text(texts[5], model, k=1)[0] == [["t5"]]  # a str is one query, not its characters
    s.add(texts=["zebra zebra zebra"], ids=["z"], model=model)
    assert s.search_text("zebra", model, k=1, exhaustive=True)[0] == [["z"]]
    with pytest.raises(TypeError, match="texts= needs model="):
        tilemaxsim.build_index(tmp_path / "x", texts=texts)
    with pytest.raises(TypeError, match="not both"):
        tilemaxsim.build_index(tmp_path / "x", [np.ones((2, 32), np.float32)], texts=texts, model=model)
    with pytest.raises(TypeError, match="encode"):
        s.search_text(["a"], object())
    with pytest.raises(TypeError, match=r"queries\[1\]: expected a str"):
        s.search_text(["a", 7], model)


def test_one_knob_plans_the_search(corpus, tmp_path):
    """target_recall spans the measured curve (below the default target, settings cheaper than the
    defaults); plan() returns what search() runs; a small index is searched exhaustively."""
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    d = tilemaxsim.search_defaults()
    default = s.plan()
    assert default["exhaustive"] is False and default["nprobe"] >= d["nprobe"]  # 400 documents > rerank 256
    low = s.plan(target_recall=0.5)
    assert (low["nprobe"], low["ncandidates"], low["rerank"]) < (d["nprobe"], d["ncandidates"], d["rerank"])
    q = corpus["queries"]
    got = s.search(q, k=5, target_recall=0.5, adaptive=False)  # every query at the plan
    same = s.search(q, k=5, nprobe=low["nprobe"], ncandidates=low["ncandidates"], rerank=low["rerank"],
                    target_recall=0)
    assert got[0] == same[0]
    assert low["deeper_steps"] == 2 and default["deeper_steps"] >= 2  # the queries not settled
    assert s.plan(nprobe=3, target_recall=0) == {"exhaustive": False, "nprobe": 3, "ncandidates": d["ncandidates"],
                                                  "rerank": d["rerank"], "target_recall": 0.0, "deeper_steps": 0}
    small = tmp_path / "small"
    tilemaxsim.build_index(small, corpus["docs"][:100], corpus["ids"][:100], keep_vectors=True, n_centroids=16)
    t = tilemaxsim.Searcher(small, "cpu")
    assert t.plan()["exhaustive"] is True and t.plan(target_recall=0)["exhaustive"] is False
    a, b = t.search(q, k=5), t.search(q, k=5, exhaustive=True)
    assert a[0] == b[0] and all(np.array_equal(x, y) for x, y in zip(a[1], b[1]))


def test_log_level():
    """The level itself is tested through tms (test_cli.py::test_log_levels); here its setter."""
    tilemaxsim.set_log_level("warning")
    try:
        with pytest.raises(ValueError, match="error, warning, info or debug"):
            tilemaxsim.set_log_level("loud")
    finally:
        tilemaxsim.set_log_level("info")


def test_serve_answers_as_the_searcher(corpus):
    """tilemaxsim.serve starts the package's own tms (the wheel's bin/tms, or TMS_BIN) and its
    Client returns what Searcher.search returns."""
    import io
    log = io.StringIO()
    with tilemaxsim.serve(corpus["index"], port=0, device="cpu", log=log) as server:
        ids, scores = server.client().search(corpus["queries"], k=5)
    want_ids, want_scores = tilemaxsim.Searcher(corpus["index"], device="cpu").search(corpus["queries"], k=5)
    assert ids == want_ids
    for a, b in zip(scores, want_scores):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
    assert server.proc.returncode == 0, log.getvalue()


def test_adaptive_search_goes_deeper_where_not_settled(corpus):
    """The default search (adaptive): each query's depth is 0 or 2 steps, never certified; the
    queries that went deeper keep the best of both searches, so recall never falls below the same
    settings searched once (adaptive=False); adaptive=False and target_recall=0 report no depth."""
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    q = corpus["queries"]
    want_ids, _ = s.search(q, k=10, exhaustive=True)
    shallow = dict(k=10, nprobe=2, ncandidates=40, rerank=24)
    ids, _, certified, depth = s.search(q, **shallow, return_certificates=True)
    assert (certified == -1).all() and set(depth.tolist()) <= {0, 2}
    once, _, _, d_once = s.search(q, **shallow, adaptive=False, return_certificates=True)
    assert (d_once == 0).all()
    fixed, _, _, d_fixed = s.search(q, **shallow, target_recall=0, return_certificates=True)
    assert (d_fixed == 0).all() and fixed == once

    def recall(got):
        return np.mean([len(set(g) & set(w)) / len(w) for g, w in zip(got, want_ids)])

    assert recall(ids) >= recall(once)
    for i in np.flatnonzero(depth == 0):
        assert ids[i] == once[i], i  # settled: searched once


def test_certificates_per_query(corpus):
    """search(certify=True, return_certificates=True): per query certified and depth; every
    certified query has the exhaustive top 10; a search that does not certify and exhaustive search
    certify nothing (-1)."""
    s = tilemaxsim.Searcher(corpus["index"], "cpu")
    q = corpus["queries"]
    want_ids, want_scores = s.search(q, k=10, exhaustive=True)
    # Shallow settings (target_recall 0: as given) so that the cuts leave documents out.
    ids, scores, certified, depth = s.search(q, k=10, nprobe=2, ncandidates=40, rerank=12, target_recall=0,
                                             certify=True, return_certificates=True)
    assert certified.dtype == np.int8 and certified.shape == (len(q),) and depth.shape == (len(q),)
    assert set(certified.tolist()) <= {0, 1} and certified.sum() > 0
    for i in np.flatnonzero(certified == 1):
        assert np.allclose(scores[i], want_scores[i], rtol=1e-5), i
    assert all(d in (0, 3) for d in depth.tolist())  # 3 steps deeper without an estimate's say
    assert all(c == 1 or d > 0 for c, d in zip(certified.tolist(), depth.tolist()))
    for kw in ({"adaptive": False}, {"exhaustive": True, "certify": True}):
        _, _, c, d = s.search(q, k=10, return_certificates=True, **kw)
        assert (c == -1).all() and (d == 0).all(), kw
    plain = s.search(q, k=10, nprobe=2, ncandidates=40, rerank=12, target_recall=0, certify=True, certify_steps=0,
                     return_certificates=True)
    assert (plain[3] == 0).all()
    with pytest.raises(ValueError, match="certify_steps must be in"):
        s.search(q, certify_steps=9)
