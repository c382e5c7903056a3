"""`tms serve` through real HTTP clients (http.client, raw sockets, tilemaxsim.Client): served
searches equal the CLI's, writes are durable and visible, a key's filter cannot be escaped, bad
requests are 4xx and the server keeps serving, idle and slow clients hold no worker, overload is
503, SIGTERM finishes the requests in flight, kill -9 loses no acknowledged write.

Run with PYTHONPATH=BUILD/python and TMS_BIN (ctest pytest_serve)."""
import contextlib
import http.client
import io
import json
import os
import signal
import socket
import subprocess
import threading
import time

import numpy as np
import pytest

tilemaxsim = pytest.importorskip("tilemaxsim")
TMS = os.environ.get("TMS_BIN")
pytestmark = pytest.mark.skipif(not TMS, reason="needs TMS_BIN")
DIM = 64
ADMIN = "admin-key-0123456789abcdef"
T1 = "tenant1-key-0123456789abcdef"
T1_READ = "tenant1-read-0123456789abcdef"


def unit(x):
    return (x / np.linalg.norm(x, axis=-1, keepdims=True)).astype(np.float16)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("serve")
    rng = np.random.default_rng(5)
    centers = rng.standard_normal((40, DIM)).astype(np.float32)
    docs = [unit(centers[rng.integers(0, 40, size=n)] + 0.3 * rng.standard_normal((n, DIM)).astype(np.float32))
            for n in rng.integers(6, 40, size=600)]
    q = unit(centers[rng.integers(0, 40, size=(16, 12))] + 0.3 * rng.standard_normal((16, 12, DIM)).astype(np.float32))
    ids = [f"d{i}" for i in range(len(docs))]
    meta = [{"tenant": i % 3} for i in range(len(docs))]
    np.save(d / "queries.npy", q)
    (d / "keys.json").write_text(json.dumps({"keys": [
        {"name": "ops", "key": ADMIN, "scopes": ["read", "write", "admin"]},
        {"name": "t1", "key": T1, "scopes": ["read", "write"], "filter": "tenant = 1"},
        {"name": "t1-read", "key": T1_READ, "scopes": ["read"], "filter": "tenant = 1"}]}))
    return {"dir": d, "docs": docs, "ids": ids, "meta": meta, "queries": q}


def fresh_index(corpus, name):
    path = corpus["dir"] / name
    tilemaxsim.build_index(path, corpus["docs"], corpus["ids"], keep_vectors=True, n_centroids=64,
                           metadata=corpus["meta"])
    return path


def start(index, *args, keys=None):
    """tms serve on a free port; returns (process, host, port)."""
    cmd = [TMS, "serve", "--index", str(index), "--port", "0", "--device", "cpu", *map(str, args)]
    if keys:
        cmd += ["--api-keys", str(keys)]
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    line = p.stderr.readline()
    assert "listening on http://127.0.0.1:" in line, line
    port = int(line.split("127.0.0.1:")[1].split("/")[0])
    threading.Thread(target=lambda: [None for _ in p.stderr], daemon=True).start()
    c = tilemaxsim.Client(f"http://127.0.0.1:{port}", ADMIN if keys else None)
    deadline = time.time() + 60
    while not c.ready():
        assert p.poll() is None and time.time() < deadline
        time.sleep(0.05)
    return p, "127.0.0.1", port


def stop(p):
    p.terminate()
    assert p.wait(30) == 0


@contextlib.contextmanager
def serving(index, *args, keys=None):
    """tms serve (start) for a with-block: (process, url, port); stopped (SIGTERM, exit 0) after."""
    p, host, port = start(index, *args, keys=keys)
    try:
        yield p, f"http://{host}:{port}", port
    finally:
        stop(p)


def raw(port, method, path, body=None, headers=None):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request(method, path, body=body, headers=headers or {})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def read_trec(path):
    run = {}
    for line in open(path):
        qid, _, doc, rank, score, _ = line.split()
        run.setdefault(qid, []).append((doc, float(score)))
    return run


@pytest.fixture(scope="module")
def served(corpus):
    index = fresh_index(corpus, "idx")
    p, host, port = start(index, keys=corpus["dir"] / "keys.json")
    yield {"index": index, "port": port, "url": f"http://{host}:{port}", "proc": p}
    stop(p)


