// Copyright TileMaxSim authors. TREC run / qrels I/O and IR metrics with trec_eval's definitions.
//
// The metric code follows trec_eval 9 (form_res_rels.c, m_recip_rank.c, m_ndcg_cut.c,
// m_recall.c), which pytrec_eval wraps:
//   - each query's results are sorted by score descending, ties by docid descending
//     (strcmp(b, a)); scores are held as float, so doubles equal in float precision tie;
//   - a result's grade is its qrels grade, or "not judged" when absent or negative;
//     relevant = grade >= 1, nDCG gain = grade when > 0;
//   - the ideal DCG walks the query's judged grades >= 1 from the highest down.
#include "tools/lib/eval.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <new>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <unordered_set>

#include "base/json_escape.h"
#include "index/index_data.h"
#include "index/ingest/files.h"

namespace tms {
namespace {

constexpr const char* kRunFormat = "'qid Q0 docid rank score tag'";
constexpr const char* kTrecQrelsFormat = "'qid 0 docid rel'";
constexpr const char* kBeirQrelsFormat = "'query-id<TAB>corpus-id<TAB>score'";
constexpr std::string_view kBeirHeader = "query-id\tcorpus-id\tscore";

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

std::string_view trim(std::string_view s) {
    while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
    while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
    return s;
}

/// Splits on runs of whitespace; no empty fields.
std::vector<std::string_view> split_whitespace(std::string_view s) {
    std::vector<std::string_view> fields;
    size_t i = 0;
    while (i < s.size()) {
        while (i < s.size() && is_space(s[i])) ++i;
        if (i == s.size()) break;
        size_t j = i;
        while (j < s.size() && !is_space(s[j])) ++j;
        fields.push_back(s.substr(i, j - i));
        i = j;
    }
    return fields;
}

/// Splits on every tab; fields are trimmed and may be empty.
std::vector<std::string_view> split_tabs(std::string_view s) {
    std::vector<std::string_view> fields;
    size_t start = 0;
    while (true) {
        size_t tab = s.find('\t', start);
        if (tab == std::string_view::npos) {
            fields.push_back(trim(s.substr(start)));
            break;
        }
        fields.push_back(trim(s.substr(start, tab - start)));
        start = tab + 1;
    }
    return fields;
}

/// A field quoted for an error message, cut short so the message stays readable.
std::string quote_field(std::string_view field) {
    constexpr size_t kMaxShown = 64;
    std::string out = "'";
    if (field.size() > kMaxShown) {
        out.append(field.substr(0, kMaxShown));
        out += "...";
    } else {
        out.append(field);
    }
    out += "'";
    return out;
}

/// Parses a whole field as a base-10 integer (optional sign).
template <typename Int>
bool parse_int(std::string_view s, Int* value) {
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    if (s.empty()) return false;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *value);
    return ec == std::errc() && ptr == s.data() + s.size();
}

/// Parses a whole field as a double (decimal or exponent form, "inf" accepted).
bool parse_double(std::string_view s, double* value) {
    if (!s.empty() && s.front() == '+') s.remove_prefix(1);
    if (s.empty()) return false;
    auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), *value);
    return ec == std::errc() && ptr == s.data() + s.size();
}

std::string errno_message(int err) { return std::generic_category().message(err); }

/// Opens `path` for reading, mapping a missing file to NotFound.
Status open_for_reading(const std::string& path, std::ifstream* in) {
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(path, ec);
    if (st.type() == std::filesystem::file_type::not_found) {
        return Status::NotFound(path + ": no such file");
    }
    if (st.type() == std::filesystem::file_type::directory) {
        return Status::IOError(path + ": is a directory");
    }
    errno = 0;
    in->open(path, std::ios::in | std::ios::binary);
    if (!in->is_open()) {
        const int err = errno;
        return Status::IOError(path + ": cannot open for reading" +
                               (err != 0 ? ": " + errno_message(err) : std::string()));
    }
    return Status::OK();
}

