"""What a hostile or careless user of `tms` must not be able to do: write over an input or into
an index, store metadata of the wrong type, store values the index cannot hold, make a filter run
without bounds, crash it through the environment, or lose files in an index directory. Every
refusal is a non-zero exit with one line naming the file and the problem, and leaves the index as
it was.
"""
import json
import os
import shutil
import subprocess

import numpy as np
import pytest

from cli_util import TMS, expect_error, tms
pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("safety")
    tms("synth", "--out", d, "--docs", 300, "--queries", 10, "--dim", 64, check=True)
    meta = d / "meta.jsonl"
    meta.write_text("".join(json.dumps({"id": f"doc{i}", "tenant": i % 5}) + "\n" for i in range(300)))
    tms("index", "--docs", d / "docs.npy", "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt",
        "--metadata", meta, "--out", d / "index", "--keep-vectors", "--no-estimate", "--centroids", 32,
        "--device", "cpu", "--no-progress", check=True)
    return d


def search(c, out, *extra, index=None, env=None):
    return tms("search", "--index", index or c / "index", "--queries", c / "queries.npy", "--query-ids",
               c / "query_ids.txt", "--out", out, "--device", "cpu", "--no-progress", *extra, env=env)


def index_state(idx):
    """What `tms info` says of the index, but the bytes on disk (RocksDB's logs grow on any open)."""
    out = tms("info", "--index", idx, check=True).stdout
    return [l for l in out.splitlines() if not l.startswith("shard\t")]


# ---- outputs ---------------------------------------------------------------------------------

def test_outputs_never_replace_inputs_or_index_files(corpus, tmp_path):
    c = corpus
    before = index_state(c / "index")
    queries = (c / "queries.npy").read_bytes()
    expect_error(search(c, c / "index" / "CURRENT"), "--out", "inside the index", "refusing")
    expect_error(search(c, c / "index" / "run.trec"), "inside the index")
    expect_error(search(c, c / "queries.npy"), "is the file of --queries")
    expect_error(search(c, c / "query_ids.txt"), "is the file of --query-ids")
    (tmp_path / "link.npy").symlink_to(c / "queries.npy")
    expect_error(search(c, tmp_path / "link.npy"), "is the file of --queries")
    os.link(c / "queries.npy", tmp_path / "hard.npy")
    expect_error(search(c, tmp_path / "hard.npy"), "is the file of --queries")
    # Side outputs: none may be an input or another output.
    out = tmp_path / "side.trec"
    expect_error(search(c, out, "--certificates", c / "queries.npy"), "--certificates", "is the file of --queries")
    expect_error(search(c, out, "--explain", out), "--explain", "is the file of --out")
    expect_error(search(c, out, "--certificates", tmp_path / "s.tsv", "--record-queries", tmp_path / "s.tsv"),
                 "--record-queries", "is the file of --certificates")
    assert not out.exists()
    run = tmp_path / "first.trec"
    search(c, run).check_returncode()
    expect_error(tms("rerank", "--index", c / "index", "--queries", c / "queries.npy", "--run", run, "--out", run,
                     "--device", "cpu", "--no-progress"), "is the file of --run")
    expect_error(tms("synth", "--out", c / "index" / "corpus"), "inside the index")
    expect_error(tms("synth", "--out", c / "index"), "is an index directory")
    assert (c / "queries.npy").read_bytes() == queries
    assert index_state(c / "index") == before
    assert not (c / "index" / "corpus").exists()


def test_overwrite_refuses_inputs_inside_the_index(corpus, tmp_path):
    c = corpus
    idx = tmp_path / "idx"
    shutil.copytree(c / "index", idx)
    shutil.copy(c / "docs.npy", idx / "docs.npy")
    p = tms("index", "--docs", idx / "docs.npy", "--doclens", c / "doclens.npy", "--out", idx, "--overwrite",
            "--device", "cpu", "--no-progress")
    expect_error(p, "holds the input --docs", "move it out first")
    assert (idx / "docs.npy").read_bytes() == (c / "docs.npy").read_bytes()
    tms("info", "--index", idx, check=True)
    # An index inside another one is refused too (compacting the outer one would carry it).
    expect_error(tms("index", "--docs", c / "docs.npy", "--doclens", c / "doclens.npy", "--out", idx / "inner",
                     "--device", "cpu", "--no-progress"), "inside the index")