def test_served_search_equals_cli(corpus, served, tmp_path):
    out = tmp_path / "cli.trec"
    r = subprocess.run([TMS, "search", "--index", served["index"], "--queries", corpus["dir"] / "queries.npy",
                        "--out", out, "--device", "cpu", "--k", "10", "--no-progress"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cli = read_trec(out)
    c = tilemaxsim.Client(served["url"], ADMIN)
    ids, scores = c.search(corpus["queries"], k=10)  # .npy body
    # and as JSON, each query its own length
    st, _, body = raw(served["port"], "POST", "/v1/search",
                      json.dumps({"queries": corpus["queries"].astype(float).tolist(), "k": 10}),
                      {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    assert st == 200
    assert json.loads(body)["certified"] is None  # not asked to certify
    js = json.loads(body)["results"]
    for qi in range(len(corpus["queries"])):
        want = cli[str(qi)]
        assert ids[qi] == [d for d, _ in want]
        assert js[qi]["ids"] == ids[qi]
        np.testing.assert_allclose(scores[qi], [s for _, s in want], rtol=1e-4, atol=1e-4)
    # Asked to certify: each query's certification and results as the CLI's --certify.
    r = subprocess.run([TMS, "search", "--index", served["index"], "--queries", corpus["dir"] / "queries.npy",
                        "--out", tmp_path / "cert.trec", "--device", "cpu", "--k", "10", "--no-progress", "--certify",
                        "--certificates", tmp_path / "cert.tsv"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    cert = [l.split("\t")[1] for l in (tmp_path / "cert.tsv").read_text().splitlines()[1:]]
    assert set(cert) <= {"0", "1"}
    st, _, body = raw(served["port"], "POST", "/v1/search",
                      json.dumps({"queries": corpus["queries"].astype(float).tolist(), "k": 10, "certify": True}),
                      {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    assert st == 200
    assert json.loads(body)["certified"] == [c == "1" for c in cert]
    want = read_trec(tmp_path / "cert.trec")
    assert [h["ids"] for h in json.loads(body)["results"]] == [[d for d, _ in want[str(i)]] for i in range(len(cert))]
    # Adaptive (the default): each query's depth and results as the CLI's; off, no depth.
    shallow = ["--nprobe", "2", "--ncandidates", "40", "--rerank", "24"]
    r = subprocess.run([TMS, "search", "--index", served["index"], "--queries", corpus["dir"] / "queries.npy",
                        "--out", tmp_path / "adapt.trec", "--device", "cpu", "--k", "10", "--no-progress", *shallow,
                        "--certificates", tmp_path / "adapt.tsv"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    depth = [int(l.split("\t")[2]) for l in (tmp_path / "adapt.tsv").read_text().splitlines()[1:]]
    assert set(depth) <= {0, 2} and "searched again deeper" in r.stderr
    ask = {"queries": corpus["queries"].astype(float).tolist(), "k": 10, "nprobe": 2, "ncandidates": 40, "rerank": 24}
    for adaptive in (True, False):
        st, _, body = raw(served["port"], "POST", "/v1/search", json.dumps(dict(ask, adaptive=adaptive)),
                          {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
        assert st == 200
        assert json.loads(body)["depth"] == (depth if adaptive else None)
    c = tilemaxsim.Client(served["url"], ADMIN)  # .npy body: adaptive as a URL parameter
    once = subprocess.run([TMS, "search", "--index", served["index"], "--queries", corpus["dir"] / "queries.npy",
                           "--out", tmp_path / "once.trec", "--device", "cpu", "--k", "10", "--no-progress", *shallow,
                           "--no-adaptive"], capture_output=True, text=True)
    assert once.returncode == 0, once.stderr
    for adaptive, run in ((True, "adapt.trec"), (False, "once.trec")):
        want = read_trec(tmp_path / run)
        ids, _ = c.search(corpus["queries"], k=10, nprobe=2, ncandidates=40, rerank=24, adaptive=adaptive)
        assert ids == [[d for d, _ in want[str(i)]] for i in range(len(depth))], adaptive
    want = read_trec(tmp_path / "adapt.trec")
    st, _, body = raw(served["port"], "POST", "/v1/search", json.dumps(ask),
                      {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    assert [h["ids"] for h in json.loads(body)["results"]] == [[d for d, _ in want[str(i)]] for i in range(len(depth))]
    ex_ids, _ = c.search(corpus["queries"], k=5, exhaustive=True)
    assert len(ex_ids) == len(corpus["queries"]) and all(len(x) == 5 for x in ex_ids)
    info = c.info()
    assert info["n_docs"] == len(corpus["docs"]) and info["dim"] == DIM


def test_add_then_search_sees_it_delete_hides_it(corpus, tmp_path):
    index = fresh_index(corpus, "rw")
    with serving(index) as (p, url, port):
        c = tilemaxsim.Client(url)
        q = corpus["queries"][0]
        n = c.add([q.astype(np.float32)], ["new0"], metadata=[{"tenant": 2}])
        assert n == len(corpus["docs"]) + 1
        ids, _ = c.search(q, k=3)
        assert ids[0][0] == "new0"  # read-your-writes: the acknowledged document is searched
        assert c.delete(["new0"]) == 1
        ids, _ = c.search(q, k=3)
        assert "new0" not in ids[0]
        with pytest.raises(tilemaxsim.ServerError) as e:
            c.delete(["new0", "d1"])  # all or none: d1 stays
        assert e.value.status == 404 and "new0" in e.value.message
        assert c.info()["n_docs"] == len(corpus["docs"])
        with pytest.raises(tilemaxsim.ServerError) as e:
            c.add([q.astype(np.float32)], ["d3"])  # already there, no replace
        assert e.value.status in (400, 409)
        c.add([q.astype(np.float32)], ["d3"], replace=True, metadata=[{"tenant": 0}])
        assert c.search(q, k=1)[0][0] == ["d3"]


def test_documents_travel_as_binary_form_data(corpus, tmp_path):
    """Adds with a multipart/form-data body (a .npy part and a JSON part), from the Python client
    (fp16 documents) and from curl -F (float32), are searched like JSON adds; broken forms are
    400 naming the problem, and the server keeps serving."""
    from tilemaxsim.client import _form_data
    index = fresh_index(corpus, "form")
    q = corpus["queries"]
    with serving(index) as (p, url, port):
        c = tilemaxsim.Client(url)
        n0 = len(corpus["docs"])
        assert c.add([q[1], q[2][:5]], ["f1", "f2"], metadata=[{"tenant": 1}, {"tenant": 2}]) == n0 + 2
        ids, _ = c.search(q[1], k=1)
        assert ids == [["f1"]]
        ids, _, meta = c.search(q[2][:5], k=1, fields=["tenant"])
        assert ids == [["f2"]] and meta[0][0]["tenant"] == 2
        # curl: a real client's own multipart encoding
        np.save(tmp_path / "docs.npy", q[3].astype(np.float32))
        (tmp_path / "req.json").write_text(json.dumps({"doclens": [len(q[3])], "ids": ["curl1"]}))
        out = subprocess.run(["curl", "-sS", "-F", f"request=@{tmp_path / 'req.json'};type=application/json",
                              "-F", f"documents=@{tmp_path / 'docs.npy'};type=application/x-npy",
                              f"{url}/v1/documents"], capture_output=True, text=True, check=True).stdout
        assert json.loads(out)["n_docs"] == n0 + 3, out
        assert c.search(q[3], k=1)[0] == [["curl1"]]

        def npy(a):
            b = io.BytesIO()
            np.save(b, a)
            return b.getvalue()

        good_req = json.dumps({"doclens": [12], "ids": ["bad"]}).encode()
        docs = npy(q[4].astype(np.float32))
        form = lambda parts: _form_data(parts)
        body, ctype = form([("request", "application/json", good_req), ("documents", "application/x-npy", docs)])
        cases = [
            (body, "multipart/form-data", "boundary"),
            (body[: len(body) // 2], ctype, "never closes"),
            (*form([("request", "application/json", good_req)]), "documents: missing"),
            (*form([("documents", "application/x-npy", docs)]), "doclens: missing"),
            (*form([("request", "application/json", good_req), ("documents", "", docs), ("extra", "", b"x")]),
             "unknown part 'extra'"),
            (*form([("request", "", good_req), ("request", "", good_req)]), "two parts named 'request'"),
            (*form([("request", "", json.dumps({"doclens": [5], "ids": ["bad"]}).encode()), ("documents", "", docs)]),
             "add up to 5 tokens"),
            (*form([("request", "", good_req), ("documents", "", npy(q[4:5].astype(np.float32)))]), "[tokens, dim]"),
            (*form([("request", "", json.dumps({"doclens": [0], "ids": ["bad"]}).encode()), ("documents", "", docs)]),
             "doclens[0]"),
            (*form([("request", "", json.dumps({"doclens": [12], "ids": ["bad"], "k": 3}).encode()),
                    ("documents", "", docs)]), "unknown field 'k'"),
            (*form([("request", "", good_req), ("documents", "", b"\x93NUMPY garbage")]), "documents"),
            (*form([("request", "", good_req), ("documents", "", npy(q[4][:, :32].astype(np.float32)))]),
             "dimension 32"),
            (b"--xyz\r\n\r\nno headers\r\n--xyz--\r\n", "multipart/form-data; boundary=xyz", "Content-Disposition"),
        ]
        for body, ctype, needle in cases:
            st, _, data = raw(port, "POST", "/v1/documents", body, {"Content-Type": ctype})
            msg = json.loads(data)["error"]
            assert st == 400 and needle in msg and "\n" not in msg, (needle, st, msg)
        assert c.info()["n_docs"] == n0 + 3
        assert c.search(q[4], k=1)[0][0] != ["bad"]


def test_key_filter_cannot_be_escaped(corpus, served):
    t1 = tilemaxsim.Client(served["url"], T1)
    tenant = {i: m["tenant"] for i, m in zip(corpus["ids"], corpus["meta"])}
    ids, _ = t1.search(corpus["queries"], k=20)
    assert all(tenant[d] == 1 for row in ids for d in row) and sum(map(len, ids)) > 0
    for f in ["tenant = 2", "tenant = 2 OR 1 = 1", "1 = 1) OR (1 = 1"]:
        try:
            ids, _ = t1.search(corpus["queries"], k=20, filter=f)
        except ValueError:
            continue  # not an expression at all
        assert all(tenant[d] == 1 for row in ids for d in row)
    other = [i for i in corpus["ids"] if tenant[i] != 1][:50]
    ids, _ = t1.search(corpus["queries"], k=20, subset=other)
    assert all(len(row) == 0 for row in ids)
    ids, _ = t1.rerank(corpus["queries"][:2], [other, other[:5]])
    assert ids == [[], []]
    # writes: only documents of its tenant, only its own documents deleted
    doc = [corpus["queries"][1].astype(np.float32)]
    for meta in ([{"tenant": 2}], None):
        with pytest.raises(tilemaxsim.ServerError) as e:
            t1.add(doc, ["t1-new"], metadata=meta)
        assert e.value.status == 403
    with pytest.raises(tilemaxsim.ServerError) as e:
        t1.add(doc, [other[0]], replace=True, metadata=[{"tenant": 1}])
    assert e.value.status == 403
    with pytest.raises(tilemaxsim.ServerError) as e:
        t1.delete([other[0]])
    assert e.value.status == 404
    admin = tilemaxsim.Client(served["url"], ADMIN)
    assert admin.search(corpus["queries"][:1], k=1, subset=[other[0]])[0] == [[other[0]]]  # still there
    t1.add(doc, ["t1-own"], metadata=[{"tenant": 1}])
    assert t1.delete(["t1-own"]) == 1
    # keys and scopes
    with pytest.raises(tilemaxsim.ServerError) as e:
        tilemaxsim.Client(served["url"], T1_READ).delete(["d1"])
    assert e.value.status == 403
    for key in (None, "no-such-key-0123456789"):
        with pytest.raises(tilemaxsim.ServerError) as e:
            tilemaxsim.Client(served["url"], key).info()
        assert e.value.status == 401
    with pytest.raises(tilemaxsim.ServerError) as e:
        t1._request("GET", "/metrics")
    assert e.value.status == 403


def test_key_file_read_again_when_it_changes(corpus, tmp_path):
    keys = tmp_path / "keys.json"
    keys.write_text((corpus["dir"] / "keys.json").read_text())
    index = fresh_index(corpus, "keys")
    with serving(index, keys=keys) as (p, url, port):
        new = "later-key-0123456789abcdef"
        c = tilemaxsim.Client(url, new, retries=0)
        with pytest.raises(tilemaxsim.ServerError):
            c.info()
        doc = json.loads(keys.read_text())
        doc["keys"].append({"name": "later", "key": new, "scopes": ["read"]})
        keys.write_text(json.dumps(doc))
        time.sleep(1.2)
        assert c.info()["dim"] == DIM
        keys.write_text("{not json")  # a broken file keeps the keys in force
        time.sleep(1.2)
        assert c.info()["dim"] == DIM


def test_bad_requests_are_4xx_and_the_server_keeps_serving(corpus, tmp_path):
    index = fresh_index(corpus, "bad")
    with serving(index, "--max-body-mib", 1, "--max-queries", 8) as (p, url, port):
        q = corpus["queries"][:2].astype(float).tolist()
        js = {"Content-Type": "application/json"}
        npy = {"Content-Type": "application/x-npy"}

        def npy_body(a):
            b = io.BytesIO()
            np.save(b, a)
            return b.getvalue()

        nan = corpus["queries"][:1].astype(np.float32).copy()
        nan[0, 3, 5] = np.nan
        cases = [
            ("POST", "/v1/search", b"{bad json", js, 400, "JSON"),
            ("POST", "/v1/search", json.dumps({"queries": q, "kk": 3}), js, 400, "kk"),
            ("POST", "/v1/search", json.dumps({"queries": [[[1.0] * 32]]}), js, 400, "dimension"),
            ("POST", "/v1/search", json.dumps({"queries": q, "k": 0}), js, 400, "k"),
            ("POST", "/v1/search", json.dumps({"queries": q, "k": "3"}), js, 400, "k"),
            ("POST", "/v1/search", json.dumps({"queries": q, "filter": "tenant = = 1"}), js, 400, "filter"),
            ("POST", "/v1/search", json.dumps({"queries": q, "filter": "nosuch = 1"}), js, 400, "nosuch"),
            ("POST", "/v1/search", json.dumps({"queries": [[["x"] * DIM]]}), js, 400, "number"),
            ("POST", "/v1/search", json.dumps({"queries": [q[0]] * 9}), js, 400, "8"),
            ("POST", "/v1/search", b"[1, 2]", js, 400, "object"),
            ("POST", "/v1/search", npy_body(nan), npy, 400, "query 0, token 3, column 5"),
            ("POST", "/v1/search", b"\x93NUMPY\x01\x00garbage", npy, 400, "body"),
            ("POST", "/v1/search?k=abc", npy_body(corpus["queries"][:1]), npy, 400, "k"),
            ("POST", "/v1/documents", json.dumps({"documents": [q[0]], "ids": []}), js, 400, "ids"),
            ("POST", "/v1/documents", json.dumps({"documents": [q[0]], "ids": ["m1"],
                                                  "metadata": [{"tenant": 1}, {"tenant": 2}]}), js, 400, "more objects"),
            ("POST", "/v1/documents/delete", json.dumps({"ids": ["zz"]}), js, 404, "zz"),
            ("GET", "/v1/search", None, {}, 405, "POST"),
            ("GET", "/v2/nothing", None, {}, 404, "endpoint"),
        ]
        for method, path, body, headers, status, needle in cases:
            st, h, data = raw(port, method, path, body, headers)
            assert st == status, (path, body[:60] if body else None, data)
            msg = json.loads(data)["error"]
            assert needle in msg and "\n" not in msg, (needle, msg)
        # a body past --max-body-mib: 413 as soon as its length is known, read no further
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 2097152\r\n\r\n" + b"x" * 1000)
        s.settimeout(10)
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        s.close()
        assert answer.startswith(b"HTTP/1.1 413") and b"limit" in answer, answer
        # nothing above changed the index or stopped the server
        c = tilemaxsim.Client(url)
        assert c.info()["n_docs"] == len(corpus["docs"])
        assert len(c.search(corpus["queries"][:1], k=3)[0][0]) == 3
        # a client that disconnects in the middle of a body
        s = socket.create_connection(("127.0.0.1", port))
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{")
        s.close()
        assert c.info()["n_docs"] == len(corpus["docs"])


def test_idle_and_slow_clients_hold_no_worker(corpus, tmp_path):
    index = fresh_index(corpus, "idle")
    with serving(index, "--workers", 2, "--read-timeout-s", 2) as (p, url, port):
        idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(1000)]
        slow = socket.create_connection(("127.0.0.1", port))
        slow.sendall(b"POST /v1/search HTTP/1.1\r\nHost: x\r\n")  # and never the rest
        c = tilemaxsim.Client(url)
        t0 = time.time()
        for _ in range(5):
            assert len(c.search(corpus["queries"][:1], k=3)[0][0]) == 3
        assert time.time() - t0 < 10
        slow.settimeout(10)
        assert slow.recv(100) == b""  # cut off after the read timeout
        for s in idle + [slow]:
            s.close()


def test_overload_is_503_with_retry_after(corpus, tmp_path):
    index = fresh_index(corpus, "busy")
    with serving(index, "--workers", 1, "--queue", 1) as (p, url, port):
        body = json.dumps({"queries": corpus["queries"].astype(float).tolist(), "k": 10, "exhaustive": True})
        results = []

        def one():
            results.append(raw(port, "POST", "/v1/search", body, {"Content-Type": "application/json"}))

        threads = [threading.Thread(target=one) for _ in range(24)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        codes = sorted(st for st, _, _ in results)
        assert set(codes) <= {200, 503} and 200 in codes and 503 in codes, codes
        assert all(h.get("Retry-After") == "1" for st, h, _ in results if st == 503)
        # the client retries a 503 with back-off
        c = tilemaxsim.Client(url)
        assert len(c.search(corpus["queries"][:1], k=3)[0][0]) == 3


def test_sigterm_finishes_requests_in_flight(corpus, tmp_path):
    index = fresh_index(corpus, "term")
    p, host, port = start(index, "--workers", 2)
    body = json.dumps({"queries": corpus["queries"].astype(float).tolist(), "k": 10, "exhaustive": True})
    results = []

    def one():
        try:
            results.append(raw(port, "POST", "/v1/search", body, {"Content-Type": "application/json"})[0])
        except OSError as e:  # not yet accepted when the listener closed
            results.append(str(e))

    threads = [threading.Thread(target=one) for _ in range(6)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    for t in threads:
        t.join()
    assert p.wait(30) == 0
    assert results.count(200) >= 1 and all(r == 200 or isinstance(r, str) for r in results), results


def test_kill_9_loses_no_acknowledged_write(corpus, tmp_path):
    index = fresh_index(corpus, "kill")
    p, host, port = start(index)
    c = tilemaxsim.Client(f"http://{host}:{port}", retries=0)
    acked = []
    stop_flag = threading.Event()

    def writer():
        i = 0
        while not stop_flag.is_set():
            try:
                c.add([corpus["queries"][i % 16].astype(np.float32)], [f"k{i}"], metadata=[{"tenant": 0}])
                acked.append(f"k{i}")
            except Exception:
                return
            i += 1

    t = threading.Thread(target=writer)
    t.start()
    time.sleep(2.0)
    p.kill()
    p.wait()
    stop_flag.set()
    t.join()
    assert acked, "no write was acknowledged in 2 s"
    s = tilemaxsim.Searcher(index, device="cpu")
    assert s.info["n_docs"] >= len(corpus["docs"]) + len(acked)
    got, _ = s.search(corpus["queries"][:1], k=1, subset=acked, exhaustive=True)
    assert got[0], "the acknowledged documents are not searchable"
    vec = s.document_vectors(acked)
    assert len(vec) == len(acked)


def test_hits_carry_the_metadata_asked_for(corpus, served):
    c = tilemaxsim.Client(served["url"], ADMIN)
    tenant = {i: m["tenant"] for i, m in zip(corpus["ids"], corpus["meta"])}
    ids, scores, meta = c.search(corpus["queries"][:3], k=5, fields=["tenant"])
    for row, mrow in zip(ids, meta):
        assert [m["tenant"] for m in mrow] == [tenant[d] for d in row]
    ids, _, meta = c.search(corpus["queries"][:1], k=2, fields=[])  # every column, and as JSON too
    assert all("tenant" in m for m in meta[0])
    st, _, body = raw(served["port"], "POST", "/v1/search",
                      json.dumps({"queries": corpus["queries"][:1].astype(float).tolist(), "k": 2, "fields": ["id"]}),
                      {"Authorization": f"Bearer {ADMIN}", "Content-Type": "application/json"})
    r = json.loads(body)["results"][0]
    assert st == 200 and [m["id"] for m in r["metadata"]] == r["ids"]
    with pytest.raises(ValueError, match="nosuch"):
        c.search(corpus["queries"][:1], k=2, fields=["nosuch"])


def test_concurrent_writes_commit_together(corpus, tmp_path):
    index = fresh_index(corpus, "group")
    with serving(index) as (p, url, port):
        c = tilemaxsim.Client(url)
        before = c.info()["writes"]
        errors = []

        def add(i):
            try:
                c2 = tilemaxsim.Client(url)
                c2.add([corpus["queries"][i % 16].astype(np.float32)], [f"g{i}"], metadata=[{"tenant": 0}])
            except Exception as e:  # noqa: BLE001
                errors.append(e)

        threads = [threading.Thread(target=add, args=(i,)) for i in range(32)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        info = c.info()
        assert info["n_docs"] == len(corpus["docs"]) + 32
        assert info["writes"] - before < 32  # several writes shared one commit and one new searcher
        ids, _ = c.search(corpus["queries"][:1], k=32, subset=[f"g{i}" for i in range(32)], exhaustive=True)
        assert sorted(ids[0]) == sorted(f"g{i}" for i in range(32))
        # one write of a group that fails fails alone
        bad = []

        def add_dup(i):
            try:
                tilemaxsim.Client(url).add([corpus["queries"][0].astype(np.float32)],
                                                               ["g0" if i == 0 else f"h{i}"])
            except tilemaxsim.ServerError as e:
                bad.append(e.status)

        threads = [threading.Thread(target=add_dup, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(bad) == 1 and bad[0] in (400, 409)
        assert c.info()["n_docs"] == len(corpus["docs"]) + 32 + 7
        # Each group refreshed the searcher in service (the added documents beside the loaded
        # ones): it searches as a searcher opened now does.
        c.delete([f"g{i}" for i in range(0, 32, 5)] + ["d2"])
        fresh = tilemaxsim.Searcher(index, "cpu")
        for kw in ({}, {"k": 20, "nprobe": 2, "ncandidates": 40, "rerank": 20}, {"k": 5, "exhaustive": True}):
            (a_ids, a_scores), (b_ids, b_scores) = c.search(corpus["queries"], **kw), fresh.search(corpus["queries"], **kw)
            assert a_ids == b_ids, kw
            for x, y in zip(a_scores, b_scores):
                np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-5)


def _required(schema, spec):
    if "$ref" in schema:
        name = schema["$ref"].split("/")[-1]
        schema = spec["components"]["schemas"][name]
    return schema.get("required", [])


def test_the_server_answers_what_openapi_json_says(corpus, served):
    """Every path and method of the document answered with a documented status, each answer
    holding the properties its schema requires; the document the server serves is the file."""
    root = os.path.join(os.path.dirname(__file__), "..", "..", "server", "openapi.json")
    spec = json.load(open(root))
    st, _, body = raw(served["port"], "GET", "/openapi.json")
    assert st == 200 and json.loads(body) == spec
    q = corpus["queries"][:1].astype(float).tolist()
    bodies = {
        "/v1/search": {"queries": q, "k": 3},
        "/v1/rerank": {"queries": q, "candidates": [["d1", "d2"]]},
        "/v1/documents": {"documents": [q[0]], "ids": ["api-doc"], "metadata": [{"tenant": 1}]},
        "/v1/documents/delete": {"ids": ["api-doc"]},
    }
    auth = {"Authorization": f"Bearer {ADMIN}"}
    seen = 0
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            body = json.dumps(bodies[path]) if path in bodies else None
            headers = dict(auth, **({"Content-Type": "application/json"} if body else {}))
            st, h, data = raw(served["port"], method.upper(), path, body, headers)
            assert str(st) in op["responses"], (path, st, data)
            content = op["responses"][str(st)].get("content", {})
            if "application/json" in content:
                got = json.loads(data)
                for prop in _required(content["application/json"]["schema"], spec):
                    assert prop in got, (path, prop, got)
            seen += 1
            # and without a key, where one is needed: 401 as documented
            if op.get("security", spec.get("security")):
                st, _, data = raw(served["port"], method.upper(), path, body,
                                  {"Content-Type": "application/json"} if body else {})
                assert st == 401 and "error" in json.loads(data)
    assert seen == sum(len(m) for m in spec["paths"].values()) >= 9


def test_python_serve_starts_and_stops_a_server(corpus, tmp_path):
    index = fresh_index(corpus, "py")
    log = io.StringIO()
    with tilemaxsim.serve(index, port=0, device="cpu", workers=4, log=log) as server:
        c = server.client()
        ids, scores = c.search(corpus["queries"][:2], k=4)
        assert len(ids) == 2 and all(len(r) == 4 for r in ids) and scores[0].dtype == np.float32
        assert c.info()["n_docs"] == len(corpus["docs"])
    assert server.proc.returncode == 0
    assert "listening on" in log.getvalue()


def test_compaction_swaps_in_without_a_failed_search(corpus, tmp_path):
    index = fresh_index(corpus, "compact")
    with serving(index) as (p, url, port):
        c = tilemaxsim.Client(url, retries=0)
        gone = corpus["ids"][:100]
        assert c.delete(gone) == 100
        assert c.info()["n_deleted"] == 100
        before, _ = c.search(corpus["queries"], k=10, exhaustive=True)
        failures, searched = [], [0]
        done = threading.Event()

        def search_loop():
            c2 = tilemaxsim.Client(url, retries=0)
            while not done.is_set():
                try:
                    ids, _ = c2.search(corpus["queries"][:4], k=10)
                    assert not set(gone) & {d for row in ids for d in row}
                    searched[0] += 1
                except Exception as e:  # noqa: BLE001
                    failures.append(e)

        t = threading.Thread(target=search_loop)
        t.start()
        st, _, body = raw(port, "POST", "/v1/compact")
        done.set()
        t.join()
        assert st == 200 and json.loads(body)["n_deleted"] == 0, body
        assert not failures and searched[0] > 0
        info = c.info()
        assert info["n_docs"] == len(corpus["docs"]) - 100 and info["n_deleted"] == 0
        after, _ = c.search(corpus["queries"], k=10, exhaustive=True)
        assert after == before  # the same documents, renumbered


def test_metrics_are_prometheus_text(corpus, served):
    c = tilemaxsim.Client(served["url"], ADMIN)
    c.search(corpus["queries"][:2], k=3)
    text = c._request("GET", "/metrics")
    types = [l.split()[2] for l in text.splitlines() if l.startswith("# TYPE ")]
    assert len(types) == len(set(types)), "a metric typed twice"
    samples = {l.split("{")[0].split()[0]: l for l in text.splitlines() if l and not l.startswith("#")}
    for name in ("tms_requests_total", "tms_request_seconds_bucket", "tms_search_stage_seconds_count",
                 "tms_search_queue_depth", "tms_index_documents", "tms_shard_bytes", "tms_connections_open"):
        assert name in samples, name
    for line in text.splitlines():
        if line and not line.startswith("#"):
            float(line.rsplit(" ", 1)[1])  # every sample's value is a number


def test_bench_serve_measures_served_and_in_process(corpus, tmp_path):
    """tms bench serve: a row per client count, served and in-process queries/s, with the writer
    row too; the writer's documents are gone after."""
    index = fresh_index(corpus, "bench")
    out = tmp_path / "serve.json"
    r = subprocess.run([TMS, "bench", "serve", "--index", str(index), "--queries", str(corpus["dir"] / "queries.npy"),
                        "--device", "cpu", "--clients", "1,4", "--seconds", "0.5", "--writer-rate", "4",
                        "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    j = json.loads(out.read_text())
    rows = j["rows"]
    served = [(x["clients"], x["writer_docs_per_s"] > 0) for x in rows if x["kind"] == "served"]
    assert served == [(1, False), (4, False), (1, True), (4, True)], rows
    assert sorted(x["clients"] for x in rows if x["kind"] == "in_process") == [1, 4], rows
    for x in rows:
        assert x["qps"] > 0 and x["answered"] > 0 and not x["errors"] and x["p99_ms"] >= x["p50_ms"] > 0, x
    assert j["writes_acknowledged"] > 0
    assert set(j["write_error_answers"]) == set(j["write_errors"])  # each failure's first answer, kept
    with serving(index) as (p, url, port):
        assert tilemaxsim.Client(url).info()["n_docs"] == len(corpus["docs"])


def test_recall_estimate_follows_the_queries_served(corpus, tmp_path):
    """The server keeps a sample of the queries it serves (--record-queries) across the searchers
    that writes open, and once --recalibrate-after more were served and it is idle, measures the
    recall estimate on them; the default search then plans from it, and no write is counted."""
    index = fresh_index(corpus, "calib")
    q = corpus["queries"]
    with serving(index, "--record-queries", 20, "--recalibrate-after", 24, "--recalibrate-idle-ms", 100) as (
            p, url, port):
        c = tilemaxsim.Client(url)
        info = c.info()
        assert info["queries_recorded"] == 0 and info["writes"] == 0
        assert info["estimate"] is None or info["estimate"]["source"] == "pseudo-queries", info
        first = c.search(q[:12], k=5)
        c.add([q[0]], ["calib-new"])  # a new searcher, the same sample
        c.search(q[4:16], k=5)
        deadline = time.time() + 60
        while (info := c.info())["estimate"] is None or info["estimate"]["source"] != "sample":
            assert time.time() < deadline, info
            time.sleep(0.1)
        assert info["queries_recorded"] == 24 and info["estimate"]["queries"] == 20, info
        assert info["writes"] == 1, info
        stored = json.loads((index / "estimate.json").read_text())
        assert stored["sample"] is True and stored["queries"] == 20
        d = info["default_search"]
        assert d["nprobe"] >= 1 and d["rerank"] >= 0, d
        # searches after the measurement answer as before (the document added aside)
        again = c.search(q[:12], k=5)
        for a, b in zip(first[0], again[0]):
            assert [x for x in b if x != "calib-new"] == a[: len([x for x in b if x != "calib-new"])]
        # the measurement's own searches were not recorded as served queries
        assert c.info()["queries_recorded"] == 36


def test_reads_past_the_request_timeout_are_504_and_writes_have_none(corpus, tmp_path):
    """--request-timeout-ms: a search not answered in time gets 504 then (one JSON line), the
    server goes on serving; a write, slower than the timeout, still gets its outcome."""
    index = fresh_index(corpus, "deadline")
    with serving(index, "--request-timeout-ms", 1, "--workers", 1) as (p, url, port):
        big = np.repeat(corpus["queries"], 16, axis=0)  # 256 queries: far more than a millisecond
        b = io.BytesIO()
        np.save(b, big)
        t0 = time.time()
        st, _, data = raw(port, "POST", "/v1/search?k=10&exhaustive=true", b.getvalue(),
                          {"Content-Type": "application/x-npy"})
        assert st == 504 and "--request-timeout-ms" in json.loads(data)["error"], (st, data[:200])
        assert time.time() - t0 < 5
        c = tilemaxsim.Client(url)
        assert c.add([corpus["queries"][0]], ["late-doc"]) == len(corpus["docs"]) + 1  # no timeout for writes
        assert c.info()["n_docs"] == len(corpus["docs"]) + 1
        st, _, text = raw(port, "GET", "/metrics")
        assert 'tms_requests_total{route="/v1/search",code="504"} 1' in text.decode(), text.decode()[:2000]


def test_sigterm_stops_a_recall_measurement_in_progress(tmp_path):
    """A measurement on the served queries that runs when SIGTERM comes ends at its next step:
    the server exits 0 in seconds, not after the whole measurement, and stores nothing."""
    rng = np.random.default_rng(7)
    docs = [unit(rng.standard_normal((n, DIM)).astype(np.float32)) for n in rng.integers(20, 60, size=3000)]
    index = tmp_path / "slow"
    tilemaxsim.build_index(index, docs, [f"s{i}" for i in range(len(docs))], keep_vectors=True, n_centroids=64,
                           estimate=False)
    p, host, port = start(index, "--record-queries", 400, "--recalibrate-after", 400, "--recalibrate-idle-ms", 50)
    c = tilemaxsim.Client(f"http://{host}:{port}")
    q = unit(rng.standard_normal((400, 16, DIM)).astype(np.float32))
    for i in range(0, 400, 8):
        c.search(list(q[i:i + 8]), k=10)
    time.sleep(1.5)  # idle: the measurement (an exhaustive search, then the ladder) has started
    t0 = time.time()
    p.terminate()
    assert p.wait(30) == 0
    assert time.time() - t0 < 10, time.time() - t0
    assert not (index / "estimate.json").exists()


def test_bm25_and_hybrid_served_as_in_process_and_bound_by_keys(corpus, tmp_path):
    """mode bm25 and hybrid through the server (JSON texts, .npy with text parameters, no
    embeddings for bm25) give the in-process searcher's results; a tenant's key binds both."""
    words = "maxsim token vector search index query engine gpu recall hybrid rank shard".split()
    rng = np.random.default_rng(9)
    texts = [" ".join(rng.choice(words, size=6)) for _ in corpus["docs"]]
    index = tmp_path / "text"
    # Token t of a document spans its text's word t % 6 (a stand-in for a tokenizer's offsets).
    spans = [[[sum(len(w) + 1 for w in t.split()[:j % 6]), sum(len(w) + 1 for w in t.split()[:j % 6]) +
               len(t.split()[j % 6])] for j in range(len(d))] for d, t in zip(corpus["docs"], texts)]
    tilemaxsim.build_index(index, corpus["docs"], corpus["ids"], keep_vectors=True, n_centroids=64,
                           estimate=False, text_field="text", spans_field="spans",
                           metadata=[dict(m, text=t, spans=sp) for m, t, sp in zip(corpus["meta"], texts, spans)])
    q, qt = corpus["queries"], [" ".join(rng.choice(words, size=2)) for _ in range(len(corpus["queries"]))]
    s = tilemaxsim.Searcher(index, "cpu")
    with serving(index, keys=corpus["dir"] / "keys.json") as (p, url, port):
        c = tilemaxsim.Client(url, ADMIN)
        for mode in ("bm25", "hybrid"):
            want = s.search(q, k=8, mode=mode, texts=qt)
            got = c.search(q, k=8, mode=mode, texts=qt)  # .npy body, texts as parameters
            assert got[0] == want[0], mode
            for x, y in zip(got[1], want[1]):
                np.testing.assert_allclose(x, y, rtol=1e-5)
        assert c.search(None, k=8, mode="bm25", texts=qt)[0] == s.search(None, k=8, mode="bm25", texts=qt)[0]
        ids, _, why = c.search(q, k=4, explain=True)  # explanations as in process
        want = s.explain(q, ids)
        for x, y in zip(why, want):
            for a, b in zip(x, y):
                np.testing.assert_array_equal(a["doc_tokens"], b["doc_tokens"])
                np.testing.assert_allclose(a["similarities"], b["similarities"], atol=1e-5)
                np.testing.assert_array_equal(a["spans"], b["spans"])  # the passages matched
                assert b["spans"].shape == (q.shape[1], 2)
        t1 = tilemaxsim.Client(url, T1_READ)
        for mode in ("bm25", "hybrid"):
            ids, _ = t1.search(q, k=8, mode=mode, texts=qt)
            assert ids == s.search(q, k=8, mode=mode, texts=qt, filter="tenant = 1")[0], mode
            assert all(int(d[1:]) % 3 == 1 for x in ids for d in x)
        with pytest.raises(ValueError, match="texts: 2 for 16 queries"):  # a 400
            c.search(q, k=8, mode="hybrid", texts=qt[:2])
        with pytest.raises(ValueError, match="expected maxsim, bm25 or hybrid"):
            c.search(q, k=8, mode="lexical", texts=qt)
