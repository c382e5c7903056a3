"""Nothing lost, nothing crashes: the `tms` writers under crashes, races, damage and abuse.

Crash points (TMS_CRASH_POINT=NAME[@N]: the process kills itself with SIGKILL there;
TMS_PAUSE_POINT=NAME:SECONDS: it sleeps there; TMS_LIST_POINTS=1: it names each point it
reaches) make every interleaving below deterministic.
"""
import concurrent.futures
import json
import os
import shutil
import signal
import sqlite3
import stat
import struct
import subprocess
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from cli_util import TMS, expect_error, tms
pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")


def start(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    return subprocess.Popen([TMS, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)


def wait_for_line(proc, needle, timeout=60):
    """Reads proc's stderr until a line contains needle (the process keeps running)."""
    deadline = time.time() + timeout
    seen = []
    while time.time() < deadline:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return
    raise AssertionError(f"{needle!r} not seen on stderr: {''.join(seen)!r}")


def leftovers(path):
    path = Path(path)
    return sorted(p.name for p in path.parent.iterdir() if p.name.startswith(path.name + "."))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("dur")
    tms("synth", "--out", d, "--docs", 300, "--queries", 8, "--dim", 64, check=True)
    ids = (d / "doc_ids.txt").read_text().split()
    (d / "del.txt").write_text("\n".join(ids[:40]) + "\n")
    (d / "one.txt").write_text(ids[200] + "\n")  # live in every state the writers leave
    # 30 new documents (ids new0..new29) for add.
    docs = np.load(d / "docs.npy")
    lens = np.load(d / "doclens.npy")
    n_tok = int(lens[:30].sum())
    np.save(d / "new_docs.npy", docs[:n_tok])
    np.save(d / "new_lens.npy", lens[:30].astype(np.int64))
    (d / "new_ids.txt").write_text("".join(f"new{i}\n" for i in range(30)))
    tms("index", "--docs", d / "docs.npy", "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt",
        "--out", d / "base", "--keep-vectors", "--no-estimate", "--centroids", 64, "--no-progress", check=True)
    return d


@pytest.fixture
def idx(corpus, tmp_path):
    """A fresh copy of the base index."""
    out = tmp_path / "idx"
    shutil.copytree(corpus / "base", out)
    return out


def info(index):
    p = tms("info", "--index", index, check=True)
    return dict(l.split("\t", 1) for l in p.stdout.splitlines())


def run_of(corpus, index, tmp, name="run.trec"):
    """The exhaustive top-20 run as {qid: [(docid, score)]}, or the failed process."""
    out = Path(tmp) / name
    p = tms("search", "--index", index, "--queries", corpus / "queries.npy", "--out", out, "--k", 20,
            "--exhaustive", "--device", "cpu")
    if p.returncode != 0:
        return p
    res = {}
    for line in out.read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        res.setdefault(q, []).append((d, round(float(s), 3)))
    return res


def live_ids(index, tmp=None):
    """The set of live external ids, from an exhaustive search with k = every document."""
    tmp = Path(tmp) if tmp else Path(index).parent / (Path(index).name + "-q")
    tmp.mkdir(exist_ok=True)
    out = tmp / "all.trec"
    c = Path(tmp) / "q.npy"
    np.save(c, np.ones((1, 4, 64), dtype=np.float16))
    tms("search", "--index", index, "--queries", c, "--out", out, "--k", 100000, "--exhaustive", "--device", "cpu",
        check=True)
    return {l.split()[2] for l in out.read_text().splitlines()}


def states(corpus):
    """Live id sets of the base index and after each writer of the suite (built the normal way)."""
    ids = set((corpus / "doc_ids.txt").read_text().split())
    deleted = set((corpus / "del.txt").read_text().split())
    added = set((corpus / "new_ids.txt").read_text().split())
    return {"base": ids, "deleted": ids - deleted, "added": ids | added}


WRITERS = {
    "add": lambda c, i: ("add", "--index", i, "--docs", c / "new_docs.npy", "--doclens", c / "new_lens.npy",
                         "--doc-ids", c / "new_ids.txt"),
    "delete": lambda c, i: ("delete", "--index", i, "--doc-ids", c / "del.txt"),
    "compact": lambda c, i: ("compact", "--index", i),
    "overwrite": lambda c, i: ("index", "--docs", c / "docs.npy", "--doclens", c / "doclens.npy", "--doc-ids",
                               c / "doc_ids.txt", "--out", i, "--keep-vectors", "--no-estimate", "--centroids", 64, "--overwrite",
                               "--no-progress"),
}
# The state each writer leaves when it runs on the base index with its 40 deletions applied
# (compact: same documents; delete on it: nothing to delete is an error, so delete runs on base).
EXPECTED = {"add": "added", "delete": "deleted", "compact": "deleted", "overwrite": "base"}


def prepare(corpus, index, writer):
    """compact needs tombstones: it runs on an index with the 40 deletions."""
    if writer == "compact":
        tms(*WRITERS["delete"](corpus, index), check=True)


# ---- row 1: never remove a directory that is not an index --------------------------------

def test_overwrite_spares_a_directory_with_a_current_file(corpus, tmp_path):
    ud = tmp_path / "ud"
    ud.mkdir()
    (ud / "thesis.tex").write_text("x")
    (ud / "CURRENT").write_text("v2\n")
    p = tms(*WRITERS["overwrite"](corpus, ud))
    expect_error(p, "not an index")
    assert (ud / "thesis.tex").read_text() == "x" and (ud / "CURRENT").exists()
    assert leftovers(ud) == []


def test_overwrite_spares_a_leftover_named_directory_of_someone_else(corpus, tmp_path, idx):
    # Names like ours, but without our marker: never touched.
    other = tmp_path / "idx.tmp-build-1"
    other.mkdir()
    (other / "keep").write_text("k")
    tms(*WRITERS["overwrite"](corpus, idx), check=True)
    assert (other / "keep").read_text() == "k"


# ---- row 2: one writer at a time, for the whole of every writing command ------------------

PAUSE_AT = {"add": "update:opened", "delete": "update:opened", "compact": "compact:opened",
            "overwrite": "build:created"}


def race(corpus, base_dir, a, b):
    index = base_dir / f"{a}-{b}"
    shutil.copytree(corpus / "base", index)
    prepare(corpus, index, a)
    pa = start(*WRITERS[a](corpus, index), env={"TMS_PAUSE_POINT": PAUSE_AT[a] + ":120"})
    try:
        wait_for_line(pa, "paused-at")
        pb = tms(*WRITERS[b](corpus, index))
    finally:
        pa.send_signal(signal.SIGUSR1)  # B is done: let A finish
        out, err = pa.communicate(timeout=120)
    return index, pa.returncode, err, pb


@pytest.mark.parametrize("a", sorted(WRITERS))
def test_second_writer_is_refused_while_one_runs(corpus, tmp_path, a):
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futs = {b: ex.submit(race, corpus, tmp_path, a, b) for b in sorted(WRITERS)}
        for b, f in futs.items():
            index, rc_a, err_a, pb = f.result()
            assert rc_a == 0, f"{a} failed: {err_a}"
            expect_error(pb, "another process is writing")
            assert live_ids(index) == states(corpus)[EXPECTED[a]], (a, b)


# ---- row 3: searches during a writer see the old or the new state --------------------------

def test_replacement_waits_for_a_reader_that_is_loading(corpus, idx, tmp_path):
    tms(*WRITERS["delete"](corpus, idx), check=True)
    before = run_of(corpus, idx, tmp_path, "before.trec")
    reader = start("search", "--index", idx, "--queries", corpus / "queries.npy", "--out", tmp_path / "r.trec",
                   "--k", 20, "--exhaustive", "--device", "cpu", env={"TMS_PAUSE_POINT": "read:locked:2"})
    wait_for_line(reader, "paused-at")
    t0 = time.time()
    tms("compact", "--index", idx, check=True)
    assert time.time() - t0 > 1.0, "compact replaced the index under a loading reader"
    _, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err
    got = run_of(corpus, idx, tmp_path, "after.trec")
    assert got == before


def test_searches_during_writers_see_old_or_new(corpus, idx, tmp_path):
    expect = {}
    for name, writer in [("with", None), ("without", "delete")]:
        d = tmp_path / name
        shutil.copytree(corpus / "base", d)
        if writer:
            tms(*WRITERS[writer](corpus, d), check=True)
        expect[name] = run_of(corpus, d, tmp_path, name + ".trec")
    stop = threading.Event()
    bad, ok, transient = [], [0], [0]

    def searcher(k):
        while not stop.is_set():
            r = run_of(corpus, idx, tmp_path, f"s{k}.trec")
            if isinstance(r, dict):
                if r in (expect["with"], expect["without"]):
                    ok[0] += 1
                else:
                    bad.append("mixed state")
            else:
                lines = [l for l in r.stderr.splitlines() if l.strip()]
                if len(lines) == 1 and ("try again" in lines[0]) and r.returncode > 0:
                    transient[0] += 1
                else:
                    bad.append(r.stderr)

    threads = [threading.Thread(target=searcher, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    try:
        for _ in range(3):
            tms(*WRITERS["delete"](corpus, idx), check=True)
            tms("compact", "--index", idx, check=True)
            tms("add", "--index", idx, "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy",
                "--doc-ids", corpus / "doc_ids.txt", "--replace", check=True)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not bad, bad[:3]
    assert ok[0] > 0


# ---- row 4: a committed update does not live in an unverified write-ahead log --------------

@pytest.mark.parametrize("damage", ["flip", "truncate", "remove"])
@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_log_damage_after_a_writer_loses_nothing(corpus, idx, tmp_path, writer, damage):
    prepare(corpus, idx, writer)
    tms(*WRITERS[writer](corpus, idx), check=True)
    want = states(corpus)[EXPECTED[writer]]
    for log in idx.glob("*.log"):
        data = log.read_bytes()
        if damage == "flip" and data:
            log.write_bytes(data[:-1] + bytes([data[-1] ^ 0x55]))
        elif damage == "truncate":
            log.write_bytes(data[: len(data) // 2])
        elif damage == "remove":
            log.unlink()
    assert int(info(idx)["deleted"]) == (40 if writer == "delete" else 0)
    assert live_ids(idx, tmp_path) == want


# ---- rows 5, 11: interrupted writers, and what they leave ----------------------------------

def crash_points(corpus, writer, tmp_path, env):
    index = tmp_path / "probe"
    shutil.copytree(corpus / "base", index)
    prepare(corpus, index, writer)
    p = tms(*WRITERS[writer](corpus, index), env={**env, "TMS_LIST_POINTS": "1"}, check=True)
    points = [l.split()[1] for l in p.stderr.splitlines() if l.startswith("crash-point ")]
    shutil.rmtree(index)
    counted, seen = [], {}
    for name in points:
        seen[name] = seen.get(name, 0) + 1
        counted.append(f"{name}@{seen[name]}")
    return counted


# Every writer with the atomic exchange; the two-renames fallback (the same replacement code for
# every writer) with the writers that replace the most: a whole index, and every store.
@pytest.mark.parametrize("writer,exchange", [(w, True) for w in sorted(WRITERS)] +
                         [("compact", False), ("overwrite", False)],
                         ids=[f"{w}-exchange" for w in sorted(WRITERS)] + ["compact-two-renames",
                                                                          "overwrite-two-renames"])
def test_kill_at_every_point_leaves_old_or_new(corpus, tmp_path, writer, exchange):
    env = {} if exchange else {"TMS_TEST_NO_RENAME_EXCHANGE": "1"}
    points = crash_points(corpus, writer, tmp_path, env)
    assert points, "no crash points reached"
    old_state = "deleted" if writer == "compact" else "base"
    allowed = {frozenset(states(corpus)[old_state]), frozenset(states(corpus)[EXPECTED[writer]])}
    for n, point in enumerate(points):
        index = tmp_path / ("k-" + point.replace(":", "-").replace("@", "-"))
        shutil.copytree(corpus / "base", index)
        prepare(corpus, index, writer)
        p = tms(*WRITERS[writer](corpus, index), env={**env, "TMS_CRASH_POINT": point})
        assert p.returncode == -signal.SIGKILL, f"{point}: not reached ({p.returncode}: {p.stderr})"
        # The next reader repairs what the writer left (restores or removes it, saying so).
        assert frozenset(live_ids(index)) in allowed, point
        assert leftovers(index) == [], (point, leftovers(index))
        # And the next writer works: a whole rebuild over what the kill left at the first and the
        # last point, a deletion (the cheapest writer) at the others.
        if n in (0, len(points) - 1):
            tms(*WRITERS["overwrite"](corpus, index), check=True)
        else:
            tms("delete", "--index", index, "--doc-ids", corpus / "one.txt", check=True)
        shutil.rmtree(index)


@pytest.mark.parametrize("writer", ["add", "compact", "overwrite"])
def test_kill_at_random_instants_leaves_old_or_new(corpus, tmp_path, writer):
    old_state = "deleted" if writer == "compact" else "base"
    allowed = {frozenset(states(corpus)[old_state]), frozenset(states(corpus)[EXPECTED[writer]])}
    rng = np.random.default_rng(7)
    for i, delay in enumerate(rng.uniform(0.0, 0.6, size=6)):
        index = tmp_path / f"r{i}"
        shutil.copytree(corpus / "base", index)
        prepare(corpus, index, writer)
        p = start(*WRITERS[writer](corpus, index))
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.communicate()
        assert frozenset(live_ids(index)) in allowed, delay
        assert leftovers(index) == []


# ---- document metadata (INDEX/metadata.sqlite) under the same kills ------------------------

@pytest.fixture(scope="module")
def meta_corpus(corpus):
    """The corpus with attributes: base_meta, the base index built with --metadata (keyed by id;
    every 7th document without an object) and its text field `tag`, the added documents' (a new
    column) and a replacement's for 30 documents of the base."""
    d = corpus
    ids = (d / "doc_ids.txt").read_text().split()
    with open(d / "base_meta.jsonl", "w") as f:
        for i, doc in enumerate(ids):
            if i % 7:
                f.write(json.dumps({"id": doc, "n": i, "tag": f"t{i % 5}", "score": i / 10}) + "\n")
    with open(d / "new_meta.jsonl", "w") as f:
        for i in range(30):
            f.write(json.dumps({"n": 1000 + i, "color": f"c{i}", "tag": f"added t{i % 3}"}) + "\n")
    (d / "rep_ids.txt").write_text("".join(f"{doc}\n" for doc in ids[100:130]))
    with open(d / "rep_meta.jsonl", "w") as f:
        for i, doc in enumerate(ids[100:130]):
            f.write(json.dumps({"id": doc, "n": -i, "color": f"r{i}", "tag": f"replaced t{i % 4}"}) + "\n")
    tms("index", "--docs", d / "docs.npy", "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt",
        "--out", d / "base_meta", "--keep-vectors", "--no-estimate", "--centroids", 64, "--no-progress", "--metadata",
        d / "base_meta.jsonl", "--metadata-types", "score:real", "--text-field", "tag", check=True)
    return d


META_WRITERS = {
    "add": lambda c, i: (*WRITERS["add"](c, i), "--metadata", c / "new_meta.jsonl"),
    "replace": lambda c, i: ("add", "--index", i, "--docs", c / "new_docs.npy", "--doclens", c / "new_lens.npy",
                             "--doc-ids", c / "rep_ids.txt", "--replace", "--metadata", c / "rep_meta.jsonl"),
    "delete": WRITERS["delete"],
    "compact": WRITERS["compact"],
}


def meta_rows(index, n_docs, below=True):
    """{doc: (id, {column: value})} of the rows below n_docs (or at and past it), NULLs left out."""
    con = sqlite3.connect(Path(index) / "metadata.sqlite")
    try:
        cur = con.execute(f"SELECT * FROM docs WHERE doc {'<' if below else '>='} ? ORDER BY doc", (n_docs,))
        cols = [c[0] for c in cur.description]
        return {r[0]: (r[1], {k: v for k, v in zip(cols[2:], r[2:]) if v is not None}) for r in cur}
    finally:
        con.close()


def meta_state(index):
    """What a reader of the index sees: documents, deleted, and the metadata rows of its documents
    (tms info first: it repairs what a killed writer left)."""
    i = info(index)
    n = int(i["documents"])
    rows = meta_rows(index, n)
    assert int(i["metadata_rows"]) == len(rows) == n
    # The text field's FTS5 index holds exactly the rows' text (FTS5's own check of an external
    # content table against its content).
    con = sqlite3.connect(Path(index) / "metadata.sqlite")
    try:
        con.execute("INSERT INTO texts(texts, rank) VALUES ('integrity-check', 1)")
    finally:
        con.close()
    return n, int(i["deleted"]), rows


# Every metadata writer with the atomic exchange; the two-renames fallback (the same replacement
# code for every writer, which test_kill_at_every_point_leaves_old_or_new runs too) with the one
# that replaces the metadata file whole.
@pytest.mark.parametrize("writer,exchange", [(w, True) for w in sorted(META_WRITERS)] + [("compact", False)],
                         ids=[f"{w}-exchange" for w in sorted(META_WRITERS)] + ["compact-two-renames"])
def test_kill_with_metadata_leaves_old_or_new_rows(meta_corpus, tmp_path, writer, exchange):
    c = meta_corpus
    env = {} if exchange else {"TMS_TEST_NO_RENAME_EXCHANGE": "1"}

    def fresh(name):
        index = tmp_path / name
        shutil.copytree(c / "base_meta", index)
        if writer == "compact":
            tms(*WRITERS["delete"](c, index), check=True)
        return index

    probe = fresh("probe")
    old = meta_state(probe)
    p = tms(*META_WRITERS[writer](c, probe), env={**env, "TMS_LIST_POINTS": "1"}, check=True)
    new = meta_state(probe)
    assert new != old
    points, seen = [], {}
    for name in (l.split()[1] for l in p.stderr.splitlines() if l.startswith("crash-point ")):
        seen[name] = seen.get(name, 0) + 1
        points.append(f"{name}@{seen[name]}")
    assert writer == "delete" or any(pt.startswith("meta:") for pt in points), points
    shutil.rmtree(probe)
    for point in points:
        index = fresh("k-" + point.replace(":", "-").replace("@", "-"))
        p = tms(*META_WRITERS[writer](c, index), env={**env, "TMS_CRASH_POINT": point})
        assert p.returncode == -signal.SIGKILL, f"{point}: not reached ({p.returncode}: {p.stderr})"
        got = meta_state(index)
        assert got in (old, new), (point, got[:2], old[:2], new[:2])
        assert leftovers(index) == [], (point, leftovers(index))
        # The next writer drops the rows of a commit the stores never made.
        tms("delete", "--index", index, "--doc-ids", c / "one.txt", check=True)
        assert meta_rows(index, got[0], below=False) == {}, point
        shutil.rmtree(index)


def test_leftover_of_a_killed_build_is_removed_with_a_line(corpus, tmp_path):
    out = tmp_path / "fresh"
    p = tms(*WRITERS["overwrite"](corpus, out), env={"TMS_CRASH_POINT": "build:complete"})
    assert p.returncode == -signal.SIGKILL
    left = leftovers(out)
    assert len(left) == 1 and ".tmp-build-" in left[0]
    assert not out.exists()
    p = tms(*WRITERS["overwrite"](corpus, out), check=True)
    assert "removed" in p.stderr and left[0] in p.stderr
    assert leftovers(out) == []


def test_build_dir_killed_before_its_marker_is_removed(corpus, idx, tmp_path):
    """A build killed between creating its directory and writing the marker leaves it empty (or
    holding only its lock): removed; one holding anything else is not ours to remove."""
    empty, locked, foreign = (idx.parent / f"{idx.name}.tmp-build-999999-{i}" for i in range(3))
    empty.mkdir()
    locked.mkdir()
    (locked / "TILEMAXSIM.writer").write_text("")
    foreign.mkdir()
    (foreign / "notes.txt").write_text("someone's")
    assert run_of(corpus, idx, tmp_path) and not empty.exists() and not locked.exists()
    assert (foreign / "notes.txt").read_text() == "someone's"


# ---- rows 6, 7: inputs that crashed --------------------------------------------------------

def wrapping_lens(lens):
    """int64 lengths whose sum wraps past 2^64 back to the true row count."""
    n = int(lens.sum())
    a = int(lens[0])
    big = 1 << 62
    return np.array([a + big, big, big, big + (n - a)], dtype=np.int64)


def test_doclens_whose_sum_wraps_are_refused(corpus, tmp_path, idx):
    lens = np.load(corpus / "doclens.npy")
    w = tmp_path / "wrap.npy"
    np.save(w, wrapping_lens(lens))
    ids = tmp_path / "ids4.txt"
    ids.write_text("w0\nw1\nw2\nw3\n")
    out = tmp_path / "wrapidx"
    expect_error(tms("index", "--docs", corpus / "docs.npy", "--doclens", w, "--out", out), "wrap.npy", "lengths")
    assert leftovers(out) == [] and not out.exists()
    expect_error(tms("add", "--index", idx, "--docs", corpus / "docs.npy", "--doclens", w, "--doc-ids", ids),
                 "wrap.npy", "lengths")
    # safetensors with the same lengths
    docs = np.load(corpus / "docs.npy")
    st = tmp_path / "wrap.safetensors"
    write_safetensors(st, {"embeddings": ("F16", list(docs.shape), docs.tobytes()),
                           "doclens": ("I64", [4], wrapping_lens(lens).tobytes())})
    expect_error(tms("index", "--docs", st, "--out", out), "wrap.safetensors", "lengths")
    assert leftovers(out) == [] and not out.exists()


def write_safetensors(path, tensors, shapes=None):
    header, blobs, off = {}, [], 0
    for name, (dt, shape, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(data)]}
        blobs.append(data)
        off += len(data)
    h = json.dumps(header).encode() if shapes is None else shapes.encode()
    h += b" " * (-len(h) % 8)  # the spec's padding: tensors aligned in the file
    Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def test_thread_counts_beyond_reason_are_refused(corpus, tmp_path):
    expect_error(tms(*WRITERS["overwrite"](corpus, tmp_path / "t"), "--threads", 100000), "--threads")
    cfg = tmp_path / "c.json"
    cfg.write_text('{"threads": 100000}')
    expect_error(tms(*WRITERS["overwrite"](corpus, tmp_path / "t"), "--config", cfg), "threads")


# ---- row 8: a nearly full disk -------------------------------------------------------------

def test_add_on_a_full_disk_fails_cleanly(corpus, tmp_path):
    mnt = tmp_path / "small"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        index = mnt / "idx"
        shutil.copytree(corpus / "base", index)
        free = shutil.disk_usage(mnt).free
        (mnt / "filler").write_bytes(b"\0" * (free - (1 << 20)))
        p = tms(*WRITERS["add"](corpus, index))
        expect_error(p, "disk full")
        (mnt / "filler").unlink()
        assert live_ids(index, tmp_path) == states(corpus)["base"]
        assert sorted(x.name for x in mnt.iterdir()) == ["idx"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)])


# ---- row 10: sizes capped by the index -----------------------------------------------------

@pytest.mark.parametrize("flag", ["--k", "--rerank"])
def test_huge_k_is_capped_by_the_index(corpus, idx, tmp_path, flag):
    out = tmp_path / "r.trec"
    code = ("import resource, subprocess, sys; "
            f"r = subprocess.run(sys.argv[1:], capture_output=True); "
            "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    args = [TMS, "search", "--index", idx, "--queries", corpus / "queries.npy", "--out", out, "--device", "cpu",
            flag, 10000000]
    p = subprocess.run(["python3", "-c", code, *map(str, args)], capture_output=True, text=True, timeout=120)
    rc, rss_kb = map(int, p.stdout.split())
    assert rc == 0
    assert rss_kb < 400 * 1024, f"{rss_kb} kB resident"
    lines = out.read_text().splitlines()
    per_query = len(lines) // 8
    assert per_query == (300 if flag == "--k" else 10)


# ---- rows 12, 17: paths -------------------------------------------------------------------

def test_trailing_slash_paths(corpus, tmp_path, idx):
    out = tmp_path / "new"
    tms(*WRITERS["overwrite"](corpus, str(out) + "/"), check=True)
    assert info(out)["documents"] == "300"
    tms(*WRITERS["delete"](corpus, idx), check=True)
    tms("compact", "--index", str(idx) + "/", check=True)
    assert info(idx)["deleted"] == "0" and info(idx)["documents"] == "260"
    assert leftovers(out) == [] and leftovers(idx) == []


def test_symlinked_index_is_replaced_at_its_target(corpus, tmp_path, idx):
    link = tmp_path / "link"
    link.symlink_to(idx)
    tms(*WRITERS["delete"](corpus, link), check=True)
    tms("compact", "--index", link, check=True)
    assert link.is_symlink() and os.readlink(link) == str(idx)
    assert info(idx)["documents"] == "260"
    tms(*WRITERS["overwrite"](corpus, link), check=True)
    assert link.is_symlink() and info(idx)["documents"] == "300"
    assert leftovers(idx) == [] and leftovers(link) == []


# ---- row 13: ids that runs cannot carry ----------------------------------------------------

def test_ids_with_control_characters_are_refused(corpus, tmp_path):
    ids = (corpus / "doc_ids.txt").read_text().split()
    ids[0], ids[1] = "a\0b", "a\0c"
    f = tmp_path / "ids.txt"
    f.write_text("\n".join(ids) + "\n")
    expect_error(tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--doc-ids", f,
                     "--out", tmp_path / "x"), "ids.txt", "control character")
    q = tmp_path / "qids.txt"
    q.write_text("".join(f"q{i}\n" for i in range(7)) + "q\x017\n")
    expect_error(tms("search", "--index", corpus / "base", "--queries", corpus / "queries.npy", "--query-ids", q,
                     "--out", tmp_path / "r"), "qids.txt", "control character")


# ---- rows 14, 15: inputs accepted silently, and their messages ------------------------------

def test_safetensors_shapes_that_wrap_or_are_not_integers(corpus, tmp_path):
    docs = np.load(corpus / "docs.npy")
    lens = np.load(corpus / "doclens.npy").astype(np.int64)
    n = docs.shape[0]
    for i, shape in enumerate([f"[{2**63 + n}, 64]", f"[{float(n)}, 64]", f"[-{n}, 64]"]):
        st = tmp_path / f"s{i}.safetensors"
        d, l = docs.tobytes(), lens.tobytes()
        h = ('{"embeddings": {"dtype": "F16", "shape": %s, "data_offsets": [0, %d]}, '
             '"doclens": {"dtype": "I64", "shape": [%d], "data_offsets": [%d, %d]}}'
             % (shape, len(d), len(lens), len(d), len(d) + len(l)))
        write_safetensors(st, {"embeddings": ("F16", [], d), "doclens": ("I64", [], l)}, shapes=h)
        expect_error(tms("index", "--docs", st, "--out", tmp_path / f"o{i}"), st.name)


def npy_with_header(path, header, payload):
    h = header.encode()
    h += b" " * ((64 - (10 + len(h) + 1) % 64) % 64) + b"\n"
    Path(path).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h + payload)


def test_npy_headers_that_numpy_reads_otherwise(corpus, tmp_path):
    lens = np.load(corpus / "doclens.npy").astype(np.int64)
    f = tmp_path / "twoshapes.npy"
    npy_with_header(f, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), 'shape': (%d,), }" % len(lens),
                    lens.tobytes())
    expect_error(tms("index", "--docs", corpus / "docs.npy", "--doclens", f, "--out", tmp_path / "o"),
                 "twoshapes.npy", "twice")
    g = tmp_path / "huge.npy"
    npy_with_header(g, "{'descr': '<f2', 'fortran_order': False, 'shape': (99999999999999999999999999999, 32), }", b"")
    expect_error(tms("index", "--docs", g, "--doclens", corpus / "doclens.npy", "--out", tmp_path / "o"),
                 "huge.npy", "too large")


