"""build_index from a stream of batches (IndexStreamBuilder): a generator of (documents, ids[,
metadata]) builds the index the whole list builds when it is shorter than the training sample;
a longer one trains on its first batches and takes every document; bad batches raise naming the
batch, and a failed or interrupted stream leaves nothing at the path. The CLI's `--docs -` reads
the same stream of .npy pairs from standard input.

Run with PYTHONPATH=BUILD/python (ctest pytest_python) and TMS_BIN for the CLI.
"""
import io
import os
import subprocess

import numpy as np
import pytest

tilemaxsim = pytest.importorskip("tilemaxsim")
TMS = os.environ.get("TMS_BIN")


@pytest.fixture(scope="module")
def corpus():
    rng = np.random.default_rng(3)
    n = 900
    lens = rng.integers(4, 40, size=n)
    centers = rng.standard_normal((30, 48)).astype(np.float32)
    docs = [(centers[rng.integers(0, 30, size=m)] + 0.4 * rng.standard_normal((m, 48))).astype(np.float16)
            for m in lens]
    ids = [f"p{i}" for i in range(n)]
    meta = [{"group": i % 4, "title": f"passage {i}"} for i in range(n)]
    queries = np.stack([d[:8] if len(d) >= 8 else np.pad(d, ((0, 8 - len(d)), (0, 0))) for d in docs[:40:4]])
    return docs, ids, meta, queries


def batches(docs, ids, meta, size):
    for a in range(0, len(docs), size):
        yield docs[a:a + size], ids[a:a + size], meta[a:a + size]


def test_a_short_stream_builds_the_index_of_the_whole_list(corpus, tmp_path):
    docs, ids, meta, queries = corpus
    opts = dict(keep_vectors=True, n_centroids=64, estimate=False, progress=False)
    counts = tilemaxsim.build_index(tmp_path / "s", batches(docs, ids, meta, 128), **opts)
    assert counts["n_docs"] == len(docs)
    tilemaxsim.build_index(tmp_path / "w", docs, ids, metadata=meta, **opts)
    a, b = tilemaxsim.Searcher(tmp_path / "s", device="cpu"), tilemaxsim.Searcher(tmp_path / "w", device="cpu")
    for kw in ({}, {"exhaustive": True}, {"filter": "group = 1"}):
        ha, sa = a.search(queries, k=10, **kw)
        hb, sb = b.search(queries, k=10, **kw)
        assert ha == hb
        for x, y in zip(sa, sb):
            np.testing.assert_array_equal(x, y)


def test_a_long_stream_trains_on_its_first_batches_and_takes_every_document(corpus, tmp_path):
    docs, ids, meta, queries = corpus
    tokens = int(sum(len(d) for d in docs))
    # A sample of about 2,000 tokens: the stream outgrows it after a few batches.
    tilemaxsim.build_index(tmp_path / "s", ((d, i) for d, i, _ in batches(docs, ids, meta, 50)), keep_vectors=True,
                           n_centroids=32, max_train_tokens=2000, expected_tokens=tokens, estimate=False,
                           progress=False)
    s = tilemaxsim.Searcher(tmp_path / "s", device="cpu")
    assert s.info["n_docs"] == len(docs)
    # Every document is there with its own vectors: each finds itself first from its tokens.
    probe = [0, 333, 899]
    hits, _ = s.search([docs[i] for i in probe], k=1, exhaustive=True)
    assert [h[0] for h in hits] == [ids[i] for i in probe]
    # The approximate search still finds what exhaustive search finds, mostly.
    got, _ = s.search(queries, k=10)
    exact, _ = s.search(queries, k=10, exhaustive=True)
    recall = np.mean([len(set(g) & set(e)) / 10 for g, e in zip(got, exact)])
    assert recall >= 0.8


def test_batches_without_ids_are_numbered_on(corpus, tmp_path):
    docs = corpus[0]
    tilemaxsim.build_index(tmp_path / "n", iter([docs[:10], docs[10:25]]), estimate=False, progress=False,
                           n_centroids=16)
    hits, _ = tilemaxsim.Searcher(tmp_path / "n", device="cpu").search([docs[17]], k=1, exhaustive=False)
    assert hits[0][0] == "17"


@pytest.mark.parametrize("bad, message", [
    (lambda d, i: (d[:5], i[:4]), "batch 2"),                         # ids of another count
    (lambda d, i: (d[:5], ["p0"] + i[1:5]), "batch 2: duplicate id 'p0'"),  # an id of batch 1
    (lambda d, i: (d[:5], "p77"), "a single str is one id"),             # a str where a list belongs
    (lambda d, i: ([x.astype(np.float32)[:, :32] for x in d[:5]], i[5:10]), "differs from the stream's 48"),
    (lambda d, i: 42, r"batch 2: expected \(documents, ids"),
])
def test_a_bad_batch_raises_naming_it_and_leaves_nothing(corpus, tmp_path, bad, message):
    docs, ids, _, _ = corpus

    def stream():
        yield docs[:20], ids[:20]
        yield bad(docs[20:], ids[20:])

    with pytest.raises((ValueError, TypeError), match=message):
        tilemaxsim.build_index(tmp_path / "x", stream(), estimate=False, progress=False, n_centroids=16)
    assert not (tmp_path / "x").exists()
    assert list(tmp_path.iterdir()) == []  # no build directory left behind