/// Reads `path` line by line (a trailing '\r' is dropped), calling
/// `on_line(line_number, line)` for each; stops at the first non-OK Status.
template <typename OnLine>
Status for_each_line(const std::string& path, OnLine on_line) {
    std::ifstream in;
    TMS_RETURN_IF_ERROR(open_for_reading(path, &in));
    std::string line;
    int64_t line_no = 0;
    while (std::getline(in, line)) {
        ++line_no;
        std::string_view view(line);
        if (!view.empty() && view.back() == '\r') view.remove_suffix(1);
        TMS_RETURN_IF_ERROR(on_line(line_no, view));
    }
    if (in.bad()) return Status::IOError(path + ": read failed after line " + std::to_string(line_no));
    return Status::OK();
}

std::string line_prefix(const std::string& path, int64_t line_no) {
    return path + ":" + std::to_string(line_no) + ": ";
}

/// Runs `fn` and turns an escaping exception into a Status, so none crosses the API.
template <typename Fn>
Status no_throw(const char* what, Fn fn) {
    try {
        return fn();
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted(std::string(what) + ": out of memory");
    } catch (const std::exception& e) {
        return Status::Internal(std::string(what) + ": " + e.what());
    } catch (...) {
        return Status::Internal(std::string(what) + ": unknown exception");
    }
}

Status read_run_impl(const std::string& path, Run* run) {
    if (run == nullptr) return Status::InvalidArgument("ReadRun: run is null");
    Run parsed;
    // "qid\tdocid" -> line of first occurrence; a tab cannot occur inside a field.
    std::unordered_map<std::string, int64_t> first_line;
    int64_t n_lines = 0;
    TMS_RETURN_IF_ERROR(for_each_line(path, [&](int64_t line_no, std::string_view line) {
        const std::vector<std::string_view> f = split_whitespace(line);
        if (f.empty()) return Status::OK();
        if (f.size() != 6) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "expected 6 fields " + kRunFormat + ", got " +
                                           std::to_string(f.size()));
        }
        int64_t rank = 0;
        if (!parse_int(f[3], &rank)) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "rank " + quote_field(f[3]) +
                                           " is not an integer");
        }
        double score = 0;
        if (!parse_double(f[4], &score)) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "score " + quote_field(f[4]) +
                                           " is not a number");
        }
        if (std::isnan(score)) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "score is NaN");
        }
        std::string key;
        key.reserve(f[0].size() + 1 + f[2].size());
        key.append(f[0]).append("\t").append(f[2]);
        auto [it, inserted] = first_line.emplace(std::move(key), line_no);
        if (!inserted) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "duplicate docid " + quote_field(f[2]) +
                                           " for query " + quote_field(f[0]) + " (first at line " +
                                           std::to_string(it->second) + ")");
        }
        parsed[std::string(f[0])].emplace_back(std::string(f[2]), score);
        ++n_lines;
        return Status::OK();
    }));
    if (n_lines == 0) return Status::InvalidArgument(path + ": no run lines");
    *run = std::move(parsed);
    return Status::OK();
}

enum class QrelsFormat { kUnknown, kTrec, kBeir };

