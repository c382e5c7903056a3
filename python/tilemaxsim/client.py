"""A client of `tms serve` (Client) and a way to start one from Python (serve).

Client has the call shapes of Searcher: search() returns (ids, scores), per query a list of
external ids and a float32 array of scores, best first; add(), delete(), info(). Queries travel
as a .npy body and documents as a .npy part of a form (binary); a busy server (503) is retried
with back-off."""
from __future__ import annotations

import http.client
import io
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.parse

import numpy as np

__all__ = ["Client", "ServerError", "Server", "serve"]


class ServerError(RuntimeError):
    """An error answer of the server: .status (the HTTP status) and the server's message."""

    def __init__(self, status, message):
        super().__init__(f"{status}: {message}")
        self.status = status
        self.message = message


class Client:
    """A connection to `tms serve` at `url` ("http://host:port"). api_key: sent as a Bearer token.
    model: an encoder with PyLate's encode(texts, is_query=...) for search_text() and add(texts=).
    retries: how often a 503 (busy, or the index still loading) is tried again, waiting
    Retry-After or a doubling back-off; timeout: seconds a request may take."""

    def __init__(self, url, api_key=None, *, model=None, timeout=60.0, retries=8):
        u = urllib.parse.urlsplit(url if "://" in url else "http://" + url)
        if u.scheme != "http":
            raise ValueError(f"url: only http:// is supported, got {url!r}")
        self.host, self.port = u.hostname, u.port or 80
        self.api_key, self.model, self.timeout, self.retries = api_key, model, float(timeout), int(retries)
        self._local = threading.local()

    def _conn(self, fresh=False):
        c = getattr(self._local, "conn", None)
        if c is None or fresh:
            if c is not None:
                c.close()
            c = self._local.conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return c

    def _request(self, method, path, body=None, content_type="application/json"):
        headers = {"Content-Type": content_type} if body is not None else {}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        delay = 0.05
        for attempt in range(self.retries + 1):
            try:
                c = self._conn()
                c.request(method, path, body=body, headers=headers)
                r = c.getresponse()
                data = r.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                # A keep-alive connection the server closed (idle timeout): once more, fresh.
                self._conn(fresh=True)
                if attempt == self.retries:
                    raise
                time.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            if r.status == 503 and attempt < self.retries:
                wait = r.getheader("Retry-After")
                time.sleep(min(float(wait), 5.0) if wait and wait.isdigit() else delay)
                delay = min(delay * 2, 2.0)
                continue
            if r.status >= 400:
                try:
                    message = json.loads(data)["error"]
                except (ValueError, KeyError, TypeError):
                    message = data.decode(errors="replace")
                if r.status == 400:
                    raise ValueError(message)
                raise ServerError(r.status, message)
            if r.getheader("Content-Type", "").startswith("application/json"):
                return json.loads(data)
            return data.decode()

    def info(self):
        """What the index holds: n_docs, n_tokens, dim, codec, has_vectors, metadata_columns, ..."""
        return self._request("GET", "/v1/info")

    def ready(self):
        """True once the server's index is open."""
        try:
            return bool(self._request("GET", "/ready").get("ready"))
        except ServerError:
            return False

    def search(self, queries, k=None, *, exhaustive=False, nprobe=None, ncandidates=None, rerank=None,
               pruning=None, filter=None, subset=None, target_recall=None, fields=None, mode=None, texts=None,
               fusion=None, bm25_weight=None, lexical_candidates=None, explain=False, adaptive=None):
        """The k best documents of each query, as Searcher.search (None: the server's defaults;
        mode "bm25" or "hybrid" with texts=, one str per query, as there; bm25 may leave queries
        None). fields: metadata columns to return with each hit (an empty list: all of them); then
        the result is (ids, scores, metadata), metadata per query a list of dicts. explain: the
        result ends with the hits' explanations, as Searcher.explain returns them. adaptive=False:
        every query at the estimate's setting (Searcher.search's adaptive)."""
        from . import _queries
        params = {"k": k, "nprobe": nprobe, "ncandidates": ncandidates, "rerank": rerank, "pruning": pruning,
                  "target_recall": target_recall, "filter": filter, "mode": mode, "fusion": fusion,
                  "bm25_weight": bm25_weight, "lexical_candidates": lexical_candidates,
                  "adaptive": None if adaptive is None else bool(adaptive)}
        if explain:
            params["explain"] = True
        if texts is not None:
            texts = [texts] if isinstance(texts, str) else [str(t) for t in texts]
        if queries is None:  # BM25 alone: the texts, as JSON
            body = {n: v for n, v in params.items() if v is not None}
            body.update(texts=texts or [], **({"exhaustive": True} if exhaustive else {}))
            if subset is not None:
                body["subset"] = [subset] if isinstance(subset, (str, int, np.integer)) else [str(x) for x in subset]
            if fields is not None:
                body["fields"] = [fields] if isinstance(fields, str) else [str(f) for f in fields]
            return self._results(self._request("POST", "/v1/search", json.dumps(body)), fields, explain)
        q, dtype, lens = _queries(queries)
        params = {n: v for n, v in params.items() if v is not None}
        if exhaustive:
            params["exhaustive"] = True
        if subset is not None:
            params["subset"] = [subset] if isinstance(subset, (str, int, np.integer)) else [str(x) for x in subset]
        if fields is not None:
            params["fields"] = [fields] if isinstance(fields, str) else [str(f) for f in fields]
        if lens is not None:  # ragged queries: their own lengths, as JSON
            out = self._request("POST", "/v1/search", json.dumps(
                {"queries": [q[i, :n].astype(np.float32).tolist() for i, n in enumerate(lens)], **params,
                 **({"texts": texts} if texts is not None else {})}))
        else:
            if dtype == "bf16":  # a numpy .npy cannot say bfloat16: send float32
                q = (q.astype(np.uint32) << 16).view(np.float32)
            buf = io.BytesIO()
            np.save(buf, np.ascontiguousarray(q), allow_pickle=False)
            lists = ("subset", "fields")
            query = urllib.parse.urlencode(
                [(n, str(v).lower() if isinstance(v, bool) else str(v)) for n, v in params.items() if n not in lists]
                + [("subset", str(x)) for x in params.get("subset", [])]
                + [("fields", f) for f in params.get("fields", [])]
                + [("text", t) for t in (texts or [])]
                + ([("fields", "")] if fields is not None and not params["fields"] else []))
            out = self._request("POST", "/v1/search?" + query, buf.getvalue(), "application/x-npy")
        return self._results(out, fields, explain)

    @staticmethod
    def _results(out, fields, explain):
        """(ids, scores[, metadata][, explanations]) of a search's answer."""
        res = out["results"]
        r = ([x["ids"] for x in res], [np.asarray(x["scores"], dtype=np.float32) for x in res])
        if fields is not None:
            r += ([x["metadata"] for x in res],)
        if explain:
            r += ([[{"doc_tokens": np.asarray(e["doc_tokens"], dtype=np.int32),
                     "similarities": np.asarray(e["similarities"], dtype=np.float32),
                     "from_codes": e["from_codes"],
                     "spans": np.asarray(e["spans"], dtype=np.int32).reshape(-1, 2) if "spans" in e else None}
                    for e in x["explanations"]] for x in res],)
        return r

    def search_text(self, queries, k=None, **options):
        """search() of query texts encoded by this client's model."""
        from . import encode
        if self.model is None:
            raise ValueError("search_text needs Client(..., model=...)")
        return self.search(encode(self.model, queries, is_query=True), k, **options)

    def rerank(self, queries, candidate_ids, k=0):
        """Exact MaxSim of each query's candidates (external ids), best first; ids the index does
        not hold (or the key may not see) are left out."""
        from . import _queries
        q, _, lens = _queries(queries)
        qs = [q[i, : (lens[i] if lens is not None else q.shape[1])].astype(np.float32).tolist() for i in range(len(q))]
        out = self._request("POST", "/v1/rerank", json.dumps(
            {"queries": qs, "candidates": [[str(x) for x in c] for c in candidate_ids], "k": int(k)}))
        return ([r["ids"] for r in out["results"]],
                [np.asarray(r["scores"], dtype=np.float32) for r in out["results"]])

    def add(self, documents=None, ids=None, lengths=None, *, texts=None, replace=False, metadata=None):
        """Adds documents (a list of [tokens, dim] arrays, or one array with lengths=; or texts=
        with the client's model) with their external ids and optional metadata dicts. Returns when
        they are durable and visible to every later search; returns the documents now live."""
        from . import _documents, _ids, encode
        if texts is not None:
            if self.model is None:
                raise ValueError("texts= needs Client(..., model=...)")
            documents = encode(self.model, texts, is_query=False)
        tokens, dtype, lens = _documents(documents, lengths)
        if dtype == "bf16":  # a numpy .npy cannot say bfloat16: send float32
            tokens = (tokens.astype(np.uint32) << 16).view(np.float32)
        request = {"doclens": [int(n) for n in lens], "ids": _ids(ids, "ids"), "replace": bool(replace)}
        if metadata is not None:
            request["metadata"] = list(metadata)
        buf = io.BytesIO()
        np.save(buf, np.ascontiguousarray(tokens), allow_pickle=False)
        body, content_type = _form_data([("request", "application/json", json.dumps(request).encode()),
                                         ("documents", "application/x-npy", buf.getvalue())])
        return self._request("POST", "/v1/documents", body, content_type)["n_docs"]

    def delete(self, ids):
        """Deletes documents by external id, all or none (ServerError 404 when one is not there);
        returns how many it deleted."""
        from . import _ids
        return self._request("POST", "/v1/documents/delete", json.dumps({"ids": _ids(ids, "ids")}))["deleted"]

    def close(self):
        c = getattr(self._local, "conn", None)
        if c is not None:
            c.close()
            self._local.conn = None


