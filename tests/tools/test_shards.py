"""Sharded indexes through the CLI: sharded = unsharded (on one device, approximate runs too),
placement does not matter, updates of a sharded index equal a fresh build, damaged shards and
manifests fail in one line.

On a machine with GPUs (TMS_TEST_GPUS=N set, N GPUs visible), the placement tests also search
on GPU 0 and, with two or more, across GPUs 0 and 1.
"""
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from cli_util import TMS, expect_error, tms

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools" / "experiments"))
from shards_report import read_run, recall  # noqa: E402

pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
N_GPUS = int(os.environ.get("TMS_TEST_GPUS", "0"))
DIM = 64


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("shards")
    tms("synth", "--out", d, "--docs", 400, "--queries", 24, "--dim", DIM, "--seed", 5, check=True)
    return d


def build(corpus, out, shards, *extra, docs=None, lens=None, ids=None):
    tms("index", "--docs", docs or corpus / "docs.npy", "--doclens", lens or corpus / "doclens.npy", "--doc-ids",
        ids or corpus / "doc_ids.txt", "--out", out, "--keep-vectors", "--no-estimate", "--centroids", 64, "--shards", shards,
        "--no-progress", *extra, check=True)
    return out


def search(index, corpus, out, *extra):
    tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", out, "--k", 10, "--no-progress",
        *extra, check=True)
    return read_run(out)


def same_run(a, b, tol=0.0):
    assert a.keys() == b.keys()
    for q in a:
        assert [d for d, _ in a[q]] == [d for d, _ in b[q]], q
        for (_, x), (_, y) in zip(a[q], b[q]):
            assert abs(x - y) <= tol * max(1.0, abs(x)), (q, x, y)


@pytest.fixture(scope="module")
def built(corpus):
    return {n: build(corpus, corpus / f"idx{n}", n) for n in (1, 3)}


def test_info_lists_shards(built):
    info = tms("info", "--index", built[3], check=True).stdout
    assert "format_version\t4" in info and "shards\t3" in info and "documents\t400" in info
    rows = [l.split("\t") for l in info.splitlines() if l.startswith("shard\t")]
    assert [r[2] for r in rows] == ["shard-0000", "shard-0001", "shard-0002"]
    docs = [int(r[4].split()[1]) for r in rows]
    firsts = [int(r[3].split()[1]) for r in rows]
    assert sum(docs) == 400 and firsts == [0, docs[0], docs[0] + docs[1]]
    one = tms("info", "--index", built[1], check=True).stdout
    assert "format_version\t5" in one and "shards\t1" in one


def test_sharded_equals_unsharded(built, corpus, tmp_path):
    ex1 = search(built[1], corpus, tmp_path / "ex1", "--exhaustive", "--device", "cpu")
    ex3 = search(built[3], corpus, tmp_path / "ex3", "--exhaustive", "--device", "cpu")
    same_run(ex1, ex3)
    # On one device the shards are searched as one: the unsharded index's run, pruning included.
    for pruning in ("probe", "interaction"):
        args = ("--device", "cpu", "--nprobe", 2, "--ncandidates", 40, "--rerank", 20, "--pruning", pruning)
        d1 = search(built[1], corpus, tmp_path / "d1", *args)
        d3 = search(built[3], corpus, tmp_path / "d3", *args)
        same_run(d1, d3)
        assert recall(d3, ex1) > 0.5


@pytest.mark.skipif(N_GPUS < 1, reason="needs a GPU (TMS_TEST_GPUS)")
@pytest.mark.parametrize("mode", ["--exhaustive", "--rerank=256"])
def test_placement_does_not_matter(built, corpus, tmp_path, mode):
    cpu = search(built[3], corpus, tmp_path / "cpu", mode, "--devices", "cpu")
    one = search(built[3], corpus, tmp_path / "gpu0", mode, "--devices", "0")
    same_run(cpu, one, tol=1e-3)
    if N_GPUS >= 2:
        # The GPUs cut their candidates together: one GPU's run.
        two = search(built[3], corpus, tmp_path / "gpu01", mode, "--devices", "0,1")
        same_run(one, two)
    unsharded = search(built[1], corpus, tmp_path / "gpu0-1", mode, "--devices", "0")
    same_run(unsharded, one, tol=1e-3)