Status read_qrels_impl(const std::string& path, Qrels* qrels) {
    if (qrels == nullptr) return Status::InvalidArgument("ReadQrels: qrels is null");
    Qrels parsed;
    std::unordered_map<std::string, int64_t> first_line;  // "qid\tdocid" -> line
    QrelsFormat format = QrelsFormat::kUnknown;
    int64_t n_lines = 0;
    TMS_RETURN_IF_ERROR(for_each_line(path, [&](int64_t line_no, std::string_view line) {
        if (trim(line).empty()) return Status::OK();
        if (format == QrelsFormat::kUnknown) {
            if (trim(line) == kBeirHeader) {
                format = QrelsFormat::kBeir;
                return Status::OK();
            }
            format = split_tabs(line).size() == 3 ? QrelsFormat::kBeir : QrelsFormat::kTrec;
        }
        std::string_view qid, docid, rel_field;
        if (format == QrelsFormat::kBeir) {
            const std::vector<std::string_view> f = split_tabs(line);
            if (f.size() != 3) {
                return Status::InvalidArgument(line_prefix(path, line_no) + "expected 3 tab-separated fields " +
                                               kBeirQrelsFormat + ", got " + std::to_string(f.size()));
            }
            for (const std::string_view& field : f) {
                if (field.empty()) {
                    return Status::InvalidArgument(line_prefix(path, line_no) + "empty field in " + kBeirQrelsFormat);
                }
            }
            qid = f[0];
            docid = f[1];
            rel_field = f[2];
        } else {
            const std::vector<std::string_view> f = split_whitespace(line);
            if (f.size() != 4) {
                return Status::InvalidArgument(line_prefix(path, line_no) + "expected 4 fields " + kTrecQrelsFormat +
                                               ", got " + std::to_string(f.size()));
            }
            qid = f[0];
            docid = f[2];
            rel_field = f[3];
        }
        int rel = 0;
        if (!parse_int(rel_field, &rel)) {
            return Status::InvalidArgument(line_prefix(path, line_no) + "relevance " + quote_field(rel_field) +
                                           " is not an integer");
        }
        std::string key;
        key.append(qid).append("\t").append(docid);
        auto [it, inserted] = first_line.emplace(std::move(key), line_no);
        std::map<std::string, int>& judged = parsed[std::string(qid)];
        if (!inserted) {
            const int previous = judged.at(std::string(docid));
            if (previous != rel) {
                return Status::InvalidArgument(line_prefix(path, line_no) + "relevance " + std::to_string(rel) +
                                               " of docid " + quote_field(docid) + " for query " + quote_field(qid) +
                                               " contradicts " + std::to_string(previous) + " at line " +
                                               std::to_string(it->second));
            }
            return Status::OK();
        }
        judged.emplace(std::string(docid), rel);
        ++n_lines;
        return Status::OK();
    }));
    if (n_lines == 0) return Status::InvalidArgument(path + ": no qrels lines");
    *qrels = std::move(parsed);
    return Status::OK();
}

// Non-empty, no whitespace and no control characters (a NUL would cut the field short).
bool is_valid_field(const std::string& s) {
    return !s.empty() && std::none_of(s.begin(), s.end(), [](char c) {
        return is_space(c) || static_cast<unsigned char>(c) < 0x20 || c == 0x7f;
    });
}

Status validate_run_to_write(const std::vector<std::string>& qids,
                             const std::vector<std::vector<std::pair<std::string, float>>>& results,
                             const std::string& tag) {
    if (qids.size() != results.size()) {
        return Status::InvalidArgument("WriteRun: " + std::to_string(qids.size()) + " qids but " +
                                       std::to_string(results.size()) + " result lists");
    }
    if (!is_valid_field(tag)) {
        return Status::InvalidArgument("WriteRun: tag " + quote_field(tag) +
                                       " is empty or contains whitespace or a control character");
    }
    std::unordered_set<std::string_view> seen_qids;
    std::unordered_set<std::string_view> seen_docids;
    for (size_t q = 0; q < qids.size(); ++q) {
        if (!is_valid_field(qids[q])) {
            return Status::InvalidArgument("WriteRun: qid " + quote_field(qids[q]) +
                                           " is empty or contains whitespace or a control character");
        }
        if (!seen_qids.insert(qids[q]).second) {
            return Status::InvalidArgument("WriteRun: qid " + quote_field(qids[q]) + " is repeated");
        }
        seen_docids.clear();
        for (const auto& [docid, score] : results[q]) {
            if (!is_valid_field(docid)) {
                return Status::InvalidArgument("WriteRun: query " + quote_field(qids[q]) + ": docid " +
                                               quote_field(docid) +
                                               " is empty or contains whitespace or a control character");
            }
            if (!seen_docids.insert(docid).second) {
                return Status::InvalidArgument("WriteRun: query " + quote_field(qids[q]) + ": docid " +
                                               quote_field(docid) + " is repeated");
            }
            if (std::isnan(score)) {
                return Status::InvalidArgument("WriteRun: query " + quote_field(qids[q]) + ": docid " +
                                               quote_field(docid) + " has a NaN score");
            }
        }
    }
    return Status::OK();
}

