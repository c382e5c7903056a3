"""`tms index --metadata`, `tms info`'s schema, and `tms search --filter / --subset` end to end:
filtered runs hold only allowed documents and equal the exhaustive search over them; bad
filters, subsets and metadata fail in one line."""
import json
import sqlite3

import pytest

from cli_util import TMS, expect_error, tms
pytestmark = pytest.mark.skipif(not TMS, reason="TMS_BIN not set")

N_DOCS = 300


def tenant(i):
    return i % 10


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("filter")
    tms("synth", "--out", d, "--docs", N_DOCS, "--queries", 12, "--dim", 64, check=True)
    with open(d / "meta.jsonl", "w") as f:
        for i in range(N_DOCS):
            note = "it's; a \"quote\" -- DROP TABLE docs" if i % 7 == 0 else f"plain {i}"
            f.write(json.dumps({"tenant": tenant(i), "year": 2000 + i % 30, "note": note}) + "\n")
    tms("index", "--docs", d / "docs.npy", "--doclens", d / "doclens.npy", "--doc-ids", d / "doc_ids.txt",
        "--out", d / "index", "--keep-vectors", "--no-estimate", "--centroids", 32, "--metadata", d / "meta.jsonl",
        "--metadata-types", "year:real", "--no-progress", check=True)
    return d


def doc_ids(corpus):
    return (corpus / "doc_ids.txt").read_text().split()


def search(corpus, out, *extra, check=True):
    p = tms("search", "--index", corpus / "index", "--queries", corpus / "queries.npy", "--query-ids",
            corpus / "query_ids.txt", "--out", out, "--k", 10, "--no-progress", *extra, check=check)
    return p


def run_of(path):
    run = {}
    for line in path.read_text().splitlines():
        q, _, d, rank, score, _ = line.split()
        run.setdefault(q, []).append(d)
    return run


def test_info_shows_the_schema(corpus):
    info = tms("info", "--index", corpus / "index", check=True).stdout.splitlines()
    assert "metadata_rows\t300" in info
    cols = dict(l.split("\t")[1:] for l in info if l.startswith("metadata_column\t"))
    assert cols == {"tenant": "integer", "year": "real", "note": "text"}  # year declared, the rest inferred
    con = sqlite3.connect(corpus / "index" / "metadata.sqlite")
    assert con.execute("SELECT COUNT(*) FROM docs WHERE tenant = 3").fetchone()[0] == 30


@pytest.mark.parametrize("expr,allowed", [
    ("tenant = 3", lambda i: tenant(i) == 3),
    ("tenant < 5 AND year >= 2010", lambda i: tenant(i) < 5 and i % 30 >= 10),
    ("note = 'it''s; a \"quote\" -- DROP TABLE docs'", lambda i: i % 7 == 0),
])
def test_filter_equals_exhaustive_over_the_allowed(corpus, tmp_path, expr, allowed):
    ids = doc_ids(corpus)
    ok = {ids[i] for i in range(N_DOCS) if allowed(i)}
    search(corpus, tmp_path / "f.trec", "--filter", expr)
    search(corpus, tmp_path / "e.trec", "--filter", expr, "--exhaustive")
    got, exact = run_of(tmp_path / "f.trec"), run_of(tmp_path / "e.trec")
    assert len(exact) == 12
    for q, docs in exact.items():
        assert set(docs) <= ok and len(docs) == min(10, len(ok))
        assert set(got[q]) <= ok
    recall = sum(len(set(exact[q]) & set(got.get(q, []))) for q in exact) / sum(len(v) for v in exact.values())
    assert recall >= 0.99, recall
    # The quoted value was data: the table is still there.
    assert "metadata_rows\t300" in tms("info", "--index", corpus / "index", check=True).stdout


def test_filter_with_no_match_gives_an_empty_run(corpus, tmp_path):
    search(corpus, tmp_path / "none.trec", "--filter", "tenant = 99")
    assert (tmp_path / "none.trec").read_text() == ""


def test_subset_for_every_query(corpus, tmp_path):
    ids = doc_ids(corpus)
    chosen = ids[5:60:3]
    (tmp_path / "subset.txt").write_text("\n".join(chosen + ["no-such-doc"]) + "\n")
    p = search(corpus, tmp_path / "s.trec", "--subset", tmp_path / "subset.txt")
    assert "1 of 20 documents are not in the index" in p.stderr
    for docs in run_of(tmp_path / "s.trec").values():
        assert set(docs) <= set(chosen) and len(docs) == 10
    # With a filter too: both must hold.
    search(corpus, tmp_path / "sf.trec", "--subset", tmp_path / "subset.txt", "--filter", "tenant >= 5")
    both = {ids[i] for i in range(5, 60, 3) if tenant(i) >= 5}
    for docs in run_of(tmp_path / "sf.trec").values():
        assert set(docs) <= both and len(docs) == min(10, len(both))


def test_subset_per_query(corpus, tmp_path):
    ids = doc_ids(corpus)
    qids = (corpus / "query_ids.txt").read_text().split()
    per = {q: ids[3 * j:3 * j + 4] for j, q in enumerate(qids[:-1])}  # the last query has no line
    lines = [f"{q}\t{d}" for q, docs in per.items() for d in docs] + ["no-such-query\tdoc0"]
    (tmp_path / "per.tsv").write_text("\n".join(lines) + "\n")
    p = search(corpus, tmp_path / "p.trec", "--subset", tmp_path / "per.tsv")
    assert "1 lines name queries not among the queries" in p.stderr
    run = run_of(tmp_path / "p.trec")
    assert set(run) == set(per)
    for q, docs in run.items():
        assert sorted(docs) == sorted(per[q])


@pytest.mark.parametrize("expr,needle", [
    ("yeer = 2001", "yeer"),
    ("tenant = 7; DROP TABLE docs", ";"),
    ("tenant = ", "filter"),
    ("tenant IN (SELECT 1)", "SELECT"),
])
def test_bad_filter_is_one_line(corpus, tmp_path, expr, needle):
    expect_error(search(corpus, tmp_path / "bad.trec", "--filter", expr, check=False), needle)
    assert not (tmp_path / "bad.trec").exists()


def test_mixed_subset_file_is_one_line(corpus, tmp_path):
    (tmp_path / "mixed.txt").write_text("doc0\nq0\tdoc1\n")
    expect_error(search(corpus, tmp_path / "bad.trec", "--subset", tmp_path / "mixed.txt", check=False),
                 "mixed.txt:2")


def test_filter_needs_metadata(corpus, tmp_path):
    tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", tmp_path / "plain",
        "--centroids", 16, "--no-progress", check=True)
    assert "metadata_" not in tms("info", "--index", tmp_path / "plain", check=True).stdout
    p = tms("search", "--index", tmp_path / "plain", "--queries", corpus / "queries.npy", "--out",
            tmp_path / "r.trec", "--filter", "tenant = 1", "--no-progress")
    expect_error(p, "metadata")


def test_bad_metadata_is_one_line_and_leaves_no_index(corpus, tmp_path):
    lines = (corpus / "meta.jsonl").read_text().splitlines()
    lines[6] = "[1, 2]"
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    p = tms("index", "--docs", corpus / "docs.npy", "--doclens", corpus / "doclens.npy", "--out", tmp_path / "idx",
            "--centroids", 16, "--metadata", tmp_path / "bad.jsonl", "--no-progress")
    expect_error(p, "bad.jsonl", "line 7")
    assert not (tmp_path / "idx").exists()
