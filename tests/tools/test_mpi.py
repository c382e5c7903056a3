"""Distributed search under mpirun (oversubscribed on this machine: a correctness check).

`mpirun -np R tms search` over a sharded index writes the same run as one process, exhaustive or
approximate, filtered or not, MaxSim, BM25 or hybrid; a rank that cannot open its shard, or stops answering, ends the job with one message
on rank 0 in bounded time. Skipped when tms was built without MPI or mpirun is missing.
"""
import json
import os
import shutil
import subprocess
import time

import pytest

from cli_util import TMS, tms


MPIRUN = shutil.which("mpirun")


def _has_mpi():
    if not TMS or not MPIRUN:
        return False
    return "--mpi-timeout" in tms("search", "--help").stdout


pytestmark = pytest.mark.skipif(not _has_mpi(), reason="tms without MPI, or no mpirun")
# Open MPI refuses root without these (CI runs as root).
ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")


def mpirun(ranks, *args, pre=(), timeout=120):
    cmd = [MPIRUN, "--oversubscribe", "-np", str(ranks), *pre, TMS, *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("mpi")
    tms("synth", "--out", d, "--docs", 300, "--queries", 24, "--dim", 64, check=True)
    for n in (3, 5):
        tms("index", "--docs", d / "docs.npy", "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt",
            "--out", d / f"idx{n}", "--keep-vectors", "--no-estimate", "--centroids", 32, "--shards", n, "--no-progress", check=True)
    return d


def search_args(d, idx, out, *extra):
    return ("search", "--index", d / idx, "--queries", d / "queries.npy", "--query-ids", d / "query_ids.txt",
            "--out", out, "--k", 10, "--no-progress", "--device", "cpu", "--batch", 7, *extra)


def same_run(dist, one):
    """The ranks' run is one process's (same documents, scores, order): exhaustive, and
    approximate too, since the ranks cut their candidates together (SearchWithCuts)."""
    assert dist.read_text() == one.read_text()


@pytest.mark.parametrize("shards", [3, 5])
@pytest.mark.parametrize("mode", [(), ("--exhaustive",), ("--pruning", "probe", "--ncandidates", 40),
                                  ("--nprobe", 2, "--pruning", "interaction", "--ncandidates", 15, "--rerank", 12),
                                  ("--nprobe", 2, "--ncandidates", 15, "--rerank", 0)])
def test_ranks_write_the_run_of_one_process(corpus, tmp_path, shards, mode):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    tms(*search_args(corpus, f"idx{shards}", one, *mode), check=True)
    p = mpirun(3, *search_args(corpus, f"idx{shards}", dist, *mode))
    assert p.returncode == 0, p.stderr
    assert "3 ranks" in p.stderr and f"{shards} shards" in p.stderr
    assert len(dist.read_text().splitlines()) == len(one.read_text().splitlines()) == 240
    same_run(dist, one)


@pytest.fixture(scope="module")
def meta_index(corpus):
    # The 3-shard index again, with metadata: every rank filters with its own copy of it.
    with open(corpus / "meta.jsonl", "w") as f:
        for i in range(300):
            f.write(json.dumps({"tenant": i % 10, "year": 2000 + i % 7}) + "\n")
    tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--doc-ids",
        corpus / "doc_ids.txt", "--out", corpus / "meta3", "--keep-vectors", "--no-estimate", "--centroids", 32,
        "--shards", 3, "--metadata", corpus / "meta.jsonl", "--no-progress", check=True)
    return "meta3"


FILTERS = {  # SQL, and which documents it allows (document i: tenant i % 10, year 2000 + i % 7)
    "tenant < 5": lambda i: i % 10 < 5,
    "tenant = 3 AND year = 2002": lambda i: i % 10 == 3 and i % 7 == 2,
    "tenant = 99": lambda i: False,
}


@pytest.mark.parametrize("flt", list(FILTERS))
@pytest.mark.parametrize("mode", [(), ("--exhaustive",)])
def test_filtered_ranks_write_the_run_of_one_process(corpus, meta_index, tmp_path, flt, mode):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    tms(*search_args(corpus, meta_index, one, "--filter", flt, *mode), check=True)
    p = mpirun(3, *search_args(corpus, meta_index, dist, "--filter", flt, *mode))
    assert p.returncode == 0, p.stderr
    same_run(dist, one)
    # Only allowed documents (tenant is the document's number mod 10), and every query has hits
    # unless nothing is allowed.
    ids = (corpus / "doc_ids.txt").read_text().split()
    rows = [l.split() for l in dist.read_text().splitlines()]
    allowed = {ids[i] for i in range(300) if FILTERS[flt](i)}
    assert all(r[2] in allowed for r in rows)
    assert (len(rows) == 0) == (len(allowed) == 0)


