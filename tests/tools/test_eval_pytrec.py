"""`tms eval` agrees with pytrec_eval (trec_eval 9) to 1e-6 on a random graded run.

Set TMS_BIN to the `tms` binary; the test is skipped otherwise. The run has ~50 queries with
many tied scores (including doubles that are equal only once rounded to float, which is how
trec_eval compares them), docids whose byte order differs from their numeric order, runs
longer than 1000, queries without relevant documents, negative (unjudged) grades, and
queries present only in the run or only in the qrels. The rank column is scrambled, since
trec_eval ignores it.
"""

import json
import os
import random
import struct
import subprocess

import pytest

pytrec_eval = pytest.importorskip("pytrec_eval")

SEED = 20240611
N_QUERIES = 50
N_DOCS = 2500
TOL = 1e-6
METRICS = ("mrr@10", "ndcg@10", "recall@100", "recall@1000")


def as_float32(x):
    """The value trec_eval ranks by: the score rounded to C float."""
    return struct.unpack("f", struct.pack("f", x))[0]


def trec_order(docs):
    """trec_eval's ranking: float score descending, then docid descending (byte order)."""
    ranked = sorted(docs.items(), key=lambda kv: kv[0].encode(), reverse=True)
    return sorted(ranked, key=lambda kv: -as_float32(kv[1]))  # stable: keeps docid order in ties


def make_data(seed):
    rng = random.Random(seed)
    doc_ids = [f"d{i}" for i in range(N_DOCS)]
    run, qrels = {}, {}
    for q in range(N_QUERIES):
        qid = f"q{q}"
        length = rng.choice([0, 5, 20, 150, 1100, rng.randint(1, 1200)])
        retrieved = rng.sample(doc_ids, length)
        style = q % 3
        docs = {}
        for docid in retrieved:
            if style == 0:  # coarse scores: many exact ties
                score = rng.randint(0, 30) / 8.0
            elif style == 1:  # continuous scores
                score = rng.uniform(-5.0, 5.0)
            else:  # ties that only exist in float precision
                score = rng.randint(0, 30) / 4.0 + rng.choice([0.0, 1e-12, -1e-12])
            docs[docid] = score
        if docs:
            run[qid] = docs

        judged = {}
        pool = retrieved[: min(len(retrieved), 30)] + rng.sample(retrieved, min(len(retrieved), 20))
        pool += rng.sample(doc_ids, rng.randint(1, 15))  # judged but maybe not retrieved
        no_relevant = q % 7 == 3
        for docid in pool:
            grade = 0 if no_relevant else rng.choice([0, 0, 0, 1, 1, 2, 3, -1])
            judged[docid] = grade
        if all(g < 0 for g in judged.values()):
            judged[pool[0]] = 0  # trec_eval needs one grade >= 0 per query
        if q % 11 != 5:  # some queries are only in the run
            qrels[qid] = judged
    for q in range(N_QUERIES, N_QUERIES + 3):  # some only in the qrels
        qrels[f"q{q}"] = {doc_ids[q]: 1}
    return rng, run, qrels


def write_run(path, run, rng):
    lines = []
    for qid, docs in run.items():
        for docid, score in docs.items():
            lines.append(f"{qid} Q0 {docid} {rng.randint(1, 5000)} {score!r} test")
    rng.shuffle(lines)
    path.write_text("\n".join(lines) + "\n")


def write_qrels(path, qrels, fmt):
    if fmt == "trec":
        rows = [f"{qid} 0 {docid} {rel}" for qid, j in qrels.items() for docid, rel in j.items()]
    else:
        rows = ["query-id\tcorpus-id\tscore"]
        rows += [f"{qid}\t{docid}\t{rel}" for qid, j in qrels.items() for docid, rel in j.items()]
    path.write_text("\n".join(rows) + "\n")


def reference_metrics(run, qrels):
    """Per-query pytrec_eval values, averaged over the queries it reports (run ∩ qrels)."""
    measures = {"ndcg_cut_10", "recall_100", "recall_1000"}
    full = pytrec_eval.RelevanceEvaluator(qrels, measures).evaluate(run)
    top10 = {qid: dict(trec_order(docs)[:10]) for qid, docs in run.items()}
    mrr = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    assert set(full) == set(mrr) == set(run) & set(qrels)
    n = len(full)
    return n, {
        "mrr@10": sum(v["recip_rank"] for v in mrr.values()) / n,
        "ndcg@10": sum(v["ndcg_cut_10"] for v in full.values()) / n,
        "recall@100": sum(v["recall_100"] for v in full.values()) / n,
        "recall@1000": sum(v["recall_1000"] for v in full.values()) / n,
    }


