"""recall@10 of TREC runs against an exact one, and the queries/s a `tms search` log reports.

  run_recall.py EXACT.run RUN [LOG]     prints "recall@10 R" and, with LOG, "Q q/s"
Imported: top(path), recall(exact, got), qps(log_path).
"""
import re
import sys


def top(path):
    """Each query's documents in rank order."""
    r = {}
    for line in open(path):
        q, _, d, *_ = line.split()
        r.setdefault(q, []).append(d)
    return r


def recall(exact, got, k=10):
    return sum(len(set(exact[q][:k]) & set(got.get(q, [])[:k])) / min(k, len(exact[q])) for q in exact) / len(exact)


def qps(log_path):
    m = re.search(r"([0-9.]+) queries/s", open(log_path).read())
    return m.group(1) if m else "?"


if __name__ == "__main__":
    line = f"recall@10 {recall(top(sys.argv[1]), top(sys.argv[2])):.4f}"
    if len(sys.argv) > 3:
        line += f"  {qps(sys.argv[3])} q/s"
    print(line)