@pytest.mark.parametrize("ranks", [3, 4])
def test_filtered_probing_ranks_write_the_run_of_one_process(corpus, meta_index, tmp_path, ranks):
    # Every query probes (--direct-max 0, a rerank below the 150 allowed), and a cut to 32
    # candidates leaves about two thirds of them poorly pruned: the ranks agree on which to search
    # again (rank 3 of 4 holds nothing).
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    args = ("--filter", "tenant < 5", "--direct-max", 0, "--ncandidates", 32, "--rerank", 20, "--nprobe", 2)
    tms(*search_args(corpus, meta_index, one, *args), check=True)
    p = mpirun(ranks, *search_args(corpus, meta_index, dist, *args))
    assert p.returncode == 0, p.stderr
    same_run(dist, one)


WORDS = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau "
         "upsilon").split()


@pytest.fixture(scope="module")
def text_index(corpus):
    """The corpus again in 3 shards, with each document's text (short texts of 20 words: many
    BM25 ties, which must break to the lower id across ranks as in one process), with and without
    vectors, and a copy of the one with vectors less some deleted documents."""
    import random
    rng = random.Random(7)
    with open(corpus / "text.jsonl", "w") as f:
        for i in range(300):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12)))
            f.write(json.dumps({"text": text, "tenant": i % 10}) + "\n")
    qt = [" ".join(rng.choice(WORDS) for _ in range(3)) for _ in range(24)]
    (corpus / "qtext.txt").write_text("\n".join(qt) + "\n")
    for name, vec in (("text3", ("--keep-vectors",)), ("text3c", ())):
        tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--doc-ids",
            corpus / "doc_ids.txt", "--out", corpus / name, *vec, "--no-estimate", "--centroids", 32, "--shards", 3,
            "--metadata", corpus / "text.jsonl", "--text-field", "text", "--no-progress", check=True)
    shutil.copytree(corpus / "text3", corpus / "text3d")
    ids = (corpus / "doc_ids.txt").read_text().split()
    (corpus / "gone.txt").write_text("\n".join(ids[i] for i in range(0, 300, 7)) + "\n")
    tms("delete", "--index", corpus / "text3d", "--doc-ids", corpus / "gone.txt", check=True)
    return corpus


@pytest.mark.parametrize("idx", ["text3", "text3c", "text3d"])
@pytest.mark.parametrize("mode", [("--mode", "bm25"), ("--mode", "hybrid"),
                                  ("--mode", "hybrid", "--fusion", "rrf", "--bm25-weight", 0.3),
                                  ("--mode", "hybrid", "--filter", "tenant < 5", "--lexical-candidates", 20,
                                   "--nprobe", 2, "--ncandidates", 30)])
def test_text_modes_under_ranks_write_the_run_of_one_process(text_index, tmp_path, idx, mode):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    args = (*mode, "--query-text", text_index / "qtext.txt")
    tms(*search_args(text_index, idx, one, *args), check=True)
    for ranks in (3, 4):  # rank 3 of 4 holds nothing
        p = mpirun(ranks, *search_args(text_index, idx, dist, *args))
        assert p.returncode == 0, p.stderr
        same_run(dist, one)
    rows = [l.split() for l in one.read_text().splitlines()]
    assert len(rows) > 24 * 5  # the queries' words are the documents': most queries have 10 hits
    if idx == "text3d":
        assert not {r[2] for r in rows} & set((text_index / "gone.txt").read_text().split())


def test_text_modes_under_ranks_refuse_as_one_process(text_index, tmp_path):
    two = tmp_path / "two.txt"
    two.write_text("alpha\nbeta\n")
    for extra, want in ((("--query-text", two), "2 texts for 24 queries"), ((), "needs --query-text"),
                        (("--query-text", text_index / "qtext.txt", "--explain", tmp_path / "e.jsonl"),
                         "--explain is not supported under mpirun")):
        p = mpirun(2, *search_args(text_index, "text3", tmp_path / "r.trec", "--mode", "hybrid", *extra))
        assert p.returncode != 0
        errors = [l for l in p.stderr.splitlines() if "error" in l]
        assert len(errors) == 1 and want in errors[0], p.stderr
        assert not (tmp_path / "r.trec").exists()
    p = mpirun(2, *search_args(text_index, "idx3", tmp_path / "r.trec", "--mode", "bm25", "--query-text",
                               text_index / "qtext.txt"))
    assert p.returncode != 0 and "this index has no text" in p.stderr, p.stderr


