"""Summarises shards_1m.sh (its run helpers are shared with the CLI tests): per shard count, queries/s, open time, recall@10 against the
exhaustive run, and whether the run equals the one-shard run (same documents in the same
order, scores within 1e-5 relative). Usage: shards_report.py DATADIR OUTDIR COUNT..."""
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
    data, out, counts = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
    exact = read_run(data / "exact.trec")
    base = None
    rows = []
    for n in counts:
        run = read_run(data / f"run-{n}.trec")
        base = base or run
        best = None
        for rep in (1, 2):
            t = (out / f"search-{n}-{rep}.txt").read_text()
            qps = float(re.search(r"\(([\d.]+) queries/s", t).group(1))
            secs = float(re.search(r"queries in ([\d.]+) s", t).group(1))
            wall = float(re.search(r"wall ([\d.]+)", t).group(1))
            read = sum(float(x) for x in re.findall(r"load read \(total\): ([\d.]+)", t))
            up = sum(float(x) for x in re.findall(r"load gpu upload and warm-up: ([\d.]+)", t))
            row = {"shards": int(n), "batch_qps": qps, "open_s": round(wall - secs, 2), "read_s": read,
                   "upload_warmup_s": up}
            if best is None or qps > best["batch_qps"]:
                best = row
        idx = (out / f"index-{n}.txt").read_text()
        m = re.search(r"([\d.]+) s total \(([\d.]+) tokens/s\)", idx)
        best.update({"recall_at_10": round(recall(run, exact), 4), "same_as_1_shard": same(base, run),
                     "build_s": float(m.group(1)) if m else None,
                     "index_bytes": int((out / f"bytes-{n}.txt").read_text())})
        rows.append(best)
    print(json.dumps({"gpu": (out / "gpu.txt").read_text().strip(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