def test_run_to_standard_output(corpus, tmp_path):
    c = corpus
    search(c, tmp_path / "run.trec").check_returncode()
    want = (tmp_path / "run.trec").read_text()
    p = search(c, "-")
    assert p.returncode == 0, p.stderr
    assert p.stdout == want and not (tmp_path / "-").exists()
    # /dev/stdout into a pipe: written in place, not a temporary file beside a pipe's name.
    cmd = [TMS, "search", "--index", c / "index", "--queries", c / "queries.npy", "--query-ids", c / "query_ids.txt",
           "--out", "/dev/stdout", "--device", "cpu", "--no-progress"]
    p = subprocess.run(f"{' '.join(map(str, cmd))} | cat", shell=True, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout == want, p.stderr


def test_user_files_in_an_index_survive_compact_and_overwrite(corpus, tmp_path):
    c = corpus
    idx = tmp_path / "idx"
    shutil.copytree(c / "index", idx)
    (idx / "NOTES.txt").write_text("mine")
    (idx / "extra").mkdir()
    (idx / "extra" / "a.txt").write_text("also mine")
    (tmp_path / "gone.txt").write_text("doc1\ndoc2\n")
    tms("delete", "--index", idx, "--doc-ids", tmp_path / "gone.txt", check=True)
    tms("compact", "--index", idx, check=True)
    assert (idx / "NOTES.txt").read_text() == "mine" and (idx / "extra" / "a.txt").read_text() == "also mine"
    tms("index", "--docs", c / "docs.npy", "--doclens", c / "doclens.npy", "--out", idx, "--overwrite",
        "--centroids", 32, "--device", "cpu", "--no-progress", "--no-estimate", check=True)
    assert (idx / "NOTES.txt").read_text() == "mine"
    assert "live_documents\t300" in tms("info", "--index", idx, check=True).stdout


# ---- metadata types ----------------------------------------------------------------------------

def test_metadata_of_the_wrong_type_is_refused_and_nothing_is_committed(corpus, tmp_path):
    c = corpus
    idx = tmp_path / "idx"
    shutil.copytree(c / "index", idx)
    before = index_state(idx)
    docs = np.load(c / "docs.npy")[:20]
    np.save(tmp_path / "d.npy", docs)
    np.save(tmp_path / "l.npy", np.array([10, 10], dtype=np.int64))
    (tmp_path / "ids.txt").write_text("n0\nn1\n")
    meta = tmp_path / "m.jsonl"
    meta.write_text('{"id": "n0", "tenant": 1}\n{"id": "n1", "tenant": "abc"}\n')
    p = tms("add", "--index", idx, "--docs", tmp_path / "d.npy", "--doclens", tmp_path / "l.npy", "--doc-ids",
            tmp_path / "ids.txt", "--metadata", meta)
    expect_error(p, "m.jsonl: line 2", "column 'tenant' is integer in the index", "got a string \"abc\"")
    assert index_state(idx) == before
    # A filter over the integers still keeps every tenant apart.
    run = tmp_path / "r.trec"
    search(c, run, "--filter", "tenant > 1000000", index=idx).check_returncode()
    assert run.read_text() == ""
    # Declared types bind a build the same way.
    expect_error(tms("index", "--docs", tmp_path / "d.npy", "--doclens", tmp_path / "l.npy", "--doc-ids",
                     tmp_path / "ids.txt", "--metadata", meta, "--metadata-types", "tenant:integer",
                     "--codec", "residual", "--out", tmp_path / "i2", "--device", "cpu"),
                 "m.jsonl: line 2", "is integer as declared")
    assert not (tmp_path / "i2").exists()


# ---- values the index cannot hold --------------------------------------------------------------

@pytest.mark.parametrize("value,text", [(1e5, "value 100000 beyond fp16's range"),
                                        (1e30, "value 1e+30 beyond fp16's range"), (np.nan, "NaN")])
@pytest.mark.parametrize("vectors", [True, False])
def test_document_values_fp16_cannot_hold(corpus, tmp_path, value, text, vectors):
    c = corpus
    docs = np.load(c / "docs.npy").astype(np.float32)
    docs[123, 7] = value
    np.save(tmp_path / "big.npy", docs)
    p = tms("index", "--docs", tmp_path / "big.npy", "--doclens", c / "doclens.npy", "--out", tmp_path / "i",
            "--device", "cpu", "--no-progress", *(["--keep-vectors"] if vectors else []))
    expect_error(p, "big.npy", text, "row 123, column 7")
    assert not (tmp_path / "i").exists() and not list(tmp_path.glob("i.tmp-*"))


def test_query_values_fp16_cannot_hold(corpus, tmp_path):
    c = corpus
    q = np.load(c / "queries.npy").astype(np.float32)
    q[3, 2, 5] = 3e38
    np.save(tmp_path / "q.npy", q)
    p = tms("search", "--index", c / "index", "--queries", tmp_path / "q.npy", "--out", tmp_path / "r.trec",
            "--device", "cpu")
    expect_error(p, "q.npy", "value 3e+38 beyond fp16's range", "query 3, token 2, column 5")
    assert not (tmp_path / "r.trec").exists()


# ---- filters with bounds ------------------------------------------------------------------------

def test_filter_time_and_memory_are_bounded(corpus, tmp_path):
    c = corpus
    idx = tmp_path / "idx"
    shutil.copytree(c / "index", idx)
    np.save(tmp_path / "d.npy", np.load(c / "docs.npy")[:10])
    np.save(tmp_path / "l.npy", np.array([10], dtype=np.int64))
    (tmp_path / "ids.txt").write_text("big\n")
    (tmp_path / "m.jsonl").write_text(json.dumps({"id": "big", "note": "a" * (4 << 20)}) + "\n")
    tms("add", "--index", idx, "--docs", tmp_path / "d.npy", "--doclens", tmp_path / "l.npy", "--doc-ids",
        tmp_path / "ids.txt", "--metadata", tmp_path / "m.jsonl", check=True)
    run = tmp_path / "r.trec"
    hostile = "note LIKE '%" + "a" * 3000 + "b%'"
    p = search(c, run, "--filter", hostile, "--filter-time-ms", 300, index=idx)
    expect_error(p, "filter: ran longer than 300 ms", "--filter-time-ms")
    p = search(c, run, "--filter", "length(note || note || note || note || note) > 0", index=idx)
    expect_error(p, "filter: a value longer than 16777216 bytes", "--filter-max-bytes")
    p = search(c, run, "--filter", "length(note || note) > 0", "--filter-max-bytes", 1 << 20, index=idx)
    expect_error(p, "filter: a value longer than 1048576 bytes")
    search(c, run, "--filter", "instr(note, 'ab') = 0 AND note LIKE 'A%'", index=idx).check_returncode()
    assert {l.split()[2] for l in run.read_text().splitlines()} == {"big"}


# ---- environment, paths, messages ------------------------------------------------------------------

def test_thread_counts_from_the_environment_are_clamped(corpus, tmp_path):
    p = search(corpus, tmp_path / "r.trec", env={"OMP_NUM_THREADS": "100000"})
    assert p.returncode == 0, p.stderr


def test_a_path_with_a_newline_gives_one_line(corpus, tmp_path):
    expect_error(search(corpus, tmp_path / "r.trec", index=str(tmp_path / "a\nb")), "a\\nb", "no such index")


def test_a_truncated_metadata_file_is_named_as_damaged(corpus, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(corpus / "index", idx)
    with open(idx / "metadata.sqlite", "r+b") as f:
        f.truncate(3000)
    p = search(corpus, tmp_path / "r.trec", "--filter", "tenant = 1", index=idx)
    expect_error(p, "metadata.sqlite: damaged metadata file (database disk image is malformed)")


def test_adding_no_documents_adds_nothing(corpus, tmp_path):
    idx = tmp_path / "idx"
    shutil.copytree(corpus / "index", idx)
    np.save(tmp_path / "d.npy", np.zeros((0, 64), np.float16))
    np.save(tmp_path / "l.npy", np.zeros((0,), np.int64))
    (tmp_path / "ids.txt").write_text("")
    p = tms("add", "--index", idx, "--docs", tmp_path / "d.npy", "--doclens", tmp_path / "l.npy", "--doc-ids",
            tmp_path / "ids.txt")
    assert p.returncode == 0 and "0 added" in p.stderr, p.stderr