def tms_eval(tms_bin, run_path, qrels_path, json_output):
    cmd = [tms_bin, "eval", "--run", str(run_path), "--qrels", str(qrels_path)]
    if json_output:
        cmd.append("--json")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}): {proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def tms_bin():
    path = os.environ.get("TMS_BIN")
    if not path:
        pytest.skip("TMS_BIN is not set")
    return path


@pytest.mark.parametrize("qrels_format", ["trec", "beir"])
def test_eval_matches_pytrec_eval(tmp_path, tms_bin, qrels_format):
    rng, run, qrels = make_data(SEED)
    run_path = tmp_path / "run.trec"
    qrels_path = tmp_path / ("qrels.trec" if qrels_format == "trec" else "qrels.tsv")
    write_run(run_path, run, rng)
    write_qrels(qrels_path, qrels, qrels_format)

    n_ref, ref = reference_metrics(run, qrels)
    got = json.loads(tms_eval(tms_bin, run_path, qrels_path, json_output=True))
    assert got["n_queries"] == n_ref, f"seed {SEED}"
    assert list(k for k in got if k != "n_queries") == list(METRICS)
    for name in METRICS:
        assert abs(got[name] - ref[name]) <= TOL, f"seed {SEED} {name}: tms {got[name]} pytrec_eval {ref[name]}"


def test_eval_text_output(tmp_path, tms_bin):
    rng, run, qrels = make_data(SEED + 1)
    run_path, qrels_path = tmp_path / "run.trec", tmp_path / "qrels.trec"
    write_run(run_path, run, rng)
    write_qrels(qrels_path, qrels, "trec")

    _, ref = reference_metrics(run, qrels)
    lines = tms_eval(tms_bin, run_path, qrels_path, json_output=False).splitlines()
    assert [line.split("\t")[:2] for line in lines] == [[name, "all"] for name in METRICS]
    for line in lines:
        name, _, value = line.split("\t")
        assert len(value.split(".")[1]) == 4, line
        assert abs(float(value) - ref[name]) <= 0.5e-4 + 1e-12, f"seed {SEED + 1} {line}: ref {ref[name]}"


# tms name -> pytrec_eval measure (default cutoffs of trec_eval's measures)
MEASURES = {"map": "map", "map@20": "map_cut_20", "P@5": "P_5", "P@100": "P_100", "ndcg": "ndcg",
            "ndcg@20": "ndcg_cut_20", "recall@30": "recall_30", "mrr": "recip_rank", "success@1": "success_1",
            "success@5": "success_5", "success@10": "success_10"}


def test_chosen_metrics_and_per_query_values_match_pytrec_eval(tmp_path, tms_bin):
    rng, run, qrels = make_data(SEED + 2)
    run_path, qrels_path = tmp_path / "run.trec", tmp_path / "qrels.trec"
    write_run(run_path, run, rng)
    write_qrels(qrels_path, qrels, "trec")
    ref = pytrec_eval.RelevanceEvaluator(qrels, {"map", "map_cut", "P", "ndcg", "ndcg_cut", "recall", "recip_rank",
                                                 "success"}).evaluate(run)
    names = list(MEASURES) + ["mrr@10"]
    cmd = [tms_bin, "eval", "--run", str(run_path), "--qrels", str(qrels_path), "--metrics", ",".join(names),
           "--per-query", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    assert got["n_queries"] == len(ref) and set(got["per_query"]) == set(ref)
    top10 = {qid: dict(trec_order(docs)[:10]) for qid, docs in run.items()}
    mrr10 = pytrec_eval.RelevanceEvaluator(qrels, {"recip_rank"}).evaluate(top10)
    for qid, values in got["per_query"].items():
        assert list(values) == names
        for name, measure in MEASURES.items():
            assert abs(values[name] - ref[qid][measure]) <= TOL, f"{qid} {name}: {values[name]} vs {ref[qid][measure]}"
        assert abs(values["mrr@10"] - mrr10[qid]["recip_rank"]) <= TOL
    for name, measure in MEASURES.items():
        mean = sum(v[measure] for v in ref.values()) / len(ref)
        assert abs(got[name] - mean) <= TOL, name
    # Text: trec_eval -q's layout, every query's lines, then the means.
    proc = subprocess.run(cmd[:-1], capture_output=True, text=True, timeout=120)
    lines = [l.split("\t") for l in proc.stdout.splitlines()]
    assert len(lines) == len(names) * (len(ref) + 1)
    assert [l[1] for l in lines[-len(names):]] == ["all"] * len(names)
    assert {l[1] for l in lines[:-len(names)]} == set(ref)


@pytest.mark.parametrize("bad,message", [("map,foo", "unknown metric 'foo'"), ("P", "needs a cutoff"),
                                         ("ndcg@0", "positive integer"), ("map,,P@5", "an empty name"),
                                         ("map,map", "listed twice")])
def test_bad_metric_lists(tmp_path, tms_bin, bad, message):
    rng, run, qrels = make_data(SEED)
    run_path, qrels_path = tmp_path / "run.trec", tmp_path / "qrels.trec"
    write_run(run_path, run, rng)
    write_qrels(qrels_path, qrels, "trec")
    proc = subprocess.run([tms_bin, "eval", "--run", str(run_path), "--qrels", str(qrels_path), "--metrics", bad],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--metrics" in lines[0] and message in lines[0], proc.stderr
