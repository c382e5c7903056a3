// Copyright TileMaxSim authors. Tests for run / qrels I/O and the trec_eval metrics.
// Inside TEST bodies `Run` names testing::Test::Run(), so the run type is spelled tms::Run.
//
// Expected metric values are computed by hand; the comments give the arithmetic. Each was
// also checked against pytrec_eval (trec_eval 9) when the test was written.
#include "tools/lib/eval.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tests/scratch_dir.h"

namespace tms {
namespace {

constexpr double kEps = 1e-12;

/// NAME in this program's scratch directory.
std::string EvalPath(const std::string& name) {
    static const std::filesystem::path dir = tms::testing::ScratchDir("tms_eval");
    return (dir / name).string();
}

/// Writes `content` to a fresh file in the scratch directory and returns its path.
std::string WriteTempFile(const std::string& name, const std::string& content) {
    const std::string path = EvalPath(name);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << content;
    out.close();
    EXPECT_TRUE(out) << "could not write " << path;
    return path;
}

std::string ReadWholeFile(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

/// Asserts `st` has `code`, a one-line message starting "PATH:LINE: " and containing `needle`.
void ExpectLineError(const Status& st, Status::Code code, const std::string& path, int line,
                     const std::string& needle) {
    EXPECT_EQ(st.code(), code) << st.message();
    const std::string prefix = path + ":" + std::to_string(line) + ": ";
    EXPECT_EQ(st.message().rfind(prefix, 0), 0u) << "message: " << st.message();
    EXPECT_NE(st.message().find(needle), std::string::npos) << "message: " << st.message();
    EXPECT_EQ(st.message().find('\n'), std::string::npos) << "message: " << st.message();
}

double Metric(const EvalResult& r, const std::string& name) {
    for (const auto& [n, v] : r.metrics) {
        if (n == name) return v;
    }
    ADD_FAILURE() << "no metric " << name;
    return NAN;
}

EvalResult EvaluateOk(const tms::Run& run, const Qrels& qrels) {
    EvalResult r;
    const Status st = Evaluate(run, qrels, &r);
    EXPECT_TRUE(st.ok()) << st.message();
    return r;
}

// ---------------------------------------------------------------- metrics

TEST(EvalCpu, MetricNamesInOrder) {
    const EvalResult r = EvaluateOk({{"q", {{"d", 1.0}}}}, {{"q", {{"d", 1}}}});
    ASSERT_EQ(r.metrics.size(), 4u);
    EXPECT_EQ(r.metrics[0].first, "mrr@10");
    EXPECT_EQ(r.metrics[1].first, "ndcg@10");
    EXPECT_EQ(r.metrics[2].first, "recall@100");
    EXPECT_EQ(r.metrics[3].first, "recall@1000");
    EXPECT_EQ(r.n_queries, 1);
    for (const auto& [name, value] : r.metrics) EXPECT_DOUBLE_EQ(value, 1.0) << name;
}

TEST(EvalCpu, MrrIsReciprocalRankOfFirstRelevant) {
    // Ranks by score: d1, d2, d3(rel), d4(rel) -> 1/3.
    const tms::Run run = {{"q", {{"d4", 1.0}, {"d3", 2.0}, {"d2", 3.0}, {"d1", 4.0}}}};
    const Qrels qrels = {{"q", {{"d3", 1}, {"d4", 2}, {"d1", 0}}}};
    EXPECT_NEAR(Metric(EvaluateOk(run, qrels), "mrr@10"), 1.0 / 3.0, kEps);
}

TEST(EvalCpu, MrrIgnoresRelevantBeyondRankTen) {
    // The only relevant document is at rank 11: mrr@10 = 0 but recall@100 = 1.
    tms::Run run;
    for (int i = 0; i < 11; ++i) run["q"].emplace_back("d" + std::to_string(i), 100.0 - i);
    const Qrels qrels = {{"q", {{"d10", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_EQ(Metric(r, "mrr@10"), 0.0);
    EXPECT_EQ(Metric(r, "ndcg@10"), 0.0);
    EXPECT_EQ(Metric(r, "recall@100"), 1.0);
}

TEST(EvalCpu, TiesBrokenByDocidDescending) {
    // All scores tie: trec_eval orders c, b, a (docid descending), so the relevant "a" is
    // at rank 3 whatever the input order.
    const Qrels qrels = {{"q", {{"a", 1}}}};
    const tms::Run run1 = {{"q", {{"a", 0.5}, {"b", 0.5}, {"c", 0.5}}}};
    const tms::Run run2 = {{"q", {{"c", 0.5}, {"a", 0.5}, {"b", 0.5}}}};
    EXPECT_NEAR(Metric(EvaluateOk(run1, qrels), "mrr@10"), 1.0 / 3.0, kEps);
    EXPECT_NEAR(Metric(EvaluateOk(run2, qrels), "mrr@10"), 1.0 / 3.0, kEps);
    // ndcg: gain 1 at rank 3 -> (1/log2(4)) / 1 = 0.5.
    EXPECT_NEAR(Metric(EvaluateOk(run1, qrels), "ndcg@10"), 0.5, kEps);
}

TEST(EvalCpu, TieBreakUsesByteOrderNotNumericOrder) {
    // "9" > "10" > "1" as strings: ranks 9, 10, 1. The relevant "10" is at rank 2.
    const tms::Run run = {{"q", {{"1", 2.0}, {"10", 2.0}, {"9", 2.0}}}};
    const Qrels qrels = {{"q", {{"10", 1}}}};
    EXPECT_NEAR(Metric(EvaluateOk(run, qrels), "mrr@10"), 0.5, kEps);
}

TEST(EvalCpu, ScoresEqualInFloatPrecisionTie) {
    // trec_eval stores scores as float: 1 + 1e-12 and 1 tie, so b (docid desc) ranks first.
    const tms::Run run = {{"q", {{"a", 1.0 + 1e-12}, {"b", 1.0}}}};
    const Qrels qrels = {{"q", {{"a", 1}, {"b", 0}}}};
    EXPECT_NEAR(Metric(EvaluateOk(run, qrels), "mrr@10"), 0.5, kEps);
}

TEST(EvalCpu, RankTruncationUsesTieOrder) {
    // Ten docs tie at the 10th place boundary: 9 higher-scored non-relevant docs, then
    // "a" (relevant) and "z" tie; z sorts before a, so a is rank 11 and mrr@10 = 0.
    tms::Run run;
    for (int i = 0; i < 9; ++i) run["q"].emplace_back("n" + std::to_string(i), 10.0 - i);
    run["q"].emplace_back("a", 0.0);
    run["q"].emplace_back("z", 0.0);
    const Qrels qrels = {{"q", {{"a", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_EQ(Metric(r, "mrr@10"), 0.0);
    EXPECT_EQ(Metric(r, "ndcg@10"), 0.0);
    EXPECT_EQ(Metric(r, "recall@100"), 1.0);
}

TEST(EvalCpu, NdcgGradedRelevance) {
    // Ranked: d1(0), d2(2), d3(unjudged), d4(1); d5(3) is judged but not retrieved.
    // DCG  = 2/log2(3) + 1/log2(5)
    // IDCG = 3/log2(2) + 2/log2(3) + 1/log2(4)   (grades 3, 2, 1; grade 0 adds nothing)
    const tms::Run run = {{"q", {{"d1", 4.0}, {"d2", 3.0}, {"d3", 2.0}, {"d4", 1.0}}}};
    const Qrels qrels = {{"q", {{"d1", 0}, {"d2", 2}, {"d4", 1}, {"d5", 3}}}};
    const double dcg = 2.0 / std::log2(3.0) + 1.0 / std::log2(5.0);
    const double idcg = 3.0 + 2.0 / std::log2(3.0) + 0.5;
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "ndcg@10"), dcg / idcg, kEps);
    EXPECT_NEAR(Metric(r, "ndcg@10"), 0.35543595158098623, kEps);
    EXPECT_NEAR(Metric(r, "mrr@10"), 0.5, kEps);
    EXPECT_NEAR(Metric(r, "recall@100"), 2.0 / 3.0, kEps);  // d2, d4 of d2, d4, d5
}

TEST(EvalCpu, NdcgNegativeGradeIsZeroGainAndNotRelevant) {
    // d1 has grade -1 (unjudged in trec_eval): rank 1 gains nothing; d2 at rank 2.
    const tms::Run run = {{"q", {{"d1", 2.0}, {"d2", 1.0}}}};
    const Qrels qrels = {{"q", {{"d1", -1}, {"d2", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "ndcg@10"), 1.0 / std::log2(3.0), kEps);
    EXPECT_NEAR(Metric(r, "mrr@10"), 0.5, kEps);
    EXPECT_EQ(Metric(r, "recall@100"), 1.0);
}

TEST(EvalCpu, NdcgCutsRunAndIdealAtTen) {
    // 12 relevant docs of grade 1, retrieved at ranks 3..14: DCG counts ranks 3..10,
    // IDCG counts ranks 1..10.
    tms::Run run;
    Qrels qrels;
    run["q"].emplace_back("x0", 100.0);
    run["q"].emplace_back("x1", 99.0);
    for (int i = 0; i < 12; ++i) {
        const std::string id = "r" + std::to_string(i);
        run["q"].emplace_back(id, 50.0 - i);
        qrels["q"][id] = 1;
    }
    double dcg = 0, idcg = 0;
    for (int rank = 3; rank <= 10; ++rank) dcg += 1.0 / std::log2(rank + 1.0);
    for (int rank = 1; rank <= 10; ++rank) idcg += 1.0 / std::log2(rank + 1.0);
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "ndcg@10"), dcg / idcg, kEps);
    EXPECT_NEAR(Metric(r, "mrr@10"), 1.0 / 3.0, kEps);
    EXPECT_EQ(Metric(r, "recall@100"), 1.0);
}

TEST(EvalCpu, RecallAtCutoffs) {
    // 4 relevant docs; the run retrieves 3 of them at ranks 50, 500 and 1200.
    tms::Run run;
    for (int i = 1; i <= 1500; ++i) run["q"].emplace_back("d" + std::to_string(i), 2000.0 - i);
    const Qrels qrels = {{"q", {{"d50", 1}, {"d500", 2}, {"d1200", 1}, {"missing", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "recall@100"), 1.0 / 4.0, kEps);
    EXPECT_NEAR(Metric(r, "recall@1000"), 2.0 / 4.0, kEps);
    EXPECT_EQ(Metric(r, "mrr@10"), 0.0);
}

TEST(EvalCpu, RecallCountsRelevantAtExactCutoff) {
    // Relevant docs at ranks 100 and 101: recall@100 = 1/2.
    tms::Run run;
    for (int i = 1; i <= 101; ++i) run["q"].emplace_back("d" + std::to_string(i), 1000.0 - i);
    const Qrels qrels = {{"q", {{"d100", 1}, {"d101", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "recall@100"), 0.5, kEps);
    EXPECT_NEAR(Metric(r, "recall@1000"), 1.0, kEps);
}

TEST(EvalCpu, NoRelevantRetrievedGivesZeros) {
    const tms::Run run = {{"q", {{"a", 3.0}, {"b", 2.0}, {"c", 1.0}}}};
    const Qrels qrels = {{"q", {{"a", 0}, {"x", 1}, {"y", 2}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_EQ(r.n_queries, 1);
    for (const auto& [name, value] : r.metrics) EXPECT_EQ(value, 0.0) << name;
}

TEST(EvalCpu, QueryWithoutRelevantJudgmentsCountsAsZero) {
    // pytrec_eval reports q2 (only grade-0 judgments) with all metrics 0; it is averaged in.
    const tms::Run run = {{"q1", {{"a", 1.0}}}, {"q2", {{"x", 1.0}}}};
    const Qrels qrels = {{"q1", {{"a", 1}}}, {"q2", {{"x", 0}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_EQ(r.n_queries, 2);
    for (const auto& [name, value] : r.metrics) EXPECT_NEAR(value, 0.5, kEps) << name;
}

TEST(EvalCpu, QueriesOnlyInRunOrOnlyInQrelsAreIgnored) {
    // q1: mrr 1; q2: mrr 1/2; "run_only" and "qrels_only" are not averaged.
    const tms::Run run = {
        {"q1", {{"a", 2.0}, {"b", 1.0}}}, {"q2", {{"a", 2.0}, {"b", 1.0}}}, {"run_only", {{"a", 1.0}}}};
    const Qrels qrels = {{"q1", {{"a", 1}}}, {"q2", {{"b", 1}}}, {"qrels_only", {{"a", 1}}}};
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_EQ(r.n_queries, 2);
    EXPECT_NEAR(Metric(r, "mrr@10"), (1.0 + 0.5) / 2.0, kEps);
    EXPECT_NEAR(Metric(r, "ndcg@10"), (1.0 + 1.0 / std::log2(3.0)) / 2.0, kEps);
    EXPECT_EQ(Metric(r, "recall@100"), 1.0);
}

TEST(EvalCpu, NoQueryInCommonIsInvalidArgument) {
    EvalResult r;
    r.n_queries = 42;
    const Status st = Evaluate({{"q1", {{"a", 1.0}}}}, {{"q2", {{"a", 1}}}}, &r);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(st.message(), "no query of the run is in the qrels");
    EXPECT_EQ(r.n_queries, 42);  // untouched on error
}

TEST(EvalCpu, DuplicateDocidInRunIsInvalidArgument) {
    EvalResult r;
    const Status st = Evaluate({{"q", {{"a", 1.0}, {"b", 0.5}, {"a", 0.2}}}}, {{"q", {{"a", 1}}}}, &r);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(st.message().find("'a'"), std::string::npos) << st.message();
}

TEST(EvalCpu, NanScoreInRunIsInvalidArgument) {
    EvalResult r;
    const Status st = Evaluate({{"q", {{"a", std::nan("")}}}}, {{"q", {{"a", 1}}}}, &r);
    EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
}

TEST(EvalCpu, FormatEvalTextAndJson) {
    EvalResult r;
    r.n_queries = 3;
    r.metrics = {{"mrr@10", 0.5}, {"ndcg@10", 1.0 / 3.0}, {"recall@100", 1.0}, {"recall@1000", 0.0}};
    EXPECT_EQ(FormatEval(r, false),
              "mrr@10\tall\t0.5000\n"
              "ndcg@10\tall\t0.3333\n"
              "recall@100\tall\t1.0000\n"
              "recall@1000\tall\t0.0000\n");
    const std::string json = FormatEval(r, true);
    EXPECT_EQ(json.rfind("{\"n_queries\": 3, \"mrr@10\": 0.5, \"ndcg@10\": ", 0), 0u) << json;
    EXPECT_NE(json.find("\"recall@100\": 1, \"recall@1000\": 0}\n"), std::string::npos) << json;
    // ndcg printed so that it reads back as the same double.
    const size_t pos = json.find("\"ndcg@10\": ") + std::string("\"ndcg@10\": ").size();
    EXPECT_EQ(std::stod(json.substr(pos)), 1.0 / 3.0) << json;
}

// ---------------------------------------------------------------- ReadRun

TEST(EvalCpu, ReadRunParsesLinesAndIgnoresRankField) {
    const std::string path = WriteTempFile("run_ok.trec",
                                           "q1 Q0 d1 1 2.5 tag\n"
                                           "\n"
                                           "q1\tQ0\td2\t7\t-1e-3\ttag\r\n"
                                           "  q2 Q0 d1 1 inf tag  \n"
                                           "q1 Q0 d3 3 +4 tag");
    tms::Run run;
    ASSERT_TRUE(ReadRun(path, &run).ok());
    ASSERT_EQ(run.size(), 2u);
    ASSERT_EQ(run["q1"].size(), 3u);
    EXPECT_EQ(run["q1"][0], std::make_pair(std::string("d1"), 2.5));
    EXPECT_EQ(run["q1"][1], std::make_pair(std::string("d2"), -1e-3));
    EXPECT_EQ(run["q1"][2], std::make_pair(std::string("d3"), 4.0));
    ASSERT_EQ(run["q2"].size(), 1u);
    EXPECT_TRUE(std::isinf(run["q2"][0].second));
}

TEST(EvalCpu, ReadRunMissingFileIsNotFound) {
    const std::string path = EvalPath("does_not_exist.trec");
    tms::Run run;
    const Status st = ReadRun(path, &run);
    EXPECT_EQ(st.code(), Status::Code::kNotFound);
    EXPECT_EQ(st.message(), path + ": no such file");
}

TEST(EvalCpu, ReadRunEmptyFileIsInvalidArgument) {
    for (const std::string& content : {std::string(), std::string("\n  \n\t\n")}) {
        const std::string path = WriteTempFile("run_empty.trec", content);
        tms::Run run;
        const Status st = ReadRun(path, &run);
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
        EXPECT_EQ(st.message(), path + ": no run lines");
    }
}

TEST(EvalCpu, ReadRunWrongFieldCount) {
    const std::string path = WriteTempFile("run_fields.trec",
                                           "q1 Q0 d1 1 2.0 tag\n"
                                           "q1 Q0 d2 2\n");
    tms::Run run = {{"keep", {{"me", 1.0}}}};
    const Status st = ReadRun(path, &run);
    ExpectLineError(st, Status::Code::kInvalidArgument, path, 2,
                    "expected 6 fields 'qid Q0 docid rank score tag', got 4");
    EXPECT_EQ(st.message(), path + ":2: expected 6 fields 'qid Q0 docid rank score tag', got 4");
    EXPECT_EQ(run.count("keep"), 1u);  // untouched on error
}

TEST(EvalCpu, ReadRunNonNumericRank) {
    const std::string path = WriteTempFile("run_rank.trec", "q1 Q0 d1 first 2.0 tag\n");
    tms::Run run;
    ExpectLineError(ReadRun(path, &run), Status::Code::kInvalidArgument, path, 1, "rank 'first'");
}

TEST(EvalCpu, ReadRunNonNumericScore) {
    const std::string path = WriteTempFile("run_score.trec",
                                           "q1 Q0 d1 1 2.0 tag\n"
                                           "q1 Q0 d2 2 1.5x tag\n");
    tms::Run run;
    ExpectLineError(ReadRun(path, &run), Status::Code::kInvalidArgument, path, 2, "score '1.5x'");
}

TEST(EvalCpu, ReadRunNanScore) {
    const std::string path = WriteTempFile("run_nan.trec", "\nq1 Q0 d1 1 nan tag\n");
    tms::Run run;
    ExpectLineError(ReadRun(path, &run), Status::Code::kInvalidArgument, path, 2, "NaN");
}

TEST(EvalCpu, ReadRunDuplicateQidDocid) {
    const std::string path = WriteTempFile("run_dup.trec",
                                           "q1 Q0 d1 1 2.0 tag\n"
                                           "q2 Q0 d1 1 2.0 tag\n"
                                           "q1 Q0 d1 2 1.0 tag\n");
    tms::Run run;
    const Status st = ReadRun(path, &run);
    ExpectLineError(st, Status::Code::kInvalidArgument, path, 3, "duplicate docid 'd1'");
    EXPECT_NE(st.message().find("line 1"), std::string::npos) << st.message();
}

// ---------------------------------------------------------------- ReadQrels

TEST(EvalCpu, ReadQrelsTrecFormat) {
    const std::string path = WriteTempFile("qrels_ok.trec",
                                           "q1 0 d1 1\n"
                                           "\n"
                                           "q1\t0\td2\t0\r\n"
                                           "q2 0 d1 2\n"
                                           "q2 Q0 d3 -1\n");
    Qrels qrels;
    ASSERT_TRUE(ReadQrels(path, &qrels).ok());
    const Qrels expected = {{"q1", {{"d1", 1}, {"d2", 0}}}, {"q2", {{"d1", 2}, {"d3", -1}}}};
    EXPECT_EQ(qrels, expected);
}

TEST(EvalCpu, ReadQrelsBeirTsvWithHeader) {
    const std::string path = WriteTempFile("qrels_beir.tsv",
                                           "query-id\tcorpus-id\tscore\n"
                                           "q1\td1\t1\n"
                                           "\n"
                                           "q1\td2\t0\r\n"
                                           "q2\tdoc with space\t2\n");
    Qrels qrels;
    ASSERT_TRUE(ReadQrels(path, &qrels).ok());
    const Qrels expected = {{"q1", {{"d1", 1}, {"d2", 0}}}, {"q2", {{"doc with space", 2}}}};
    EXPECT_EQ(qrels, expected);
}

TEST(EvalCpu, ReadQrelsBeirTsvWithoutHeader) {
    const std::string path = WriteTempFile("qrels_beir_nohdr.tsv", "q1\td1\t1\nq1\td2\t2\n");
    Qrels qrels;
    ASSERT_TRUE(ReadQrels(path, &qrels).ok());
    const Qrels expected = {{"q1", {{"d1", 1}, {"d2", 2}}}};
    EXPECT_EQ(qrels, expected);
}

TEST(EvalCpu, ReadQrelsIdenticalDuplicateIsAccepted) {
    const std::string path = WriteTempFile("qrels_dup_same.trec", "q1 0 d1 1\nq1 0 d1 1\n");
    Qrels qrels;
    ASSERT_TRUE(ReadQrels(path, &qrels).ok());
    EXPECT_EQ(qrels["q1"].size(), 1u);
}

TEST(EvalCpu, ReadQrelsConflictingDuplicate) {
    const std::string path = WriteTempFile("qrels_dup.trec", "q1 0 d1 1\nq1 0 d2 0\nq1 0 d1 2\n");
    Qrels qrels;
    ExpectLineError(ReadQrels(path, &qrels), Status::Code::kInvalidArgument, path, 3, "line 1");
}

TEST(EvalCpu, ReadQrelsMissingFileIsNotFound) {
    const std::string path = EvalPath("does_not_exist.qrels");
    Qrels qrels;
    const Status st = ReadQrels(path, &qrels);
    EXPECT_EQ(st.code(), Status::Code::kNotFound);
    EXPECT_EQ(st.message(), path + ": no such file");
}

TEST(EvalCpu, ReadQrelsEmptyOrHeaderOnlyIsInvalidArgument) {
    for (const std::string& content : {std::string(), std::string("query-id\tcorpus-id\tscore\n\n")}) {
        const std::string path = WriteTempFile("qrels_empty.tsv", content);
        Qrels qrels;
        const Status st = ReadQrels(path, &qrels);
        EXPECT_EQ(st.code(), Status::Code::kInvalidArgument);
        EXPECT_EQ(st.message(), path + ": no qrels lines");
    }
}

TEST(EvalCpu, ReadQrelsTrecWrongFieldCount) {
    const std::string path = WriteTempFile("qrels_fields.trec", "q1 0 d1 1\nq1 0 d2 1 extra\n");
    Qrels qrels;
    ExpectLineError(ReadQrels(path, &qrels), Status::Code::kInvalidArgument, path, 2,
                    "expected 4 fields 'qid 0 docid rel', got 5");
}

TEST(EvalCpu, ReadQrelsTrecNonIntegerRelevance) {
    const std::string path = WriteTempFile("qrels_rel.trec", "q1 0 d1 1\n\nq1 0 d2 0.5\n");
    Qrels qrels;
    ExpectLineError(ReadQrels(path, &qrels), Status::Code::kInvalidArgument, path, 3,
                    "relevance '0.5' is not an integer");
}

TEST(EvalCpu, ReadQrelsBeirWrongFieldCount) {
    const std::string path = WriteTempFile("qrels_beir_fields.tsv", "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n");
    Qrels qrels;
    ExpectLineError(ReadQrels(path, &qrels), Status::Code::kInvalidArgument, path, 3,
                    "expected 3 tab-separated fields");
}

TEST(EvalCpu, ReadQrelsBeirNonIntegerRelevance) {
    const std::string path = WriteTempFile("qrels_beir_rel.tsv", "query-id\tcorpus-id\tscore\nq1\td1\thigh\n");
    Qrels qrels;
    ExpectLineError(ReadQrels(path, &qrels), Status::Code::kInvalidArgument, path, 2,
                    "relevance 'high' is not an integer");
}

// ---------------------------------------------------------------- WriteRun

TEST(EvalCpu, WriteRunRoundTrip) {
    const std::string path = EvalPath("roundtrip.trec");
    const std::vector<std::string> qids = {"q1", "q2", "q3"};
    const std::vector<std::vector<std::pair<std::string, float>>> results = {
        {{"d3", 0.123456789f}, {"d1", 0.123456782f}, {"d2", -3.5e-7f}},
        {},
        {{"x", 1e30f}, {"y", 1.0f}, {"z", 1.0f}},
    };
    ASSERT_TRUE(WriteRun(path, qids, results, "tms").ok());
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

    const std::string text = ReadWholeFile(path);
    EXPECT_EQ(text.rfind("q1 Q0 d3 1 ", 0), 0u) << text;
    EXPECT_NE(text.find("q1 Q0 d2 3 "), std::string::npos) << text;
    EXPECT_NE(text.find("q3 Q0 z 3 1 tms\n"), std::string::npos) << text;

    tms::Run run;
    ASSERT_TRUE(ReadRun(path, &run).ok());
    ASSERT_EQ(run.size(), 2u);  // q2 had no results
    for (size_t q : {size_t{0}, size_t{2}}) {
        const auto& got = run[qids[q]];
        ASSERT_EQ(got.size(), results[q].size());
        for (size_t i = 0; i < got.size(); ++i) {
            EXPECT_EQ(got[i].first, results[q][i].first);
            // Scores come back as the exact float that was written.
            EXPECT_EQ(static_cast<float>(got[i].second), results[q][i].second);
        }
    }
}

TEST(EvalCpu, WriteRunReplacesExistingFile) {
    const std::string path = WriteTempFile("replace.trec", "old contents that are longer than the new\n");
    ASSERT_TRUE(WriteRun(path, {"q"}, {{{"d", 1.0f}}}, "t").ok());
    EXPECT_EQ(ReadWholeFile(path), "q Q0 d 1 1 t\n");
}

TEST(EvalCpu, WriteRunUnwritablePathIsIOError) {
    const std::string path = EvalPath("no_such_dir/run.trec");
    const Status st = WriteRun(path, {"q"}, {{{"d", 1.0f}}}, "t");
    EXPECT_EQ(st.code(), Status::Code::kIOError);
    EXPECT_NE(st.message().find(path), std::string::npos) << st.message();
}

TEST(EvalCpu, WriteRunRejectsBadArguments) {
    const std::string path = EvalPath("bad_args.trec");
    std::remove(path.c_str());
    using Results = std::vector<std::vector<std::pair<std::string, float>>>;
    EXPECT_EQ(WriteRun(path, {"q1", "q2"}, Results{{{"d", 1.0f}}}, "t").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q 1"}, Results{{{"d", 1.0f}}}, "t").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q"}, Results{{{"d\t1", 1.0f}}}, "t").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q"}, Results{{{"d", 1.0f}}}, "").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q", "q"}, Results{{{"d", 1.0f}}, {{"e", 1.0f}}}, "t").code(),
              Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q"}, Results{{{"d", 1.0f}, {"d", 0.5f}}}, "t").code(), Status::Code::kInvalidArgument);
    EXPECT_EQ(WriteRun(path, {"q"}, Results{{{"d", std::nanf("")}}}, "t").code(), Status::Code::kInvalidArgument);
    EXPECT_FALSE(std::filesystem::exists(path));
    EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

TEST(EvalCpu, ReadWriteEvaluateEndToEnd) {
    // WriteRun keeps the given order in the rank field, but Evaluate re-ranks by score:
    // b (0.9) outranks a (0.1) although a was written first.
    const std::string run_path = EvalPath("e2e.trec");
    ASSERT_TRUE(WriteRun(run_path, {"q"}, {{{"a", 0.1f}, {"b", 0.9f}}}, "t").ok());
    const std::string qrels_path = WriteTempFile("e2e.tsv", "query-id\tcorpus-id\tscore\nq\ta\t1\n");
    tms::Run run;
    Qrels qrels;
    ASSERT_TRUE(ReadRun(run_path, &run).ok());
    ASSERT_TRUE(ReadQrels(qrels_path, &qrels).ok());
    const EvalResult r = EvaluateOk(run, qrels);
    EXPECT_NEAR(Metric(r, "mrr@10"), 0.5, kEps);
}

}  // namespace
}  // namespace tms
