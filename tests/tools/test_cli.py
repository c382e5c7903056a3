"""End-to-end tests of the `tms` command line: the happy path and every bad input.

Every failure must exit non-zero with exactly one line on stderr naming the file and the
problem, and must never leave anything at the index path that looks like an index.
"""
import functools
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from cli_util import TMS, expect_error, tms
pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")


def save_npy(path, arr):
    np.save(path, arr)
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("corpus")
    tms("synth", "--out", d, "--docs", 300, "--queries", 20, "--dim", 64, check=True)
    return d


@pytest.fixture(scope="module")
def index(corpus):
    out = corpus / "index"
    tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--doc-ids",
        corpus / "doc_ids.txt", "--out", out, "--keep-vectors", "--no-estimate", "--centroids", 64, check=True)
    return out


def test_synth_outputs(corpus):
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy")
    q = np.load(corpus / "queries.npy")
    assert docs.dtype == np.float16 and docs.shape[1] == 64
    assert lens.sum() == docs.shape[0] and len(lens) == 300 and lens.min() >= 1
    assert np.allclose(np.linalg.norm(docs.astype(np.float32), axis=1), 1, atol=1e-2)
    assert q.shape == (20, 32, 64) and q.dtype == np.float16
    assert len((corpus / "doc_ids.txt").read_text().split()) == 300
    assert len((corpus / "query_ids.txt").read_text().split()) == 20
    assert (corpus / "qrels.tsv").read_text().startswith("query-id\tcorpus-id\tscore\n")


def test_end_to_end(corpus, index, tmp_path):
    info = tms("info", "--index", index, check=True).stdout
    assert "documents\t300" in info and "dim\t64" in info and "codec\tpq" in info
    assert "format_version\t5" in info and "vectors\tyes" in info and "live_documents\t300" in info
    # The stored config says what was asked (pq_m 0: the default rule); build_resolved what it became.
    resolved = json.loads([l for l in info.splitlines() if l.startswith("build_resolved\t")][0].split("\t")[1])
    assert resolved == {"codec": "pq", "n_centroids": 64, "pq_m": 8, "pq_nbits": 8, "residual_nbits": 0}
    run = tmp_path / "run.trec"
    tms("search", "--index", index, "--queries", corpus / "queries.npy", "--query-ids", corpus / "query_ids.txt",
        "--out", run, "--k", 10, "--no-progress", check=True)
    lines = run.read_text().splitlines()
    assert len(lines) == 200
    f = lines[0].split()
    assert len(f) == 6 and f[1] == "Q0" and f[3] == "1" and f[0] == "q0" and f[2].startswith("doc")
    ev = tms("eval", "--run", run, "--qrels", corpus / "qrels.tsv", check=True).stdout.splitlines()
    names = [l.split("\t")[0] for l in ev]
    assert names == ["mrr@10", "ndcg@10", "recall@100", "recall@1000"]
    assert all(l.split("\t")[1] == "all" for l in ev)
    mrr = float(ev[0].split("\t")[2])
    assert mrr > 0.2  # the relevant document is findable
    js = json.loads(tms("eval", "--run", run, "--qrels", corpus / "qrels.tsv", "--json", check=True).stdout)
    assert abs(js["mrr@10"] - mrr) < 1e-4
    exh = tmp_path / "exh.trec"
    tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", exh, "--exhaustive", "--k", 5,
        "--device", "cpu", check=True)
    assert len(exh.read_text().splitlines()) == 100


@pytest.mark.parametrize("pruning", ["probe", "interaction"])
def test_pruning_keeps_the_exhaustive_top(corpus, index, tmp_path, pruning):
    # 30 of 300 documents survive pruning; the rerank then finds the exhaustive top 5.
    def top(out, *extra):
        tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", out, "--k", 5,
            "--no-progress", *extra, check=True)
        run = {}
        for line in out.read_text().splitlines():
            q, _, d, *_ = line.split()
            run.setdefault(q, set()).add(d)
        return run
    exact = top(tmp_path / "exact.trec", "--exhaustive")
    got = top(tmp_path / "run.trec", "--pruning", pruning, "--ncandidates", 30)
    recall = np.mean([len(exact[q] & got.get(q, set())) / len(exact[q]) for q in exact])
    assert recall >= 0.9, recall