@pytest.mark.parametrize("dtype", ["int8", "uint8", "uint32", "uint64", "int16"])
def test_doclens_of_other_integer_types_are_refused(corpus, tmp_path, dtype):
    f = tmp_path / "lens.npy"
    np.save(f, np.load(corpus / "doclens.npy").astype(dtype))
    expect_error(tms("index", "--docs", corpus / "docs.npy", "--doclens", f, "--out", tmp_path / "o"),
                 "lens.npy", "int32 or int64")


@pytest.mark.parametrize("flag,value", [("--centroids", -1), ("--pq-m", -4), ("--nbits", 3)])
def test_negative_build_options_are_refused(corpus, tmp_path, flag, value):
    expect_error(tms(*WRITERS["overwrite"](corpus, tmp_path / "o"), flag, value), flag)


def test_batch_zero_message_is_short(corpus, tmp_path):
    p = tms("search", "--index", corpus / "base", "--queries", corpus / "queries.npy", "--out", tmp_path / "r",
            "--batch", 0)
    expect_error(p, "--batch", "1 to")
    assert len(p.stderr) < 200


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_damaged_files_fail_clearly_or_read_right(corpus, idx, tmp_path, writer):
    """After each writer, a byte flip in any table, blob, manifest or vectors file: a clear error
    or the right results."""
    prepare(corpus, idx, writer)
    tms(*WRITERS[writer](corpus, idx), check=True)
    want = run_of(corpus, idx, tmp_path, "want.trec")
    files = sorted(p for p in idx.iterdir()
                   if p.suffix in (".sst", ".blob", ".f16") or p.name.startswith("MANIFEST"))
    assert (idx / "vectors.f16").exists()
    assert files
    for f in files:
        for frac in (0.3, 0.7):
            copy = tmp_path / f"d-{f.name}-{frac}"
            shutil.copytree(idx, copy)
            g = copy / f.name
            data = bytearray(g.read_bytes())
            data[int(len(data) * frac)] ^= 0x5A
            g.write_bytes(bytes(data))
            got = run_of(corpus, copy, tmp_path, "got.trec")
            if isinstance(got, dict):
                assert got == want, f"{f.name}: wrong results"
            else:
                lines = [l for l in got.stderr.splitlines() if l.strip()]
                assert got.returncode > 0 and len(lines) == 1, got.stderr
                assert not lines[0].rstrip().endswith(":"), lines[0]
            shutil.rmtree(copy)