def test_devices_errors(built, corpus, tmp_path):
    q = corpus / "queries.npy"
    p = tms("search", "--index", built[3], "--queries", q, "--out", tmp_path / "r", "--devices", "0,0")
    expect_error(p, "GPU 0 is listed twice")
    p = tms("search", "--index", built[3], "--queries", q, "--out", tmp_path / "r", "--devices", "x")
    expect_error(p, "devices 'x'")
    p = tms("search", "--index", built[3], "--queries", q, "--out", tmp_path / "r", "--devices", str(max(N_GPUS, 1) + 6))
    expect_error(p, "GPU" if N_GPUS else "CUDA")


def split_corpus(corpus, d):
    """The corpus as (vectors, lens, ids) per document."""
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy")
    ids = (corpus / "doc_ids.txt").read_text().split()
    offs = np.concatenate([[0], np.cumsum(lens)])
    return [(docs[offs[i]:offs[i + 1]], int(lens[i]), ids[i]) for i in range(len(ids))]


def write_docs(d, name, docs):
    np.save(d / f"{name}_docs.npy", np.concatenate([v for v, _, _ in docs]))
    np.save(d / f"{name}_lens.npy", np.array([n for _, n, _ in docs], dtype=np.int64))
    (d / f"{name}_ids.txt").write_text("".join(i + "\n" for _, _, i in docs))
    return d / f"{name}_docs.npy", d / f"{name}_lens.npy", d / f"{name}_ids.txt"


def test_updates_equal_fresh_build(corpus, tmp_path):
    docs = split_corpus(corpus, tmp_path)
    first, rest = docs[:300], docs[300:]
    f = write_docs(tmp_path, "first", first)
    idx = build(corpus, tmp_path / "upd", 3, docs=f[0], lens=f[1], ids=f[2])
    a = write_docs(tmp_path, "rest", rest)
    tms("add", "--index", idx, "--docs", a[0], "--doclens", a[1], "--doc-ids", a[2], check=True)
    # Deletions in the first, middle and last shards, and in the documents just added.
    gone = [first[3][2], first[150][2], first[290][2], rest[7][2]]
    (tmp_path / "gone.txt").write_text("\n".join(gone) + "\n")
    tms("delete", "--index", idx, "--doc-ids", tmp_path / "gone.txt", check=True)
    # Replacements: new vectors for documents of shard 0 and shard 1 (a rotated copy of
    # another document), written into the last shard.
    repl = [(docs[i + 1][0], docs[i + 1][1], docs[i][2]) for i in (10, 120)]
    r = write_docs(tmp_path, "repl", repl)
    tms("add", "--index", idx, "--docs", r[0], "--doclens", r[1], "--doc-ids", r[2], "--replace", check=True)
    info = tms("info", "--index", idx, check=True).stdout
    assert "shards\t3" in info and "live_documents\t396" in info and "deleted\t6" in info
    # The final set, built fresh.
    final = {i: (v, n, i) for v, n, i in docs if i not in gone}
    for v, n, i in repl:
        final[i] = (v, n, i)
    fr = write_docs(tmp_path, "final", list(final.values()))
    fresh = build(corpus, tmp_path / "fresh", 2, docs=fr[0], lens=fr[1], ids=fr[2])
    want = search(fresh, corpus, tmp_path / "want", "--exhaustive", "--device", "cpu")
    got = search(idx, corpus, tmp_path / "got", "--exhaustive", "--device", "cpu")
    same_run(got, want)
    assert not any(d in gone for q in got for d, _ in got[q])
    tms("compact", "--index", idx, check=True)
    info = tms("info", "--index", idx, check=True).stdout
    assert "shards\t3" in info and "documents\t396" in info and "deleted\t0" in info
    same_run(search(idx, corpus, tmp_path / "compacted", "--exhaustive", "--device", "cpu"), want)
    # Adding an id that a shard other than the last holds is refused without --replace.
    p = tms("add", "--index", idx, "--docs", r[0], "--doclens", r[1], "--doc-ids", r[2])
    expect_error(p, "already in the index")