def test_search_certifies_each_query(corpus, index, tmp_path):
    """--certificates: per query certified and depth; a certified query has the exhaustive top 10;
    the summary counts them; searches without --certify, and exhaustive ones, certify nothing; the file may not
    be another input or output."""
    def run(out, *extra):
        p = tms("search", "--index", index, "--queries", corpus / "queries.npy", "--query-ids",
                corpus / "query_ids.txt", "--out", out, "--k", 10, "--no-progress", "--device", "cpu", *extra,
                check=True)
        return read_trec(out), p.stderr
    exact, _ = run(tmp_path / "exact.trec", "--exhaustive", "--certify", "--certificates", tmp_path / "exh.tsv")
    assert {l.split("\t")[1] for l in (tmp_path / "exh.tsv").read_text().splitlines()[1:]} == {"-"}
    shallow = ("--target-recall", 0, "--nprobe", 1, "--ncandidates", 20, "--rerank", 10)
    got, err = run(tmp_path / "run.trec", *shallow, "--certify", "--certificates", tmp_path / "cert.tsv")
    rows = [l.split("\t") for l in (tmp_path / "cert.tsv").read_text().splitlines()]
    assert rows[0] == ["query", "certified", "depth"] and len(rows) == 21
    certified = [q for q, c, _ in rows[1:] if c == "1"]
    assert 0 < len(certified) and all(c in ("0", "1") for _, c, _ in rows[1:])
    for q in certified:
        assert [d for d, _ in got[q]] == [d for d, _ in exact[q]], q
    assert all(c == "1" or d == "3" for _, c, d in rows[1:])  # not certified: searched again, 3 steps deeper
    again = sum(1 for _, _, d in rows[1:] if d != "0")
    assert f"{len(certified)} of 20 queries certified ({again} searched again, deeper)" in err
    _, err = run(tmp_path / "plain.trec", *shallow, "--certificates", tmp_path / "none.tsv")
    assert "certified" not in err
    assert {l.split("\t")[1] for l in (tmp_path / "none.tsv").read_text().splitlines()[1:]} == {"-"}
    p = tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", tmp_path / "x.trec",
            "--certificates", tmp_path / "x.trec")
    assert p.returncode != 0 and "--certificates" in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_search_goes_deeper_where_not_settled(corpus, index, tmp_path):
    """The default search (adaptive): the summary counts the queries searched again and names the
    steps; --certificates' depth is 0 or 2 for each; --no-adaptive searches every query once."""
    shallow = ("--nprobe", 1, "--ncandidates", 20, "--rerank", 24)

    def run(name, *extra):
        p = tms("search", "--index", index, "--queries", corpus / "queries.npy", "--query-ids",
                corpus / "query_ids.txt", "--out", tmp_path / f"{name}.trec", "--k", 10, "--no-progress", "--device",
                "cpu", *shallow, "--certificates", tmp_path / f"{name}.tsv", *extra, check=True)
        depth = [l.split("\t")[2] for l in (tmp_path / f"{name}.tsv").read_text().splitlines()[1:]]
        return depth, p.stderr
    depth, err = run("adaptive")
    assert set(depth) <= {"0", "2"} and len(depth) == 20
    assert f"{sum(d == '2' for d in depth)} of 20 queries not settled by their codes, searched again deeper" in err
    assert "each query not settled 2 steps deeper" in err
    depth, err = run("once", "--no-adaptive")
    assert set(depth) == {"0"} and "not settled" not in err


def read_trec(path):
    run = {}
    for line in path.read_text().splitlines():
        q, _, d, rank, score, _ = line.split()
        run.setdefault(q, []).append((d, float(score)))
    return run


def test_rerank_rescores_a_first_stage_run(corpus, index, tmp_path):
    q = ("--queries", corpus / "queries.npy", "--query-ids", corpus / "query_ids.txt")
    tms("search", "--index", index, *q, "--out", tmp_path / "exact.trec", "--exhaustive", "--k", 10, check=True)
    # A first stage that finds the right documents in a scrambled order, plus one the index lacks.
    first = tmp_path / "first.trec"
    lines = []
    for qid, hits in read_trec(tmp_path / "exact.trec").items():
        for r, (d, _) in enumerate(reversed(hits)):
            lines.append(f"{qid} Q0 {d} {r + 1} {100 - r} bm25")
        lines.append(f"{qid} Q0 not-a-document 99 0 bm25")
    lines.append("q-unknown Q0 doc1 1 1 bm25")
    first.write_text("\n".join(lines) + "\n")
    p = tms("rerank", "--index", index, *q, "--run", first, "--out", tmp_path / "re.trec", "--no-progress",
            check=True)
    assert "20 candidates are not in the index" in p.stderr and "1 queries of the run" in p.stderr, p.stderr
    exact, re = read_trec(tmp_path / "exact.trec"), read_trec(tmp_path / "re.trec")
    assert exact.keys() == re.keys()
    for qid in exact:
        assert [d for d, _ in re[qid]] == [d for d, _ in exact[qid]], qid
        assert np.allclose([s for _, s in re[qid]], [s for _, s in exact[qid]], rtol=1e-4)
    tms("rerank", "--index", index, *q, "--run", first, "--out", tmp_path / "top3.trec", "--k", 3, check=True)
    assert all(len(v) == 3 for v in read_trec(tmp_path / "top3.trec").values())


def test_rerank_needs_vectors(corpus, tmp_path):
    out = tmp_path / "novec"
    build(corpus, out)
    run = tmp_path / "first.trec"
    run.write_text("q0 Q0 0 1 1 bm25\n")
    p = tms("rerank", "--index", out, "--queries", corpus / "queries.npy", "--query-ids", corpus / "query_ids.txt",
            "--run", run, "--out", tmp_path / "re.trec")
    expect_error(p, "rerank needs stored vectors")


def test_bench_search(corpus, index, tmp_path):
    out = tmp_path / "search.json"
    tms("bench", "search", "--index", index, "--queries", corpus / "queries.npy", "--device", "cpu", "--single", 5,
        "--concurrency", "1,3", "--passes", 1, "--sweep-pruning", "probe,interaction", "--sweep-ncandidates", 30,
        "--json", out, check=True)
    j = json.loads(out.read_text())
    assert j["gpu"] == "cpu" and j["corpus"]["n_docs"] == 300 and j["corpus"]["n_queries"] == 20
    first = j["rows"][0]
    assert first["pruning"] == "probe" and first["ncandidates"] == 1024 and first["index"] == "pq-8+vectors"
    for key in ("batch_qps", "p50_ms", "p99_ms", "concurrent_qps_1", "concurrent_qps_3", "open_s", "host_rss_bytes",
                "index_bytes"):
        assert first[key] > 0, key
    assert first["recall_at_10"] == 1.0  # nothing pruned at 300 documents: the rerank is exact
    swept = {(r["pruning"], r["ncandidates"]) for r in j["rows"][1:]}
    assert swept == {("probe", 30), ("interaction", 30)}
    assert all(0.5 <= r["recall_at_10"] <= 1.0 for r in j["rows"])
    # Hits tied with the truth's 10th within 1e-3 count too: never below the plain recall.
    assert all(r["recall_at_10"] <= r["recall_at_10_within_1e-3"] <= 1.0 for r in j["rows"])