def test_more_ranks_than_shards(corpus, tmp_path):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    tms(*search_args(corpus, "idx3", one), check=True)
    p = mpirun(4, *search_args(corpus, "idx3", dist))  # rank 3 holds nothing
    assert p.returncode == 0, p.stderr
    same_run(dist, one)


def test_missing_shard_names_the_shard_and_the_rank(corpus, tmp_path):
    idx = tmp_path / "idx5"
    shutil.copytree(corpus / "idx5", idx)
    shutil.rmtree(idx / "shard-0002")  # rank 1's (shards 2 and 3 of 5, with 3 ranks)
    t0 = time.monotonic()
    p = mpirun(3, "search", "--index", idx, "--queries", corpus / "queries.npy", "--out", tmp_path / "r.trec",
               "--no-progress", "--device", "cpu", "--mpi-timeout", 30)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 30
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1, p.stderr  # one message, from rank 0
    assert "rank 1:" in errors[0] and "shard 2 (" in errors[0] and "missing" in errors[0], errors[0]
    assert not (tmp_path / "r.trec").exists()


def test_bad_queries_on_rank_0_end_every_rank(corpus, tmp_path):
    p = mpirun(2, "search", "--index", corpus / "idx3", "--queries", corpus / "doclens.npy", "--out",
               tmp_path / "r.trec", "--no-progress", "--device", "cpu", "--mpi-timeout", 30)
    assert p.returncode != 0
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and "doclens.npy" in errors[0], p.stderr


def test_a_rank_that_stops_answering_ends_the_job_in_bounded_time(corpus, tmp_path):
    # Rank 2 pauses for a minute while opening; the others give up after --mpi-timeout.
    args = search_args(corpus, "idx3", tmp_path / "r.trec", "--mpi-timeout", 3)
    cmd = [MPIRUN, "--oversubscribe", "-np", "2", TMS, *map(str, args), ":", "-np", "1", "-x",
           "TMS_PAUSE_POINT=read:locked:60", TMS, *map(str, args)]
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 40, p.stderr
    assert "no answer from the other ranks within 3 s" in p.stderr, p.stderr


def build_args(d, out, docs="docs.npy"):
    return ("index", "--docs", d / docs, "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt", "--out", out,
            "--keep-vectors", "--no-estimate", "--centroids", 32, "--shards", 5, "--no-progress")


def test_distributed_build_equals_one_process(corpus, tmp_path):
    one, dist = tmp_path / "one", tmp_path / "dist"
    tms(*build_args(corpus, one), env={"OMP_NUM_THREADS": "1"}, check=True)
    p = mpirun(2, *build_args(corpus, dist))
    assert p.returncode == 0, p.stderr
    assert "2 ranks" in p.stderr
    info = tms("info", "--index", dist, check=True).stdout
    assert "shards\t5" in info and "documents\t300" in info
    for mode in ((), ("--exhaustive",)):
        runs = []
        for idx in (one, dist):
            out = tmp_path / f"{idx.name}{len(mode)}.trec"
            tms("search", "--index", idx, "--queries", corpus / "queries.npy", "--out", out, "--k", 10,
                "--no-progress", "--device", "cpu", *mode, check=True)
            runs.append(out.read_text())
        assert runs[0] == runs[1], mode


def test_a_failing_rank_fails_the_build_everywhere(corpus, tmp_path):
    import numpy as np
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy")
    bad = docs.copy()
    bad[int(lens[:80].sum()) + 2, 5] = np.nan  # in document 80: shard 1, rank 1's
    np.save(tmp_path / "bad.npy", bad)
    out = tmp_path / "out" / "idx"
    out.parent.mkdir()
    t0 = time.monotonic()
    p = mpirun(2, "index", "--docs", tmp_path / "bad.npy", "--doclens", corpus / "doclens.npy", "--out", out,
               "--centroids", 32, "--shards", 5, "--no-progress", "--mpi-timeout", 60)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 60
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and "rank 0: " in errors[0] and "bad.npy" in errors[0], p.stderr
    assert not out.exists()
    assert not list((tmp_path / "out").iterdir())  # the build directory is gone too
    # Only rank 1 cannot read its ids: the message is rank 1's, and nothing is left.
    args = ("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", out,
            "--centroids", 32, "--shards", 5, "--no-progress", "--doc-ids")
    cmd = [MPIRUN, "--oversubscribe", "-np", "1", TMS, *map(str, args), str(corpus / "doc_ids.txt"), ":",
           "-np", "1", TMS, *map(str, args), str(tmp_path / "missing.txt")]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=ENV)
    assert p.returncode != 0
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1 and "rank 1: " in errors[0] and "missing.txt" in errors[0], p.stderr
    assert not list((tmp_path / "out").iterdir())