def _form_data(parts):
    """A multipart/form-data body of (name, content type, bytes) parts, and its Content-Type."""
    data = b"".join(p for _, _, p in parts)
    boundary = "tms-" + os.urandom(16).hex()
    while boundary.encode() in data:  # (never, in practice)
        boundary = "tms-" + os.urandom(16).hex()
    out = []
    for name, ctype, payload in parts:
        out += [f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n'
                f"Content-Type: {ctype}\r\n\r\n".encode(), payload, b"\r\n"]
    out.append(f"--{boundary}--\r\n".encode())
    return b"".join(out), f"multipart/form-data; boundary={boundary}"


def _tms_binary():
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin", "tms")
    for exe in (os.environ.get("TMS_BIN"), here, shutil.which("tms")):
        if exe and os.access(exe, os.X_OK):
            return exe
    raise FileNotFoundError("tms is not installed beside tilemaxsim (set TMS_BIN to the tms binary)")


class Server:
    """A `tms serve` process started by serve(): .url, .client(), .stop(); a context manager."""

    def __init__(self, proc, url, log):
        self.proc, self.url, self._log = proc, url, log

    def client(self, api_key=None, **kw):
        return Client(self.url, api_key, **kw)

    def stop(self, timeout=30):
        """SIGTERM: the server finishes the requests in flight, then exits."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def serve(index, *, host="127.0.0.1", port=0, api_keys=None, device="auto", wait=60.0, log=None, **options):
    """Starts `tms serve --index INDEX` (options as its flags: workers=64, queue=256,
    batch_wait_us=0, ...) and returns a Server once its index is open (wait: seconds; None: at
    once). port 0 picks a free port. The server's log goes to `log` (a file object; default
    stderr)."""
    args = [_tms_binary(), "serve", "--index", str(index), "--host", host, "--port", str(int(port)),
            "--device", device]
    if api_keys:
        args += ["--api-keys", str(api_keys)]
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            args.append(flag)
        elif value not in (False, None):
            args += [flag, str(value)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = None
    for line in proc.stderr:
        (log or sys.stderr).write(line)
        if "listening on " in line:
            url = line.split("listening on ")[1].split()[0].rstrip("/")
            break
    if url is None:
        proc.wait()
        raise RuntimeError(f"tms serve exited with status {proc.returncode} before listening")
    out = log or sys.stderr
    threading.Thread(target=lambda: [out.write(l) for l in proc.stderr], daemon=True).start()
    server = Server(proc, url, log)
    deadline = time.monotonic() + (wait or 0)
    c = server.client(retries=0)
    while wait and not c.ready():
        if proc.poll() is not None or time.monotonic() > deadline:
            server.stop()
            raise RuntimeError(f"tms serve did not get ready in {wait} s (status {proc.returncode})")
        time.sleep(0.05)
    c.close()
    return server