def test_crash_during_sharded_update_keeps_old_state(corpus, tmp_path):
    docs = split_corpus(corpus, tmp_path)
    f = write_docs(tmp_path, "first", docs[:300])
    idx = build(corpus, tmp_path / "crash", 3, docs=f[0], lens=f[1], ids=f[2])
    before = search(idx, corpus, tmp_path / "before", "--exhaustive", "--device", "cpu")
    a = write_docs(tmp_path, "rest", docs[300:])
    (tmp_path / "gone.txt").write_text(docs[5][2] + "\n")
    for point in ("update:chunk", "update:commit", "update:written"):
        p = tms("add", "--index", idx, "--docs", a[0], "--doclens", a[1], "--doc-ids", a[2],
                env={"TMS_CRASH_POINT": point})
        assert p.returncode < 0, (point, p.stderr)
        if point != "update:chunk":  # a deletion writes no chunk
            p = tms("delete", "--index", idx, "--doc-ids", tmp_path / "gone.txt", env={"TMS_CRASH_POINT": point})
            assert p.returncode < 0, (point, p.stderr)
        same_run(search(idx, corpus, tmp_path / "after", "--exhaustive", "--device", "cpu"), before)


@pytest.mark.parametrize("point", ["build:created", "build:shard", "build:manifest", "build:complete"])
def test_crash_during_sharded_build_leaves_no_index(corpus, tmp_path, point):
    out = tmp_path / "b"
    p = tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", out,
            "--centroids", 64, "--shards", 3, "--no-progress", env={"TMS_CRASH_POINT": point})
    assert p.returncode < 0, p.stderr
    assert not out.exists()
    build(corpus, out, 3)  # the leftover of the dead build is cleaned, the build succeeds
    assert [x.name for x in tmp_path.iterdir()] == ["b"]


@pytest.fixture()
def damaged(built, tmp_path):
    import shutil
    out = tmp_path / "dmg"
    shutil.copytree(built[3], out)
    return out


def test_missing_shard(damaged, corpus, tmp_path):
    import shutil
    shutil.rmtree(damaged / "shard-0001")
    p = tms("search", "--index", damaged, "--queries", corpus / "queries.npy", "--out", tmp_path / "r")
    expect_error(p, "shard 1", "shard-0001", "missing")
    expect_error(tms("info", "--index", damaged), "shard-0001")


def test_manifest_naming_more_shards(damaged):
    m = json.loads((damaged / "SHARDS").read_text())
    m["shards"].append("shard-0003")
    (damaged / "SHARDS").write_text(json.dumps(m))
    expect_error(tms("info", "--index", damaged), "shard-0003", "missing")


@pytest.mark.parametrize("text,needle", [
    ("{not json", "bad shard manifest"),
    ('{"format_version": 4, "shards": ["../elsewhere"], "model_crc": 1}', "expected shard-0000"),
    ('{"format_version": 9, "shards": ["shard-0000"], "model_crc": 1}', "format version 9"),
    ('{"format_version": 4, "shards": [], "model_crc": 1}', "bad shard list"),
])
def test_bad_manifest(damaged, text, needle):
    (damaged / "SHARDS").write_text(text)
    expect_error(tms("info", "--index", damaged), "SHARDS", needle)


def test_shards_swapped_or_foreign(damaged, built, corpus, tmp_path):
    import shutil
    # Two shards swapped: their documents no longer follow each other.
    shutil.move(damaged / "shard-0000", damaged / "tmp")
    shutil.move(damaged / "shard-0001", damaged / "shard-0000")
    shutil.move(damaged / "tmp", damaged / "shard-0001")
    expect_error(tms("info", "--index", damaged), "documents start at")
    # A shard of another index (another model) in place of one.
    (tmp_path / "seed.json").write_text('{"seed": 99}')
    other = build(corpus, tmp_path / "other", 3, "--config", tmp_path / "seed.json")
    shutil.rmtree(damaged / "shard-0000")
    shutil.rmtree(damaged / "shard-0001")
    shutil.copytree(built[3] / "shard-0000", damaged / "shard-0000")
    shutil.copytree(other / "shard-0001", damaged / "shard-0001")
    p = tms("search", "--index", damaged, "--queries", corpus / "queries.npy", "--out", tmp_path / "r",
            "--device", "cpu")
    expect_error(p, "shard-0001", "model differs")


def test_shard_dir_is_not_an_index(built, corpus, tmp_path):
    p = tms("search", "--index", built[3] / "shard-0000", "--queries", corpus / "queries.npy", "--out",
            tmp_path / "r")
    expect_error(p, "a shard of the index")
    p = tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out",
            built[3] / "shard-0002", "--overwrite")
    expect_error(p, "inside the index", "refusing to write there")