def test_an_exception_inside_the_stream_leaves_nothing(corpus, tmp_path):
    docs, ids, _, _ = corpus

    def stream():
        yield docs[:20], ids[:20]
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        tilemaxsim.build_index(tmp_path / "x", stream(), estimate=False, progress=False, n_centroids=16)
    assert list(tmp_path.iterdir()) == []


def test_ids_beside_a_stream_and_a_size_without_one_are_refused(corpus, tmp_path):
    docs, ids, _, _ = corpus
    with pytest.raises(TypeError, match="carries its own ids"):
        tilemaxsim.build_index(tmp_path / "x", iter([(docs[:3], ids[:3])]), ids=ids[:3])
    with pytest.raises(TypeError, match="expected_tokens sizes a stream"):  # documents given whole are counted
        tilemaxsim.build_index(tmp_path / "x", docs[:3], ids[:3], expected_tokens=10**6)
    assert not (tmp_path / "x").exists()


@pytest.mark.skipif(not TMS, reason="TMS_BIN not set")
def test_cli_reads_the_stream_from_standard_input(corpus, tmp_path):
    docs, ids, meta, queries = corpus
    buf = io.BytesIO()
    for a in range(0, len(docs), 200):
        part = docs[a:a + 200]
        np.save(buf, np.concatenate(part))
        np.save(buf, np.array([len(x) for x in part], dtype=np.int64))
    (tmp_path / "ids.txt").write_text("\n".join(ids) + "\n")
    r = subprocess.run([TMS, "index", "--docs", "-", "--doc-ids", str(tmp_path / "ids.txt"), "--out",
                        str(tmp_path / "cli"), "--keep-vectors", "--centroids", "64", "--no-estimate", "--no-progress"],
                       input=buf.getvalue(), capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    tilemaxsim.build_index(tmp_path / "py", ((d, i) for d, i, _ in batches(docs, ids, meta, 200)), keep_vectors=True,
                           n_centroids=64, estimate=False, progress=False)
    a, b = tilemaxsim.Searcher(tmp_path / "cli", device="cpu"), tilemaxsim.Searcher(tmp_path / "py", device="cpu")
    assert a.search(queries, k=10)[0] == b.search(queries, k=10)[0]
    # A stream cut inside an array, and fewer ids than documents: one line, non-zero, nothing built.
    cut = buf.getvalue()[:-100]
    r = subprocess.run([TMS, "index", "--docs", "-", "--out", str(tmp_path / "cut"), "--no-progress"], input=cut,
                       capture_output=True)
    assert r.returncode != 0 and b"truncated" in r.stderr and len(r.stderr.decode().strip().splitlines()) == 1
    assert not (tmp_path / "cut").exists()
    (tmp_path / "few.txt").write_text("\n".join(ids[:300]) + "\n")
    r = subprocess.run([TMS, "index", "--docs", "-", "--doc-ids", str(tmp_path / "few.txt"), "--out",
                        str(tmp_path / "few"), "--no-progress"], input=buf.getvalue(), capture_output=True)
    assert r.returncode != 0 and b"fewer than the stream's documents" in r.stderr
    assert not (tmp_path / "few").exists()


def test_pool_factor_pools_lists_streams_and_adds_alike(corpus, tmp_path):
    docs, ids, meta, queries = corpus
    opts = dict(keep_vectors=True, n_centroids=32, estimate=False, progress=False, pool_factor=2)
    a = tilemaxsim.build_index(tmp_path / "list", docs[:200], ids[:200], **opts)
    b = tilemaxsim.build_index(tmp_path / "stream", ((d, i) for d, i, _ in batches(docs[:200], ids[:200], meta, 64)),
                               **opts)
    assert a["n_tokens"] == b["n_tokens"] == sum((len(d) + 1) // 2 for d in docs[:200])
    sa, sb = tilemaxsim.Searcher(tmp_path / "list", device="cpu"), tilemaxsim.Searcher(tmp_path / "stream", device="cpu")
    assert sa.search(queries, k=5, exhaustive=True)[0] == sb.search(queries, k=5, exhaustive=True)[0]
    # Documents added later are pooled by the index's factor: the same document, the same scores.
    sa.add([docs[7]], ["again"])
    hits, scores = sa.search([docs[7][:8]], k=2, exhaustive=True)
    assert set(hits[0]) == {ids[7], "again"} and scores[0][0] == scores[0][1]
    with pytest.raises(ValueError, match="pool_factor"):
        tilemaxsim.build_index(tmp_path / "bad", docs[:10], ids[:10], pool_factor=0)