Status write_run_impl(const std::string& path, const std::vector<std::string>& qids,
                      const std::vector<std::vector<std::pair<std::string, float>>>& results, const std::string& tag) {
    TMS_RETURN_IF_ERROR(validate_run_to_write(qids, results, tag));
    return index::WriteFileAtomically(path, [&](std::FILE* f) {
        for (size_t q = 0; q < qids.size(); ++q) {
            int64_t rank = 0;
            for (const auto& [docid, score] : results[q]) {
                ++rank;
                // %.9g prints every float exactly, so reading it back keeps the ranking.
                if (std::fprintf(f, "%s Q0 %s %lld %.9g %s\n", qids[q].c_str(), docid.c_str(),
                                 static_cast<long long>(rank), static_cast<double>(score), tag.c_str()) < 0) {
                    return false;
                }
            }
        }
        return true;
    });
}

struct RankedDoc {
    float sim;  // trec_eval keeps scores as float
    const std::string* docid;
};

/// A metric as named on the command line: its kind and cutoff (0: none).
struct Metric {
    enum Kind { kMap, kP, kNdcg, kRecall, kMrr, kSuccess } kind;
    int k = 0;
};

Status parse_metric(const std::string& name, Metric* m) {
    static const std::pair<const char*, Metric::Kind> kinds[] = {
        {"map", Metric::kMap},       {"P", Metric::kP},     {"ndcg", Metric::kNdcg},
        {"recall", Metric::kRecall}, {"mrr", Metric::kMrr}, {"success", Metric::kSuccess}};
    const auto at = name.find('@');
    const std::string base = name.substr(0, at);
    for (const auto& [n, kind] : kinds) {
        if (base != n) continue;
        m->kind = kind;
        m->k = 0;
        if (at != std::string::npos) {
            const std::string cut = name.substr(at + 1);
            int k = 0;
            if (cut.empty() || cut.size() > 9 || !parse_int(std::string_view(cut), &k) || k <= 0) {
                return Status::InvalidArgument("metric '" + name + "': the cutoff must be a positive integer");
            }
            m->k = k;
        }
        // Precision, recall and success are defined at a cutoff only.
        if (m->k == 0 && (kind == Metric::kP || kind == Metric::kRecall || kind == Metric::kSuccess)) {
            return Status::InvalidArgument("metric '" + name + "' needs a cutoff, e.g. " + base + "@10");
        }
        return Status::OK();
    }
    return Status::InvalidArgument("unknown metric '" + name +
                                   "' (known: map, map@K, P@K, ndcg, ndcg@K, recall@K, mrr, mrr@K, success@K)");
}

