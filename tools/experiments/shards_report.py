"""Summarises shards_1m.sh (its run helpers are shared with the CLI tests): per shard count,
queries/s, latency, open time, recall@10 against the exhaustive run, and whether the run equals
the first count's run (same documents in the same
order, scores within 1e-5 relative). Usage: shards_report.py OUTDIR COUNT..."""
import json
import re
import sys
from pathlib import Path


def read_run(path):
    run = {}
    for line in Path(path).read_text().splitlines():
        q, _, d, _, s, _ = line.split()
        run.setdefault(q, []).append((d, float(s)))
    return run


def recall(run, exact, k=10):
    """Mean over the exact run's queries of |top-k of run & top-k of exact| / |top-k of exact|."""
    r = [len({d for d, _ in run.get(q, [])[:k]} & {d for d, _ in e[:k]}) / max(1, len(e[:k])) for q, e in exact.items()]
    return sum(r) / len(r)


def same(a, b):
    if a.keys() != b.keys():
        return False
    for q in a:
        if [d for d, _ in a[q]] != [d for d, _ in b[q]]:
            return False
        if any(abs(x - y) > 1e-5 * max(1.0, abs(x)) for (_, x), (_, y) in zip(a[q], b[q])):
            return False
    return True


def main():
    out, counts = Path(sys.argv[1]), sys.argv[2:]
    base = None
    rows = []
    for n in counts:
        run = read_run(out / f"run-{n}.trec")
        base = base or run
        t = (out / f"search-{n}.txt").read_text()
        secs = float(re.search(r"queries in ([\d.]+) s", t).group(1))
        wall = float(re.search(r"wall ([\d.]+)", t).group(1))
        bench = json.loads((out / f"bench-{n}.json").read_text())["rows"][0]
        idx = (out / f"index-{n}.txt").read_text()
        row = {"shards": int(n), "batch_qps": bench["batch_qps"], "p50_ms": bench["p50_ms"], "p99_ms": bench["p99_ms"],
               "concurrent_qps_64": bench["concurrent_qps_64"], "recall_at_10": bench["recall_at_10"],
               "same_as_first": same(base, run), "open_s": round(wall - secs, 2),
               "build_s": float(re.search(r"build_s ([\d.]+)", idx).group(1)),
               "index_bytes": int((out / f"bytes-{n}.txt").read_text())}
        for step in ("read (total)", "segments", "gpu upload and warm-up"):
            m = re.findall(r"load " + re.escape(step) + r": ([\d.]+)", t)
            row[step.split(" (")[0].replace(" ", "_") + "_s"] = sum(float(x) for x in m)
        rows.append(row)
    print(json.dumps({"gpu": (out / "gpu.txt").read_text().strip(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
