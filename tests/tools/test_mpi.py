"""Distributed search under mpirun (oversubscribed on this machine: a correctness check).

`mpirun -np R tms search` over a sharded index writes the same run as one process; a rank that
cannot open its shard, or stops answering, ends the job with one message on rank 0 in bounded
time. Skipped when tms was built without MPI or mpirun is missing.
"""
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
            "--out", d / f"idx{n}", "--keep-vectors", "--centroids", 32, "--shards", n, "--no-progress", check=True)
    return d


def search_args(d, idx, out, *extra):
    return ("search", "--index", d / idx, "--queries", d / "queries.npy", "--query-ids", d / "query_ids.txt",
            "--out", out, "--k", 10, "--no-progress", "--device", "cpu", "--batch", 7, *extra)


@pytest.mark.parametrize("shards", [3, 5])
@pytest.mark.parametrize("mode", [(), ("--exhaustive",), ("--pruning", "probe", "--ncandidates", 40)])
def test_ranks_write_the_run_of_one_process(corpus, tmp_path, shards, mode):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    tms(*search_args(corpus, f"idx{shards}", one, *mode), check=True)
    p = mpirun(3, *search_args(corpus, f"idx{shards}", dist, *mode))
    assert p.returncode == 0, p.stderr
    assert "3 ranks" in p.stderr and f"{shards} shards" in p.stderr
    assert dist.read_text() == one.read_text()  # same documents, same scores, same order
    assert len(one.read_text().splitlines()) == 240


def test_more_ranks_than_shards(corpus, tmp_path):
    one, dist = tmp_path / "one.trec", tmp_path / "mpi.trec"
    tms(*search_args(corpus, "idx3", one), check=True)
    p = mpirun(4, *search_args(corpus, "idx3", dist))  # rank 3 holds nothing
    assert p.returncode == 0, p.stderr
    assert dist.read_text() == one.read_text()


def test_missing_shard_names_the_shard_and_the_rank(corpus, tmp_path):
    idx = tmp_path / "idx5"
    shutil.copytree(corpus / "idx5", idx)
    shutil.rmtree(idx / "shard-0001")  # rank 1's (shards 1 and 4 of 5, with 3 ranks)
    t0 = time.monotonic()
    p = mpirun(3, "search", "--index", idx, "--queries", corpus / "queries.npy", "--out", tmp_path / "r.trec",
               "--no-progress", "--device", "cpu", "--mpi-timeout", 30)
    assert p.returncode != 0
    assert time.monotonic() - t0 < 30
    errors = [l for l in p.stderr.splitlines() if "error" in l]
    assert len(errors) == 1, p.stderr  # one message, from rank 0
    assert "rank 1:" in errors[0] and "shard 1 (" in errors[0] and "missing" in errors[0], errors[0]
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