/// Computes one query's metrics; `docs` is the query's run, `judged` its qrels.
Status evaluate_query(const std::string& qid, const std::vector<std::pair<std::string, double>>& docs,
                      const std::map<std::string, int>& judged, const std::vector<Metric>& metrics,
                      std::vector<double>* values) {
    std::vector<RankedDoc> ranked;
    ranked.reserve(docs.size());
    for (const auto& [docid, score] : docs) {
        if (std::isnan(score)) {
            return Status::InvalidArgument("query " + quote_field(qid) + ": docid " + quote_field(docid) +
                                           " has a NaN score");
        }
        ranked.push_back({static_cast<float>(score), &docid});
    }
    // Duplicate docids make trec_eval fail; reject them too.
    std::vector<const std::string*> by_docid;
    by_docid.reserve(ranked.size());
    for (const RankedDoc& d : ranked) by_docid.push_back(d.docid);
    std::sort(by_docid.begin(), by_docid.end(), [](const std::string* a, const std::string* b) { return *a < *b; });
    for (size_t i = 1; i < by_docid.size(); ++i) {
        if (*by_docid[i] == *by_docid[i - 1]) {
            return Status::InvalidArgument("query " + quote_field(qid) + ": docid " + quote_field(*by_docid[i]) +
                                           " is repeated in the run");
        }
    }
    // trec_eval's comp_sim_docno: score descending, then docid descending.
    std::sort(ranked.begin(), ranked.end(), [](const RankedDoc& a, const RankedDoc& b) {
        if (a.sim != b.sim) return a.sim > b.sim;
        return *a.docid > *b.docid;
    });
    int64_t num_rel = 0;
    std::vector<int> positive_grades;
    for (const auto& [docid, rel] : judged) {
        if (rel >= 1) {
            ++num_rel;
            positive_grades.push_back(rel);
        }
    }
    std::sort(positive_grades.begin(), positive_grades.end(), std::greater<int>());
    // Per rank: the grade (absent from the qrels: not relevant, no gain).
    std::vector<int> grade(ranked.size());
    for (size_t i = 0; i < ranked.size(); ++i) {
        const auto it = judged.find(*ranked[i].docid);
        grade[i] = it == judged.end() ? 0 : it->second;
    }
    const auto depth = [&](int k) { return k > 0 ? std::min(ranked.size(), size_t(k)) : ranked.size(); };
    const auto dcg = [](const int* g, size_t n) {
        double s = 0;
        for (size_t i = 0; i < n; ++i)
            if (g[i] > 0) s += static_cast<double>(g[i]) / std::log2(static_cast<double>(i + 2));
        return s;
    };
    values->clear();
    for (const Metric& m : metrics) {
        const size_t n = depth(m.k);
        size_t rel_in = 0;
        for (size_t i = 0; i < n; ++i) rel_in += grade[i] >= 1;
        double v = 0;
        switch (m.kind) {
            case Metric::kMap: {  // map, map_cut_k: precision at each relevant rank, over all relevant
                size_t seen = 0;
                for (size_t i = 0; i < n; ++i) {
                    if (grade[i] >= 1) v += static_cast<double>(++seen) / static_cast<double>(i + 1);
                }
                v = num_rel > 0 ? v / static_cast<double>(num_rel) : 0;
                break;
            }
            case Metric::kP:  // P_k: over k, however many were retrieved
                v = static_cast<double>(rel_in) / static_cast<double>(m.k);
                break;
            case Metric::kNdcg: {  // ndcg, ndcg_cut_k
                const size_t ni = m.k > 0 ? std::min(positive_grades.size(), size_t(m.k)) : positive_grades.size();
                const double ideal = dcg(positive_grades.data(), ni);
                const double got = dcg(grade.data(), n);
                v = ideal > 0 ? got / ideal : got;
                break;
            }
            case Metric::kRecall:  // recall_k
                v = num_rel > 0 ? static_cast<double>(rel_in) / static_cast<double>(num_rel) : 0;
                break;
            case Metric::kMrr:  // recip_rank (on the top k)
                for (size_t i = 0; i < n; ++i) {
                    if (grade[i] >= 1) {
                        v = 1.0 / static_cast<double>(i + 1);
                        break;
                    }
                }
                break;
            case Metric::kSuccess:  // success_k
                v = rel_in > 0 ? 1 : 0;
                break;
        }
        values->push_back(v);
    }
    return Status::OK();
}

Status evaluate_impl(const Run& run, const Qrels& qrels, const std::vector<std::string>& names, bool per_query,
                     EvalResult* out) {
    if (out == nullptr) return Status::InvalidArgument("Evaluate: out is null");
    if (names.empty()) return Status::InvalidArgument("no metrics asked for");
    std::vector<Metric> metrics(names.size());
    for (size_t i = 0; i < names.size(); ++i) TMS_RETURN_IF_ERROR(parse_metric(names[i], &metrics[i]));
    EvalResult result;
    std::vector<double> sum(names.size(), 0.0), values;
    for (const auto& [qid, docs] : run) {
        auto judged = qrels.find(qid);
        if (judged == qrels.end()) continue;
        TMS_RETURN_IF_ERROR(evaluate_query(qid, docs, judged->second, metrics, &values));
        for (size_t i = 0; i < values.size(); ++i) sum[i] += values[i];
        if (per_query) result.per_query.emplace_back(qid, values);
        ++result.n_queries;
    }
    if (result.n_queries == 0) return Status::InvalidArgument("no query of the run is in the qrels");
    for (size_t i = 0; i < names.size(); ++i) {
        result.metrics.emplace_back(names[i], sum[i] / static_cast<double>(result.n_queries));
    }
    *out = std::move(result);
    return Status::OK();
}

