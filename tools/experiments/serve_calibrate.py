"""Serves queries to a running `tms serve` one per request (a .npy body each), then waits until the
server has measured its recall estimate on them (GET /v1/info: "estimate": {"source": "sample"})
and prints the default search's settings before and after. Standard library and numpy only.

Usage: serve_calibrate.py URL QUERIES.npy [N (1000)] [TIMEOUT_S (300)]"""
import io
import json
import sys
import time
import urllib.request

import numpy as np


def get(url):
    with urllib.request.urlopen(url, timeout=60) as r:
        return json.loads(r.read())


def main():
    url, path = sys.argv[1].rstrip("/"), sys.argv[2]
    n = int(sys.argv[3]) if len(sys.argv) > 3 else 1000
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 else 300
    q = np.load(path, mmap_mode="r")
    before = get(url + "/v1/info")
    print("before:", json.dumps(before.get("estimate")), json.dumps(before["default_search"]), flush=True)
    t0 = time.time()
    for i in range(n):
        b = io.BytesIO()
        np.save(b, np.ascontiguousarray(q[i % len(q)]))
        req = urllib.request.Request(url + "/v1/search?k=10", b.getvalue(), {"Content-Type": "application/x-npy"})
        with urllib.request.urlopen(req, timeout=60) as r:
            r.read()
    print(f"served {n} queries in {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    while True:
        info = get(url + "/v1/info")
        if (info.get("estimate") or {}).get("source") == "sample" and info["estimate"]["queries"] >= min(n, 1000):
            break
        if time.time() - t0 > timeout:
            sys.exit(f"no estimate from the served queries after {timeout} s: {info}")
        time.sleep(0.5)
    print(f"measured after {time.time() - t0:.1f} s of waiting", flush=True)
    print("after:", json.dumps(info["estimate"]), json.dumps(info["default_search"]), flush=True)


if __name__ == "__main__":
    main()
