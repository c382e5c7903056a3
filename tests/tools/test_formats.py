"""Index formats: the vectors file of format 5 (truncated, missing or damaged: one line naming
it), and indexes of format 3 (vectors inside the store; tests/data/index-v3, written by the
build before format 5) still open, search and take updates in their own format."""
import datetime
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from cli_util import TMS, expect_error, tms

pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
V3 = Path(__file__).resolve().parents[1] / "data" / "index-v3"


def info(index):
    p = tms("info", "--index", index, check=True)
    return dict(l.split("\t", 1) for l in p.stdout.splitlines())


def exact_run(index, queries, out, k=5):
    tms("search", "--index", index, "--queries", queries, "--out", out, "--k", k, "--exhaustive", "--device", "cpu",
        "--no-progress", check=True)
    return [(l.split()[0], l.split()[2], round(float(l.split()[4]), 4)) for l in Path(out).read_text().splitlines()]


def build(d, out, docs="docs.npy", lens="doclens.npy", ids="doc_ids.txt"):
    tms("index", "--docs", d / docs, "--doclens", d / lens, "--doc-ids", d / ids, "--out", out, "--keep-vectors",
        "--centroids", 8, "--no-progress", check=True)
    return out


@pytest.fixture
def v3(tmp_path):
    shutil.copytree(V3, tmp_path / "v3")
    return tmp_path / "v3"


def test_format_3_opens_and_searches_as_written(v3, tmp_path):
    assert info(v3 / "index")["format_version"] == "3"
    want = [(l.split()[0], l.split()[2], round(float(l.split()[4]), 4)) for l in (v3 / "exact.trec").read_text().splitlines()]
    assert exact_run(v3 / "index", v3 / "queries.npy", tmp_path / "r.trec") == want
    tms("search", "--index", v3 / "index", "--queries", v3 / "queries.npy", "--out", tmp_path / "d.trec", "--k", 5,
        "--device", "cpu", "--no-progress", check=True)


def test_format_3_takes_updates_in_its_format(v3, tmp_path):
    docs, lens = np.load(v3 / "docs.npy"), np.load(v3 / "doclens.npy")
    n = int(lens[:10].sum())
    np.save(tmp_path / "new.npy", docs[:n] * -1)
    np.save(tmp_path / "new_lens.npy", lens[:10].astype(np.int64))
    (tmp_path / "new_ids.txt").write_text("".join(f"new{i}\n" for i in range(10)))
    tms("add", "--index", v3 / "index", "--docs", tmp_path / "new.npy", "--doclens", tmp_path / "new_lens.npy",
        "--doc-ids", tmp_path / "new_ids.txt", check=True)
    i = info(v3 / "index")
    assert i["format_version"] == "3" and i["documents"] == "70"
    assert not (v3 / "index" / "vectors.f16").exists()
    # The same documents built afresh (format 5): the same exhaustive run.
    np.save(tmp_path / "all.npy", np.concatenate([docs, docs[:n] * -1]))
    np.save(tmp_path / "all_lens.npy", np.concatenate([lens, lens[:10]]).astype(np.int64))
    (tmp_path / "all_ids.txt").write_text((v3 / "doc_ids.txt").read_text() + (tmp_path / "new_ids.txt").read_text())
    fresh = build(tmp_path, tmp_path / "fresh", "all.npy", "all_lens.npy", "all_ids.txt")
    assert info(fresh)["format_version"] == "5" and (fresh / "vectors.f16").exists()
    q = v3 / "queries.npy"
    assert exact_run(v3 / "index", q, tmp_path / "a.trec", 20) == exact_run(fresh, q, tmp_path / "b.trec", 20)


@pytest.fixture
def v5(v3, tmp_path):
    return build(v3, tmp_path / "v5")


def test_vectors_file_of_an_add_is_appended(v5, v3, tmp_path):
    docs, lens = np.load(v3 / "docs.npy"), np.load(v3 / "doclens.npy")
    before = (v5 / "vectors.f16").stat().st_size
    assert before == docs.shape[0] * docs.shape[1] * 2
    n = int(lens[:5].sum())
    np.save(tmp_path / "new.npy", docs[:n])
    np.save(tmp_path / "new_lens.npy", lens[:5].astype(np.int64))
    (tmp_path / "new_ids.txt").write_text("".join(f"new{i}\n" for i in range(5)))
    tms("add", "--index", v5, "--docs", tmp_path / "new.npy", "--doclens", tmp_path / "new_lens.npy", "--doc-ids",
        tmp_path / "new_ids.txt", check=True)
    assert (v5 / "vectors.f16").stat().st_size == before + n * docs.shape[1] * 2
    run = exact_run(v5, v3 / "queries.npy", tmp_path / "r.trec", 100)
    assert {d for _, d, _ in run} >= {f"new{i}" for i in range(5)}