# ---- row 16: outputs that are not regular files --------------------------------------------

def test_run_output_to_a_device_is_written_in_place(corpus, tmp_path):
    if os.geteuid() != 0:
        pytest.skip("mknod needs root")
    dev = tmp_path / "null"
    os.mknod(dev, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    tms("search", "--index", corpus / "base", "--queries", corpus / "queries.npy", "--out", dev, check=True)
    assert stat.S_ISCHR(os.stat(dev).st_mode)
    assert leftovers(dev) == []


def test_run_output_to_a_fifo_and_through_a_symlink(corpus, tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    got = []
    reader = threading.Thread(target=lambda: got.append(Path(fifo).read_text()))
    reader.start()
    tms("search", "--index", corpus / "base", "--queries", corpus / "queries.npy", "--out", fifo, check=True)
    reader.join(timeout=60)
    assert stat.S_ISFIFO(os.stat(fifo).st_mode) and len(got[0].splitlines()) == 80
    target = tmp_path / "real.trec"
    target.write_text("old\n")
    link = tmp_path / "link.trec"
    link.symlink_to(target)
    tms("search", "--index", corpus / "base", "--queries", corpus / "queries.npy", "--out", link, check=True)
    assert link.is_symlink() and len(target.read_text().splitlines()) == 80