def test_bench_search_peer_row(corpus, index, tmp_path):
    # The peer's runner gets the corpus, our queries and the truth (the exhaustive run, k rows a
    # query), and its row follows ours; a stand-in runner here (fast-plaid needs a GPU).
    runner = tmp_path / "peer.py"
    runner.write_text(
        "import argparse, json\n"
        "ap = argparse.ArgumentParser()\n"
        "for k in ['--corpus', '--queries', '--truth', '--out', '--index', '--nbits', '--k', '--single']:\n"
        "    ap.add_argument(k)\n"
        "a = ap.parse_args()\n"
        "rows = [l.split() for l in open(a.truth)]\n"
        "json.dump({'system': 'stand-in', 'index': 'residual' + a.nbits, 'truth_rows': len(rows),\n"
        "           'queries': a.queries, 'corpus': a.corpus, 'qids': len({r[0] for r in rows})}, open(a.out, 'w'))\n")
    out = tmp_path / "search.json"
    tms("bench", "search", "--index", index, "--queries", corpus / "queries.npy", "--device", "cpu", "--single", 0,
        "--concurrency", 1, "--passes", 1, "--peer", "fast-plaid", "--peer-script", runner, "--peer-nbits", 4,
        "--json", out, check=True)
    rows = json.loads(out.read_text())["rows"]
    assert [r["system"] for r in rows] == ["tms", "stand-in"]
    peer = rows[1]
    assert peer["index"] == "residual4" and peer["qids"] == 20 and peer["truth_rows"] == 200
    assert peer["queries"] == str(corpus / "queries.npy") and peer["corpus"] == str(corpus)
    expect_error(tms("bench", "search", "--index", index, "--queries", corpus / "queries.npy", "--device", "cpu",
                     "--peer", "fast-plaid", "--peer-script", tmp_path / "none.py"), "none.py: not found")
    expect_error(tms("bench", "search", "--index", index, "--queries", corpus / "queries.npy", "--device", "cpu",
                     "--peer", "fast-plaid", "--peer-script", runner, "--peer-corpus", tmp_path), "docs.npy: not found")
    runner.write_text("import sys\nsys.exit(3)\n")  # the runner fails after our rows: the call fails
    p = tms("bench", "search", "--index", index, "--queries", corpus / "queries.npy", "--device", "cpu",
            "--single", 0, "--concurrency", 1, "--passes", 1, "--peer", "fast-plaid", "--peer-script", runner)
    assert p.returncode > 0 and "failed (status" in p.stderr.strip().splitlines()[-1], p.stderr


def test_residual_codec_and_float32(corpus, tmp_path):
    docs32 = save_npy(tmp_path / "d32.npy", np.load(corpus / "docs.npy").astype(np.float32))
    out = tmp_path / "res"
    tms("index", "--docs", docs32, "--doclens", corpus / "doclens.npy", "--out", out, "--codec", "residual",
        "--nbits", 2, "--centroids", 32, check=True)
    info = tms("info", "--index", out, check=True).stdout
    assert "codec\tresidual" in info and "residual_nbits\t2" in info
    assert "code_bytes_per_token\t20.00" in info  # 4 (centroid) + 64 dims * 2 bits / 8
    assert "decoded_tokens\tunit" in info  # synth tokens are unit vectors
    # --nbits alone chooses the residual codec (fast-plaid's nbits); beside --codec pq it is refused
    tms("index", "--docs", docs32, "--doclens", corpus / "doclens.npy", "--out", tmp_path / "nb", "--nbits", 4,
        "--centroids", 32, "--no-estimate", check=True)
    assert "codec\tresidual" in tms("info", "--index", tmp_path / "nb", check=True).stdout
    expect_error(tms("index", "--docs", docs32, "--doclens", corpus / "doclens.npy", "--out", tmp_path / "pq",
                     "--codec", "pq", "--nbits", 2), "--nbits", "--codec pq")
    # Tokens that are not: compressed scores take the decoded tokens as they are.
    docs2 = save_npy(tmp_path / "d2.npy", np.load(docs32) * 2)
    tms("index", "--docs", docs2, "--doclens", corpus / "doclens.npy", "--out", tmp_path / "res2x", "--codec",
        "residual", "--nbits", 2, "--centroids", 32, "--no-estimate", check=True)
    assert "decoded_tokens\tas decoded" in tms("info", "--index", tmp_path / "res2x", check=True).stdout