def test_truncated_vectors_file_is_one_line(v5, v3, tmp_path):
    f = v5 / "vectors.f16"
    with open(f, "r+b") as fh:
        fh.truncate(f.stat().st_size - 2)
    p = tms("search", "--index", v5, "--queries", v3 / "queries.npy", "--out", tmp_path / "r.trec", "--device", "cpu")
    expect_error(p, "vectors.f16", "truncated")
    assert not (tmp_path / "r.trec").exists()


def test_missing_vectors_file_is_one_line(v5, v3, tmp_path):
    (v5 / "vectors.f16").unlink()
    p = tms("search", "--index", v5, "--queries", v3 / "queries.npy", "--out", tmp_path / "r.trec", "--device", "cpu")
    expect_error(p, "vectors.f16", "missing")


def test_flipped_vector_byte_is_a_checksum_error(v5, v3, tmp_path):
    f = v5 / "vectors.f16"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x01
    f.write_bytes(bytes(data))
    p = tms("search", "--index", v5, "--queries", v3 / "queries.npy", "--out", tmp_path / "r.trec", "--device", "cpu")
    expect_error(p, "vectors.f16", "checksum mismatch")


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_vectors_on_disk_search_and_damage(v5, v3, tmp_path, damage):
    """--vectors disk reads the rows a search needs from vectors.f16: the same runs as in
    memory; a damaged file is one line naming it (at open when truncated, at the first read of
    the damaged chunk when a byte flipped), and no run is written; a tier that cannot be had is
    one line too."""
    q = v3 / "queries.npy"
    for mode in ([], ["--exhaustive"]):
        runs = []
        # The smallest exhaustive step (--stream-mib 1) streams the rows in several steps.
        for tier, step in (("host", []), ("disk", []), ("disk", ["--stream-mib", 1])):
            out = tmp_path / f"{tier}.trec"
            p = tms("search", "--index", v5, "--queries", q, "--out", out, "--device", "cpu", "--no-progress",
                    "--vectors", tier, *step, *mode, check=True)
            assert f"vectors {tier}" in p.stderr
            runs.append(out.read_text())
        assert runs[0] == runs[1] == runs[2]
    p = tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "x.trec", "--vectors", "ram")
    expect_error(p, "--vectors", "expected auto, gpu, host, disk or none")
    f = v5 / "vectors.f16"
    with open(f, "r+b") as fh:
        if damage == "truncate":
            fh.truncate(f.stat().st_size - 2)
        else:
            fh.seek(1000)
            b = fh.read(1)
            fh.seek(1000)
            fh.write(bytes([b[0] ^ 0x10]))
    out = tmp_path / "bad.trec"
    p = tms("search", "--index", v5, "--queries", q, "--out", out, "--device", "cpu", "--vectors", "disk",
            "--exhaustive")
    expect_error(p, str(f), "truncated" if damage == "truncate" else "checksum mismatch")
    assert not out.exists()


def test_served_queries_recorded_then_measured(v5, v3, tmp_path):
    """tms search --record-queries keeps a sample of the queries it searched in a .npy, merged
    with what the file holds (at most --record-max); tms estimate --sample measures the recall
    on it; a file that is not such a sample, or one over an input, is one line naming it."""
    q = v3 / "queries.npy"
    n = np.load(q).shape[0]
    sample, run = tmp_path / "served.npy", tmp_path / "r.trec"
    search = lambda *extra, **kw: tms("search", "--index", v5, "--queries", q, "--out", run, "--device", "cpu",
                                      "--no-progress", "--record-queries", sample, *extra, **kw)
    p = search(check=True)
    assert f"{n} of {n} queries sampled" in p.stderr
    got = np.load(sample)
    assert got.dtype == np.float16 and got.shape == (n,) + np.load(q).shape[1:]
    # Each row one of the queries searched (as fp16).
    want = {r.tobytes() for r in np.load(q).astype(np.float16)}
    assert all(r.tobytes() in want for r in got)
    search("--record-max", n + 2, check=True)  # merged with the file's: n + n, at most n + 2 kept
    assert np.load(sample).shape[0] == n + 2
    p = tms("estimate", "--index", v5, "--sample", sample, "--device", "cpu", check=True)
    assert f"{n + 2} sample queries" in p.stderr and info(v5)["estimate_queries"] == f"{n + 2} sample"
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((4, 64), np.float16))
    expect_error(tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "r2.trec", "--device", "cpu",
                     "--no-progress", "--record-queries", flat), str(flat), "not a sample of queries")
    assert not (tmp_path / "r2.trec").exists()  # refused before searching
    assert np.load(flat).shape == (4, 64)  # untouched
    expect_error(tms("search", "--index", v5, "--queries", q, "--out", run, "--device", "cpu", "--no-progress",
                     "--record-queries", q), "--record-queries")
    assert np.load(q).shape[0] == n