/// Shortest decimal form that reads back as the same double; JSON-safe for finite values.
std::string format_double_exact(double v) {
    if (!std::isfinite(v)) return "null";
    char buf[64];
    auto [ptr, ec] = std::to_chars(buf, buf + sizeof(buf), v);
    if (ec != std::errc()) return "null";
    return std::string(buf, ptr);
}

}  // namespace

Status ReadRun(const std::string& path, Run* run) {
    return no_throw("ReadRun", [&] { return read_run_impl(path, run); });
}

Status ReadQrels(const std::string& path, Qrels* qrels) {
    return no_throw("ReadQrels", [&] { return read_qrels_impl(path, qrels); });
}

Status WriteRun(const std::string& path, const std::vector<std::string>& qids,
                const std::vector<std::vector<std::pair<std::string, float>>>& results, const std::string& tag) {
    return no_throw("WriteRun", [&] { return write_run_impl(path, qids, results, tag); });
}

Status Evaluate(const Run& run, const Qrels& qrels, EvalResult* out) {
    return Evaluate(run, qrels, kDefaultMetrics, false, out);
}

Status Evaluate(const Run& run, const Qrels& qrels, const std::vector<std::string>& metrics, bool per_query,
                EvalResult* out) {
    return no_throw("Evaluate", [&] { return evaluate_impl(run, qrels, metrics, per_query, out); });
}

Status ParseMetricList(const std::string& list, std::vector<std::string>* metrics) {
    std::vector<std::string> names;
    size_t start = 0;
    while (start <= list.size()) {
        const size_t comma = std::min(list.find(',', start), list.size());
        const std::string name(trim(std::string_view(list).substr(start, comma - start)));
        if (name.empty()) return Status::InvalidArgument("metric list '" + list + "': an empty name");
        Metric m;
        TMS_RETURN_IF_ERROR(parse_metric(name, &m));
        if (std::find(names.begin(), names.end(), name) != names.end()) {
            return Status::InvalidArgument("metric list '" + list + "': '" + name + "' is listed twice");
        }
        names.push_back(name);
        start = comma + 1;
    }
    *metrics = std::move(names);
    return Status::OK();
}

std::string FormatEval(const EvalResult& result, bool json) {
    std::string out;
    if (json) {
        out = "{\"n_queries\": " + std::to_string(result.n_queries);
        for (const auto& [name, value] : result.metrics) {
            out += ", \"" + json_escape(name) + "\": " + format_double_exact(value);
        }
        if (!result.per_query.empty()) {
            out += ", \"per_query\": {";
            for (size_t q = 0; q < result.per_query.size(); ++q) {
                out += (q ? ", \"" : "\"") + json_escape(result.per_query[q].first) + "\": {";
                for (size_t i = 0; i < result.metrics.size(); ++i) {
                    out += (i ? ", \"" : "\"") + json_escape(result.metrics[i].first) +
                           "\": " + format_double_exact(result.per_query[q].second[i]);
                }
                out += "}";
            }
            out += "}";
        }
        out += "}\n";
        return out;
    }
    char buf[64];
    // trec_eval -q: every query's lines, then the means.
    for (const auto& [qid, values] : result.per_query) {
        for (size_t i = 0; i < result.metrics.size(); ++i) {
            std::snprintf(buf, sizeof(buf), "%.4f", values[i]);
            out += result.metrics[i].first + "\t" + qid + "\t" + buf + "\n";
        }
    }
    for (const auto& [name, value] : result.metrics) {
        std::snprintf(buf, sizeof(buf), "%.4f", value);
        out += name + "\tall\t" + buf + "\n";
    }
    return out;
}

}  // namespace tms