def test_codec_auto_takes_the_fewest_sub_quantizers_that_reach_the_target(corpus, tmp_path):
    """--codec auto builds PQ of dim/8 sub-quantizers, then twice and four times as many, each
    judged by the build's compressed estimate, and keeps the first whose estimate reaches the
    target beyond its sampling error, else the last."""
    rng = np.random.default_rng(5)
    lens = rng.integers(4, 24, 300)
    noise = rng.standard_normal((int(lens.sum()), 64)).astype(np.float32)
    noise /= np.linalg.norm(noise, axis=1, keepdims=True)  # no topics: codes rank it poorly
    docs = save_npy(tmp_path / "noise.npy", noise.astype(np.float16))
    doclens = save_npy(tmp_path / "lens.npy", lens)

    def curve(index):
        info = tms("info", "--index", index, check=True).stdout
        pq_m = int([l for l in info.splitlines() if l.startswith("pq_m\t")][0].split("\t")[1])
        assert "estimate_truth\tinput (compressed ranking" in info
        return pq_m, info

    p = tms("-v", "index", "--docs", docs, "--doclens", doclens, "--out", tmp_path / "deep", "--codec", "auto",
            "--centroids", 64, "--no-progress", check=True)
    pq_m, info = curve(tmp_path / "deep")
    # k-means once: every later step is built on the first's centroids (its phases name none).
    phases = [l for l in p.stderr.splitlines() if " s total (" in l]
    assert len(phases) >= 2 and "kmeans.assign" in phases[0], p.stderr
    assert not any("kmeans.assign" in l for l in phases[1:]), p.stderr
    built = [int(l.split("PQ-")[1].split(" ")[0]) for l in p.stderr.splitlines() if "--codec auto: PQ-" in l]
    assert built[0] == 8, p.stderr  # 64 / 8
    # Each short of the target led to twice its sub-quantizers, up to 4 x 8; the one kept is the
    # one built last, and its estimate is the one stored.
    assert pq_m in (8, 16, 32) and "short of 0.99; building PQ-16" in p.stderr, p.stderr
    if pq_m == 32 and "PQ-32 reaches" not in p.stderr:
        assert "no PQ up to 32 sub-quantizers reaches recall 0.99; keeping PQ-32" in p.stderr, p.stderr
    sizes = [l.split("codec pq, ")[1].split(" ")[0] for l in p.stderr.splitlines() if "codec pq, " in l]
    assert sizes == [f"{4 + m:.1f}" for m in (8, 16, 32) if m <= pq_m], p.stderr  # 4 bytes: the centroid
    measured = [l.split("default search ")[1].split(" ")[0] for l in p.stderr.splitlines() if "default search " in l]
    assert len(measured) == len(sizes) and f"estimated_recall@10\t{measured[-1]}" in info, (p.stderr, info)
    # A target the default codes reach: the first build is kept.
    p = tms("index", "--docs", docs, "--doclens", doclens, "--out", tmp_path / "easy", "--codec", "auto",
            "--target-recall", 0.2, "--centroids", 64, "--no-progress", check=True)
    assert curve(tmp_path / "easy")[0] == 8 and "--codec auto: PQ-8 reaches recall 0.20" in p.stderr, p.stderr
    assert "building PQ-16" not in p.stderr
    # What it cannot judge, or what would make the choice another's, is refused up front.
    for extra, needle in ((["--keep-vectors"], "--keep-vectors"), (["--pq-m", 16], "--pq-m"),
                          (["--no-estimate"], "--no-estimate"), (["--nbits", 4], "--nbits")):
        expect_error(tms("index", "--docs", docs, "--doclens", doclens, "--out", tmp_path / "no", "--codec", "auto",
                         *extra), "--codec auto", needle)
        assert not (tmp_path / "no").exists()
    expect_error(tms("index", "--docs", docs, "--doclens", doclens, "--out", tmp_path / "no", "--target-recall", 0.9),
                 "--target-recall", "--codec auto")
    expect_error(tms("index", "--docs", docs, "--doclens", doclens, "--out", tmp_path / "no", "--codec", "zstd"),
                 "--codec")


def test_help_for_every_command():
    for cmd in ["synth", "index", "search", "eval", "info", "demo", "bench"]:
        p = tms(cmd, "--help")
        assert p.returncode == 0 and "--help" in p.stdout, cmd


# ---- bad inputs -------------------------------------------------------------------------

def build(corpus, out, docs=None, doclens=None, ids=None, extra=()):
    args = ["index", "--docs", docs or corpus / "docs.npy", "--doclens", doclens or corpus / "doclens.npy",
            "--out", out, "--centroids", 16, *extra]
    if ids:
        args += ["--doc-ids", ids]
    return tms(*args)


def assert_no_index(out):
    assert not Path(out).exists(), f"{out} exists after a failed build"
    assert not [p for p in Path(out).parent.iterdir() if p.name.startswith(Path(out).name + ".tmp")]