def test_recall_estimate_is_measured_shown_used_and_checked(v5, v3, tmp_path):
    """tms index --keep-vectors ends with the recall estimate: stored beside the index, shown by
    tms info, used by tms search (which says what it chose), measured again by tms estimate;
    --no-estimate skips it; a damaged one is one line naming it."""
    assert (v5 / "estimate.json").exists()
    i = info(v5)
    assert 0 <= float(i["estimated_recall@10"]) <= 1
    assert i["target_recall"].startswith("0.99\tnprobe ")
    # A killed estimate's temporary is removed by the next one; a running writer's is not.
    dead, live = v5 / "estimate.json.tmp-999999999", v5 / f"estimate.json.tmp-{os.getpid()}"
    dead.write_text("{")
    live.write_text("{")
    p = tms("estimate", "--index", v5, "--queries", 8, "--device", "cpu", check=True)
    assert "estimated recall@10 of the default search" in p.stderr and "8 pseudo-queries" in p.stderr
    assert not dead.exists() and live.exists()
    live.unlink()
    q = v3 / "queries.npy"
    # Sample queries of one's own instead of pseudo-queries; a file that is not queries is one line.
    p = tms("estimate", "--index", v5, "--sample", q, "--device", "cpu", check=True)
    assert f"{np.load(q).shape[0]} sample queries" in p.stderr
    assert info(v5)["estimate_queries"].endswith(" sample")
    # When it was measured (UTC): now, to the second.
    when = datetime.datetime.strptime(info(v5)["estimate_measured_at"], "%Y-%m-%dT%H:%M:%SZ")
    assert abs((datetime.datetime.utcnow() - when).total_seconds()) < 600
    flat = tmp_path / "flat.npy"
    np.save(flat, np.zeros((4, 64), np.float16))
    expect_error(tms("estimate", "--index", v5, "--sample", flat, "--device", "cpu"), str(flat))
    p = tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "r.trec", "--device", "cpu", "--no-progress",
            check=True)
    # 60 documents, fewer than the 256 the default reranks on a CPU: searched exhaustively, which is cheaper.
    assert "exhaustive: cheaper than the approximate search on 60 live documents (at most 256 on the cpu" in p.stderr
    p = tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "r.trec", "--device", "cpu", "--no-progress",
            "--rerank", 32, check=True)
    assert "target recall 0.99: nprobe" in p.stderr
    p = tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "r.trec", "--device", "cpu", "--no-progress",
            "--target-recall", "1.5")
    assert p.returncode != 0
    fresh = tmp_path / "fresh"
    tms("index", "--docs", v3 / "docs.npy", "--doclens", v3 / "doclens.npy", "--doc-ids", v3 / "doc_ids.txt", "--out",
        fresh, "--keep-vectors", "--centroids", 8, "--no-progress", "--no-estimate", check=True)
    assert not (fresh / "estimate.json").exists() and "estimated_recall@10" not in info(fresh)
    # The build's estimate of a sample of one's own; a bad sample fails before the build starts.
    sampled = tmp_path / "sampled"
    tms("index", "--docs", v3 / "docs.npy", "--doclens", v3 / "doclens.npy", "--out", sampled, "--keep-vectors",
        "--centroids", 8, "--no-progress", "--device", "cpu", "--estimate-sample", q, check=True)
    assert info(sampled)["estimate_queries"] == f"{np.load(q).shape[0]} sample"
    bad = tmp_path / "bad"
    p = tms("index", "--docs", v3 / "docs.npy", "--doclens", v3 / "doclens.npy", "--out", bad, "--keep-vectors",
            "--centroids", 8, "--no-progress", "--estimate-sample", flat)
    expect_error(p, str(flat))
    assert not bad.exists()
    # Span pseudo-queries padded as ColBERT's: the recipe is recorded with the estimate.
    tms("estimate", "--index", fresh, "--queries", 8, "--device", "cpu", "--content-tokens", 11, check=True)
    recipe = json.loads((fresh / "estimate.json").read_text())
    assert recipe["content_tokens"] == 11 and recipe["pad_noise"] == 1.7 and not recipe.get("sample")
    (v5 / "estimate.json").write_text('{"queries": 3, "points": [')
    p = tms("search", "--index", v5, "--queries", q, "--out", tmp_path / "x.trec", "--device", "cpu")
    expect_error(p, "estimate.json")
    p = tms("estimate", "--index", fresh.parent / "nope")
    assert p.returncode != 0