def test_truncated_npy(corpus, tmp_path):
    raw = (corpus / "docs.npy").read_bytes()
    bad = tmp_path / "trunc.npy"
    bad.write_bytes(raw[: len(raw) // 2])
    expect_error(build(corpus, tmp_path / "i", docs=bad), "trunc.npy", "truncated")
    assert_no_index(tmp_path / "i")


def test_not_npy(corpus, tmp_path):
    bad = tmp_path / "text.npy"
    bad.write_text("hello world, definitely not numpy\n")
    expect_error(build(corpus, tmp_path / "i", docs=bad), "text.npy", "not a .npy file")
    assert_no_index(tmp_path / "i")


def test_wrong_dtype(corpus, tmp_path):
    bad = save_npy(tmp_path / "int.npy", np.ones((10, 64), dtype=np.int32))
    expect_error(build(corpus, tmp_path / "i", docs=bad), "int.npy", "dtype")
    assert_no_index(tmp_path / "i")


def test_wrong_rank(corpus, tmp_path):
    bad = save_npy(tmp_path / "rank3.npy", np.ones((2, 5, 64), dtype=np.float16))
    expect_error(build(corpus, tmp_path / "i", docs=bad), "rank3.npy", "rank-2")
    assert_no_index(tmp_path / "i")


def test_doclens_sum_mismatch(corpus, tmp_path):
    lens = np.load(corpus / "doclens.npy").copy()
    lens[0] += 1
    bad = save_npy(tmp_path / "lens.npy", lens)
    expect_error(build(corpus, tmp_path / "i", doclens=bad), "lens.npy", "sum to")
    assert_no_index(tmp_path / "i")


def test_negative_length(corpus, tmp_path):
    lens = np.load(corpus / "doclens.npy").astype(np.int64)
    lens[3] = -2
    lens[4] += 2 + lens[3] * 0  # keep the sum plausible; the negative length must be named
    bad = save_npy(tmp_path / "neg.npy", lens)
    expect_error(build(corpus, tmp_path / "i", doclens=bad), "neg.npy", "document 3", "-2")
    assert_no_index(tmp_path / "i")


@pytest.mark.parametrize("value,word", [(np.nan, "NaN"), (np.inf, "Inf")])
def test_non_finite(corpus, tmp_path, value, word):
    docs = np.load(corpus / "docs.npy").copy()
    docs[7, 3] = value
    bad = save_npy(tmp_path / "nf.npy", docs)
    expect_error(build(corpus, tmp_path / "i", docs=bad), "nf.npy", word, "row 7")
    assert_no_index(tmp_path / "i")


def test_doc_id_count_mismatch(corpus, tmp_path):
    ids = tmp_path / "ids.txt"
    ids.write_text("\n".join(f"d{i}" for i in range(299)) + "\n")
    expect_error(build(corpus, tmp_path / "i", ids=ids), "ids.txt", "299 ids for 300")
    assert_no_index(tmp_path / "i")


def test_duplicate_doc_ids(corpus, tmp_path):
    ids = tmp_path / "dup.txt"
    ids.write_text("\n".join(f"d{min(i, 298)}" for i in range(300)) + "\n")
    expect_error(build(corpus, tmp_path / "i", ids=ids), "dup.txt", "duplicate id 'd298'")
    assert_no_index(tmp_path / "i")


def test_existing_index_is_kept(corpus, index, tmp_path):
    before = tms("info", "--index", index, check=True).stdout
    expect_error(build(corpus, index), "already exists", "--overwrite")
    assert tms("info", "--index", index, check=True).stdout == before


def test_overwrite_refuses_non_index(corpus, tmp_path):
    victim = tmp_path / "precious"
    victim.mkdir()
    (victim / "notes.txt").write_text("keep me")
    expect_error(build(corpus, victim, extra=["--overwrite"]), "not an index")
    assert (victim / "notes.txt").read_text() == "keep me"


def test_query_dim_mismatch(index, tmp_path):
    q = save_npy(tmp_path / "q96.npy", np.ones((2, 32, 96), dtype=np.float16))
    expect_error(tms("search", "--index", index, "--queries", q, "--out", tmp_path / "r"), "q96.npy", "dimension 96",
                 "64")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("k", [0, -3])
def test_k_not_positive(corpus, index, tmp_path, k):
    expect_error(tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", tmp_path / "r",
                     "--k", k), "--k")


def test_missing_index(corpus, tmp_path):
    expect_error(tms("search", "--index", tmp_path / "nope", "--queries", corpus / "queries.npy", "--out",
                     tmp_path / "r"), "nope", "no such index")
    expect_error(tms("info", "--index", tmp_path / "nope"), "no such index")


def test_failed_runs_leave_no_files(corpus, index, tmp_path):
    """A run that fails on its input exits normally, so that the libraries remove what they
    registered (LLVM's OpenMP runtime, in the sanitizer build, a file in /dev/shm named by pid)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    runs = [["search", "--index", tmp_path / "nope", "--queries", corpus / "queries.npy", "--out", tmp_path / "r"],
            ["search", "--index", index, "--queries", corpus / "queries.npy", "--out", tmp_path / "r", "--k", 0],
            ["search", "--no-such-flag"]]
    for args in runs:
        p = subprocess.Popen([TMS, *map(str, args)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             env={**os.environ, "TMPDIR": str(scratch)})
        _, err = p.communicate(timeout=300)
        assert p.returncode > 0, err
        shm = [n for n in os.listdir("/dev/shm") if f"_{p.pid}_" in n or f"-{p.pid}-" in n]
        assert shm == [] and list(scratch.iterdir()) == [], (args, shm)


def test_not_our_index(tmp_path):
    d = tmp_path / "somedir"
    d.mkdir()
    (d / "file").write_text("x")
    expect_error(tms("info", "--index", d), "somedir", "not a TileMaxSim index")


def test_exhaustive_without_vectors(corpus, tmp_path):
    out = tmp_path / "novec"
    tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", out, "--centroids", 16,
        check=True)
    expect_error(tms("search", "--index", out, "--queries", corpus / "queries.npy", "--out", tmp_path / "r",
                     "--exhaustive"), "--keep-vectors")


def test_malformed_qrels(corpus, index, tmp_path):
    run = tmp_path / "run.trec"
    run.write_text("q0 Q0 doc1 1 2.5 t\n")
    qrels = tmp_path / "bad.qrels"
    qrels.write_text("q0 0 doc1 1\nq1 0 doc2\n")
    expect_error(tms("eval", "--run", run, "--qrels", qrels), "bad.qrels:2")


def test_malformed_run(tmp_path, corpus):
    run = tmp_path / "bad.trec"
    run.write_text("q0 Q0 doc1 1 2.5 t\nq0 Q0 doc2 2 notanumber t\n")
    expect_error(tms("eval", "--run", run, "--qrels", corpus / "qrels.tsv"), "bad.trec:2")


def test_corrupted_index_is_refused(corpus, tmp_path):
    out = tmp_path / "corrupt"
    tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", out, "--centroids", 16,
        "--keep-vectors", "--no-estimate", check=True)
    blobs = sorted(out.glob("*.blob")) + sorted(out.glob("*.sst"))
    assert blobs
    for b in blobs:
        data = bytearray(b.read_bytes())
        mid = len(data) // 2
        for i in range(mid, min(mid + 64, len(data))):
            data[i] ^= 0x5A
        b.write_bytes(bytes(data))
    p = tms("search", "--index", out, "--queries", corpus / "queries.npy", "--out", tmp_path / "r")
    expect_error(p, "corrupt")
    assert not (tmp_path / "r").exists()


def test_interrupted_build_leaves_no_index(tmp_path):
    big = tmp_path / "big"
    tms("synth", "--out", big, "--docs", 3000, "--queries", 1, "--dim", 128, check=True)
    out = tmp_path / "idx"
    p = subprocess.Popen([TMS, "index", "--docs", big / "docs.npy", "--doclens", big / "doclens.npy", "--out", out],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert not out.exists()
    expect_error(tms("info", "--index", out), "no such index")
    # A leftover temporary directory is not an index either.
    for tmp in tmp_path.glob("idx.tmp-build-*"):
        expect_error(tms("info", "--index", tmp))


# ---- streaming inputs, updates, failures during a build --------------------------------

def test_shard_directory(corpus, tmp_path):
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy")
    shards = tmp_path / "shards"
    shards.mkdir()
    cut = int(lens[:120].sum())
    np.save(shards / "docs_000.npy", docs[:cut])
    np.save(shards / "doclens_000.npy", lens[:120])
    np.save(shards / "docs_001.npy", docs[cut:])
    np.save(shards / "doclens_001.npy", lens[120:])
    out = tmp_path / "sharded"
    tms("index", "--docs", shards, "--out", out, "--centroids", 32, "--doc-ids", corpus / "doc_ids.txt", check=True)
    assert "documents\t300" in tms("info", "--index", out, check=True).stdout
    np.save(shards / "docs_002.npy", np.ones((4, 32), dtype=np.float16))
    np.save(shards / "doclens_002.npy", np.array([4], dtype=np.int32))
    expect_error(tms("index", "--docs", shards, "--out", tmp_path / "bad", "--centroids", 32), "docs_002.npy",
                 "differs from the first shard")
    assert_no_index(tmp_path / "bad")


def test_safetensors_input(corpus, tmp_path):
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy").astype(np.int64)
    header = {"embeddings": {"dtype": "F16", "shape": list(docs.shape), "data_offsets": [0, docs.nbytes]},
              "doclens": {"dtype": "I64", "shape": list(lens.shape),
                          "data_offsets": [docs.nbytes, docs.nbytes + lens.nbytes]}}
    h = json.dumps(header).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    path = tmp_path / "corpus.safetensors"
    path.write_bytes(len(h).to_bytes(8, "little") + h + docs.tobytes() + lens.tobytes())
    out = tmp_path / "st"
    tms("index", "--docs", path, "--out", out, "--centroids", 32, check=True)
    assert "tokens\t%d" % docs.shape[0] in tms("info", "--index", out, check=True).stdout
    path.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}      ")
    expect_error(tms("index", "--docs", path, "--out", tmp_path / "st2"), "corpus.safetensors")


def test_add_delete_compact(corpus, tmp_path):
    out = tmp_path / "upd"
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy")
    ids = (corpus / "doc_ids.txt").read_text().split()
    cut = int(lens[:250].sum())
    np.save(tmp_path / "a_docs.npy", docs[:cut])
    np.save(tmp_path / "a_lens.npy", lens[:250])
    (tmp_path / "a_ids.txt").write_text("\n".join(ids[:250]) + "\n")
    np.save(tmp_path / "b_docs.npy", docs[cut:])
    np.save(tmp_path / "b_lens.npy", lens[250:])
    (tmp_path / "b_ids.txt").write_text("\n".join(ids[250:]) + "\n")
    tms("index", "--docs", tmp_path / "a_docs.npy", "--doclens", tmp_path / "a_lens.npy", "--doc-ids",
        tmp_path / "a_ids.txt", "--out", out, "--centroids", 32, "--keep-vectors", "--no-estimate", check=True)
    tms("add", "--index", out, "--docs", tmp_path / "b_docs.npy", "--doclens", tmp_path / "b_lens.npy", "--doc-ids",
        tmp_path / "b_ids.txt", check=True)
    expect_error(tms("add", "--index", out, "--docs", tmp_path / "b_docs.npy", "--doclens", tmp_path / "b_lens.npy",
                     "--doc-ids", tmp_path / "b_ids.txt"), "b_ids.txt", "already in the index", "--replace")
    (tmp_path / "del.txt").write_text("\n".join(ids[:30]) + "\n")
    tms("delete", "--index", out, "--doc-ids", tmp_path / "del.txt", check=True)
    info = tms("info", "--index", out, check=True).stdout
    assert "documents\t300" in info and "deleted\t30" in info and "live_documents\t270" in info
    # Deleting them again is reported, not an error; an id the index never held still is.
    p = tms("delete", "--index", out, "--doc-ids", tmp_path / "del.txt", check=True)
    assert "0 deleted, 30 already deleted (skipped)" in p.stderr and "added" not in p.stderr
    (tmp_path / "del2.txt").write_text(ids[0] + "\nnever-added\n")
    expect_error(tms("delete", "--index", out, "--doc-ids", tmp_path / "del2.txt"), "del2.txt", "line 2",
                 "no document 'never-added'")
    run = tmp_path / "r.trec"
    tms("search", "--index", out, "--queries", corpus / "queries.npy", "--out", run, "--k", 300, "--exhaustive",
        check=True)
    returned = {l.split()[2] for l in run.read_text().splitlines()}
    assert not returned & set(ids[:30]) and len(returned) == 270
    tms("compact", "--index", out, check=True)
    info = tms("info", "--index", out, check=True).stdout
    assert "documents\t270" in info and "deleted\t0" in info
    q = np.ones((1, 32, 96), dtype=np.float16)
    np.save(tmp_path / "wrongdim.npy", np.ones((10, 96), dtype=np.float16))
    np.save(tmp_path / "wl.npy", np.array([10], dtype=np.int32))
    (tmp_path / "wid.txt").write_text("new\n")
    expect_error(tms("add", "--index", out, "--docs", tmp_path / "wrongdim.npy", "--doclens", tmp_path / "wl.npy",
                     "--doc-ids", tmp_path / "wid.txt"), "wrongdim.npy", "dimension 96")


def _limit_file_size():
    import resource
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))


def test_disk_full_during_build(corpus, tmp_path):
    # Writes beyond 256 KiB fail (EFBIG), as on a full disk: the build must fail cleanly.
    out = tmp_path / "full"
    p = subprocess.run([TMS, "index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", out,
                        "--centroids", "16", "--keep-vectors", "--no-estimate"], capture_output=True, text=True,
                       preexec_fn=_limit_file_size, timeout=600)
    expect_error(p, "full")
    assert_no_index(out)


@functools.lru_cache(maxsize=None)
def _sanitized():
    """A build under AddressSanitizer maps terabytes of shadow memory as it starts: no
    address-space limit can apply to it."""
    return b"AddressSanitizer" in Path(TMS).read_bytes()


def _limit_address_space(gib):
    def limit():
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (int(gib * 2**30), int(gib * 2**30)))
    return limit


def _live_documents(index):
    info = tms("info", "--index", index, check=True).stdout
    return int(next(l.split("\t")[1] for l in info.splitlines() if l.startswith("live_documents\t")))


# ulimit -v from where the libraries barely load to where the work fits: at each limit a search,
# a build or an addition runs, or ends in one error line (RocksDB's, OpenMP's, OpenBLAS's and our
# own threads and buffers fail at different limits), never in an abort or a hang; a failed build
# leaves nothing behind, a failed addition the index as it was.
@pytest.mark.parametrize("gib", [0.8, 0.9, 1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.7, 2.0, 2.5])
@pytest.mark.parametrize("command", ["search", "index", "add"])
def test_under_an_address_space_limit_work_ends_cleanly(corpus, index, tmp_path, command, gib):
    if _sanitized():
        pytest.skip("AddressSanitizer's shadow memory does not fit an address-space limit")
    out = tmp_path / ("run.trec" if command == "search" else "idx")
    if command == "search":
        args = ["search", "--index", index, "--queries", corpus / "queries.npy", "--vectors", "host", "--out", out,
                "--device", "cpu"]
    elif command == "index":
        args = ["index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--keep-vectors",
                "--no-estimate", "--centroids", "64", "--out", out, "--device", "cpu"]
    else:
        shutil.copytree(index, out)
        ids = tmp_path / "new_ids.txt"
        ids.write_text("".join(f"new{i}\n" for i in range(10)))
        lens = np.load(corpus / "doclens.npy")[:10]
        docs = save_npy(tmp_path / "new_docs.npy", np.load(corpus / "docs.npy")[: int(lens.sum())])
        args = ["add", "--index", out, "--docs", docs, "--doclens", save_npy(tmp_path / "new_lens.npy", lens),
                "--doc-ids", ids]
    p = subprocess.run([TMS, *args], capture_output=True, text=True, preexec_fn=_limit_address_space(gib),
                       timeout=120)
    if p.returncode == 0:
        if command == "search":
            assert len(out.read_text().splitlines()) == 20 * 10
        else:
            assert _live_documents(out) == 300 + (10 if command == "add" else 0)
        return
    expect_error(p)  # ours, libgomp's "Thread creation failed", or the dynamic loader's
    if command == "index":
        assert_no_index(out)
    if command == "add":
        assert _live_documents(out) == 300


def test_bench_index_small(tmp_path):
    out = tmp_path / "bi.json"
    p = subprocess.run([TMS, "bench", "index", "--tokens", "40000", "--centroids", "64", "--codecs", "res2",
                        "--device", "cpu", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(out.read_text())
    (case,) = r["cases"]
    assert case["case"].startswith("build_res2_d128_t") and case["tokens"] > 30000
    assert case["tokens_per_s"] > 0 and case["index_bytes_per_token"] > 36 and case["load_gbps"] > 0


def test_bfloat16_npy_equals_float32_of_the_same_values(corpus, tmp_path):
    """ml_dtypes' bfloat16, which numpy saves as descr <V2: documents and queries in bf16 index and
    search exactly as float32 arrays holding the same values."""
    def bf16_bits(a):
        return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)

    docs, queries = np.load(corpus / "docs.npy"), np.load(corpus / "queries.npy")
    runs = {}
    for kind in ("bf16", "f32"):
        d, q = bf16_bits(docs), bf16_bits(queries)
        if kind == "bf16":
            d, q = d.view(np.dtype("V2")), q.view(np.dtype("V2"))
        else:
            d, q = (d.astype(np.uint32) << 16).view(np.float32), (q.astype(np.uint32) << 16).view(np.float32)
        np.save(tmp_path / f"d_{kind}.npy", d)
        np.save(tmp_path / f"q_{kind}.npy", q)
        assert kind == "f32" or b"V2" in (tmp_path / f"d_{kind}.npy").read_bytes()[:64]
        out = tmp_path / f"idx_{kind}"
        tms("index", "--docs", tmp_path / f"d_{kind}.npy", "--doclens", corpus / "doclens.npy", "--out", out,
            "--keep-vectors", "--no-estimate", "--centroids", 64, "--device", "cpu", check=True)
        for mode in ("default", "exhaustive"):
            run = tmp_path / f"{kind}_{mode}.trec"
            tms("search", "--index", out, "--queries", tmp_path / f"q_{kind}.npy", "--out", run, "--k", 10,
                "--device", "cpu", *(["--exhaustive"] if mode == "exhaustive" else []), check=True)
            runs[kind, mode] = run.read_text()
    assert runs["bf16", "exhaustive"] == runs["f32", "exhaustive"]
    assert runs["bf16", "default"] == runs["f32", "default"]
    # The same documents as a safetensors BF16 tensor.
    d, l = bf16_bits(docs).tobytes(), np.load(corpus / "doclens.npy").astype(np.int64).tobytes()
    h = json.dumps({"embeddings": {"dtype": "BF16", "shape": list(docs.shape), "data_offsets": [0, len(d)]},
                    "doclens": {"dtype": "I64", "shape": [len(l) // 8], "data_offsets": [len(d), len(d) + len(l)]}})
    h = h.encode() + b" " * (-len(h) % 8)
    st = tmp_path / "bf16.safetensors"
    st.write_bytes(len(h).to_bytes(8, "little") + h + d + l)
    tms("index", "--docs", st, "--out", tmp_path / "idx_st", "--keep-vectors", "--no-estimate", "--centroids", 64, "--device", "cpu",
        check=True)
    run = tmp_path / "st.trec"
    tms("search", "--index", tmp_path / "idx_st", "--queries", tmp_path / "q_f32.npy", "--out", run, "--k", 10,
        "--device", "cpu", "--exhaustive", check=True)
    assert run.read_text() == runs["f32", "exhaustive"]
    bad = bf16_bits(docs)
    bad[3, 5] = 0x7FC0  # NaN
    np.save(tmp_path / "nan.npy", bad.view(np.dtype("V2")))
    expect_error(tms("index", "--docs", tmp_path / "nan.npy", "--doclens", corpus / "doclens.npy", "--out",
                     tmp_path / "nan_idx", "--device", "cpu"), "nan.npy", "NaN", "row 3")


@pytest.mark.parametrize("args,hint", [
    (("serach",), "(did you mean search?)"),
    (("search", "--index", "x", "--queries", "q", "--out", "o", "--nprob", "4"), "(did you mean --nprobe?)"),
    (("index", "--docs", "x", "--out", "y", "--centroid", "4"), "(did you mean --centroids?)"),
    (("bench", "serch"), "(did you mean search?)"),
])
def test_mistyped_names_get_a_suggestion(args, hint):
    expect_error(tms(*args), hint)


def test_python_names_are_cli_aliases_and_phases_need_verbose(corpus, tmp_path):
    p = tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", tmp_path / "i",
            "--codec", "residual", "--residual-nbits", 4, "--n-centroids", 32, "--no-estimate", "--device", "cpu",
            "--no-progress", check=True)
    assert "kmeans" not in p.stderr and "tokens/s)" in p.stderr
    info = tms("info", "--index", tmp_path / "i", check=True).stdout
    assert "residual_nbits\t4" in info and "centroids\t32" in info
    p = tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", tmp_path / "j",
            "--centroids", 32, "--no-estimate", "--device", "cpu", "--no-progress", "--verbose", check=True)
    assert "kmeans " in p.stderr and "encode+write " in p.stderr


def test_log_levels(corpus, index, tmp_path):
    """--log-level (or -q / -v, before or after the command, or TMS_LOG_LEVEL): info prints the
    summaries, warning and error nothing on success, debug also the build's phases."""
    build = ["index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--centroids", 32,
             "--no-estimate", "--overwrite", "--out", tmp_path / "i"]
    info = tms(*build, check=True).stderr
    assert "tms index: 300 documents" in info and "kmeans" not in info
    assert "kmeans" in tms(*build, "-v", check=True).stderr  # the phases, at debug
    assert "kmeans" in tms("--log-level", "debug", *build, check=True).stderr
    assert tms("-q", *build, check=True).stderr == ""
    assert tms(*build, "--log-level", "error", check=True).stderr == ""
    assert tms(*build, env={"TMS_LOG_LEVEL": "warning"}, check=True).stderr == ""
    search = ["search", "--index", index, "--queries", corpus / "queries.npy", "--out", tmp_path / "run"]
    assert "queries/s" in tms(*search, check=True).stderr
    assert tms("-q", *search, check=True).stderr == ""
    expect_error(tms("--log-level", "loud", *search), "--log-level")
    expect_error(tms("-q", "-v", *search), "one of --log-level, --quiet and --verbose")
