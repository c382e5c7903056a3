// Copyright TileMaxSim authors.
#include "tools/tms/query.h"

#include <omp.h>

#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <unordered_map>

#include "base/log.h"
#include "base/progress.h"
#include "server/explanation_json.h"
#include "engine/plan.h"
#include "index/ingest/files.h"
#include "nlohmann/json.hpp"

namespace tms::cli {

tms::Status load_queries(const SearchArgs& a, tms::HostArray* arr, tms::QueryBatch* all,
                         std::vector<std::string>* ids) {
    TMS_RETURN_IF_ERROR(tms::LoadNpy(a.queries, arr));
    tms::EmbeddingView view;
    TMS_RETURN_IF_ERROR(tms::EmbeddingsFromArray(*arr, 3, a.queries, &view));
    const int nq = static_cast<int>(arr->shape[0]), qt = static_cast<int>(arr->shape[1]);
    if (qt <= 0) return tms::Status::InvalidArgument(a.queries + ": queries have 0 tokens");
    all->data = view.data;
    all->dtype = view.dtype;
    all->n_queries = nq;
    all->q_tokens = qt;
    all->dim = view.dim;
    std::vector<std::string>& qids = *ids;
    if (!a.query_ids.empty()) {
        TMS_RETURN_IF_ERROR(tms::ReadLines(a.query_ids, &qids));
        if (static_cast<int>(qids.size()) != nq) {
            return tms::Status::InvalidArgument(a.query_ids + ": " + std::to_string(qids.size()) + " ids for " +
                                                std::to_string(nq) + " queries in " + a.queries);
        }
        for (size_t i = 0; i < qids.size(); ++i) {
            const bool bad = std::any_of(qids[i].begin(), qids[i].end(),
                                         [](char c) { return static_cast<unsigned char>(c) <= 0x20 || c == 0x7f; });
            if (bad) {
                return tms::Status::InvalidArgument(a.query_ids + ":" + std::to_string(i + 1) +
                                                    ": id contains whitespace or a control character");
            }
        }
    } else {
        for (int i = 0; i < nq; ++i) qids.push_back(std::to_string(i));
    }
    return tms::Status::OK();
}

tms::Status load_estimate_sample(const std::string& path, EstimateSample* s, tms::EstimateOptions* eo) {
    if (path.empty()) return tms::Status::OK();
    SearchArgs a;
    a.queries = path;
    std::vector<std::string> unused_ids;
    TMS_RETURN_IF_ERROR(load_queries(a, &s->arr, &s->batch, &unused_ids));
    eo->sample = &s->batch;
    return tms::Status::OK();
}

tms::Status load_estimate_input(const std::string& docs, const std::string& doclens, EstimateInput* in,
                                tms::EstimateOptions* eo) {
    if (docs.empty()) return tms::Status::OK();
    TMS_RETURN_IF_ERROR(tms::index::MappedNpy::Open(docs, &in->docs));
    TMS_RETURN_IF_ERROR(tms::index::EmbeddingsFromRaw(in->docs->header(), in->docs->data(), 2, docs, &in->view));
    tms::HostArray lens;
    TMS_RETURN_IF_ERROR(tms::LoadNpy(doclens, &lens));
    TMS_RETURN_IF_ERROR(tms::IntegersFromArray(lens, doclens, &in->lens));
    eo->documents = &in->view;
    eo->doc_lengths = &in->lens;
    return tms::Status::OK();
}

tms::Status search_options(const SearchArgs& a, bool quiet, tms::SearchOptions* opts, tms::SearcherOptions* so) {
    *opts = a.opts;
    opts->pruning = parse_pruning(a.pruning);
    TMS_RETURN_IF_ERROR(tms::ParseSearchMode(a.mode, &opts->mode));
    TMS_RETURN_IF_ERROR(tms::ParseFusion(a.fusion, &opts->fusion));
    TMS_RETURN_IF_ERROR(parse_placement(a.device, a.devices, a.vectors, so));
    so->load_vectors = true;
    so->stream_bytes = a.stream_mib << 20;
    so->filter_time_ms = a.filter_time_ms;
    so->filter_max_bytes = a.filter_max_bytes;
    so->progress = !quiet && !a.no_progress;
    so->record_queries = a.record_queries.empty() ? 0 : a.record_max;
    return tms::Status::OK();
}

// The queries --record-queries' file holds already (none when it does not exist), each one's rows.
tms::Status read_served_queries(const SearchArgs& a, size_t dim, std::vector<std::vector<uint16_t>>* rows) {
    std::error_code ec;
    if (std::filesystem::exists(a.record_queries, ec)) {
        tms::HostArray old;
        TMS_RETURN_IF_ERROR(tms::LoadNpy(a.record_queries, &old).WithContext("--record-queries"));
        if (old.descr != "<f2" || old.shape.size() != 3 || old.shape[2] != int64_t(dim)) {
            return tms::Status::InvalidArgument(a.record_queries + ": not a sample of queries of dimension " +
                                                std::to_string(dim) + " (float16 [n, tokens, " + std::to_string(dim) +
                                                "]): give --record-queries a new file or one it wrote");
        }
        const size_t row = size_t(old.shape[1]) * dim;
        const auto* p = reinterpret_cast<const uint16_t*>(old.bytes.data());
        for (int64_t i = 0; i < old.shape[0]; ++i) rows->emplace_back(p + size_t(i) * row, p + size_t(i + 1) * row);
    }
    return tms::Status::OK();
}

// --record-queries: the searcher's sample of this run's queries merged with the file's (a
// uniform random subset of both, at most --record-max queries), written over it atomically.
tms::Status save_served_queries(const SearchArgs& a, const tms::Searcher& s, bool quiet) {
    const tms::ServedQueries mine = s.Served();
    const size_t dim = size_t(mine.dim);
    std::vector<std::vector<uint16_t>> rows;  // each query's rows
    TMS_RETURN_IF_ERROR(read_served_queries(a, dim, &rows));
    const size_t mrow = size_t(mine.q_tokens) * dim;
    for (int i = 0; i < mine.n_queries; ++i) {
        rows.emplace_back(mine.tokens.begin() + ptrdiff_t(size_t(i) * mrow),
                          mine.tokens.begin() + ptrdiff_t(size_t(i + 1) * mrow));
    }
    if (rows.empty()) return tms::Status::OK();
    if (rows.size() > size_t(a.record_max)) {
        std::mt19937_64 rng(uint64_t(mine.seen) * 0x9E3779B97F4A7C15ull + rows.size());
        std::shuffle(rows.begin(), rows.end(), rng);
        rows.resize(size_t(a.record_max));
    }
    size_t qt = 0;
    for (const auto& r : rows) qt = std::max(qt, r.size() / dim);
    std::vector<uint16_t> out(rows.size() * qt * dim, 0);  // zero rows pad the shorter queries
    for (size_t i = 0; i < rows.size(); ++i)
        std::copy(rows[i].begin(), rows[i].end(), out.begin() + ptrdiff_t(i * qt * dim));
    TMS_RETURN_IF_ERROR(tms::SaveNpy(a.record_queries, "<f2", {int64_t(rows.size()), int64_t(qt), int64_t(dim)},
                                     out.data(), out.size() * sizeof(uint16_t))
                            .WithContext("--record-queries"));
    if (!quiet) {
        tms::LogInfo("tms search: %d of %lld queries sampled; %s holds %zu (tms estimate --sample %s)\n",
                     mine.n_queries, (long long)mine.seen, a.record_queries.c_str(), rows.size(),
                     a.record_queries.c_str());
    }
    return tms::Status::OK();
}

tms::Status check_query_dim(const SearchArgs& a, const tms::QueryBatch& all, const tms::IndexInfo& info) {
    if (all.dim == info.dim) return tms::Status::OK();
    return tms::Status::InvalidArgument(a.queries + ": query dimension " + std::to_string(all.dim) +
                                        " differs from the index's " + std::to_string(info.dim));
}

tms::Status read_query_texts(const SearchArgs& a, const tms::QueryBatch& all, std::vector<std::string>* texts) {
    if (a.query_text.empty()) {
        return tms::Status::InvalidArgument("--mode " + a.mode +
                                            " needs --query-text FILE (each query's text, one per line)");
    }
    TMS_RETURN_IF_ERROR(tms::ReadLines(a.query_text, texts));
    if (texts->size() != size_t(all.n_queries)) {
        return tms::Status::InvalidArgument(a.query_text + ": " + std::to_string(texts->size()) + " texts for " +
                                            std::to_string(all.n_queries) + " queries in " + a.queries +
                                            " (one line per query)");
    }
    return tms::Status::OK();
}

tms::Status open_query_job(const SearchArgs& a, bool quiet, QueryJob* j) {
    TMS_RETURN_IF_ERROR(load_queries(a, &j->arr, &j->whole, &j->qids));
    tms::SearcherOptions so;
    TMS_RETURN_IF_ERROR(search_options(a, quiet, &j->opts, &so));
    if (j->opts.mode != tms::SearchMode::kMaxSim) TMS_RETURN_IF_ERROR(read_query_texts(a, j->whole, &j->texts));
    TMS_RETURN_IF_ERROR(tms::Searcher::Open(so, a.index, &j->searcher));
    return check_query_dim(a, j->whole, j->searcher->info());
}

// nothing). Ids the index does not hold allow nothing; a note on stderr counts them.
tms::Status read_subset(const std::string& path, const tms::Searcher& s, const std::vector<std::string>& qids,
                        bool quiet, std::vector<std::vector<int64_t>>* rows) {
    std::vector<std::string> lines;
    TMS_RETURN_IF_ERROR(tms::ReadLines(path, &lines));
    std::vector<std::string> ids;
    std::vector<size_t> row;  // per query: the query of each id
    std::unordered_map<std::string, size_t> qindex;
    for (size_t i = 0; i < qids.size(); ++i) qindex.emplace(qids[i], i);
    int64_t unknown_queries = 0, n_lines = 0;
    bool tabbed = false;
    for (size_t i = 0; i < lines.size(); ++i) {
        std::string l = lines[i];
        if (!l.empty() && l.back() == '\r') l.pop_back();
        if (l.empty()) continue;
        const size_t tab = l.find('\t');
        if (n_lines++ == 0) tabbed = tab != std::string::npos;
        if (tabbed != (tab != std::string::npos) || (tabbed && l.find('\t', tab + 1) != std::string::npos)) {
            return tms::Status::InvalidArgument(path + ":" + std::to_string(i + 1) + ": want " +
                                                (tabbed ? "QUERY_ID<TAB>DOC_ID" : "one DOC_ID") +
                                                " per line, as the first line has");
        }
        if (!tabbed) {
            ids.push_back(std::move(l));
            continue;
        }
        const auto q = qindex.find(l.substr(0, tab));
        if (q == qindex.end()) {
            ++unknown_queries;
            continue;
        }
        row.push_back(q->second);
        ids.push_back(l.substr(tab + 1));
    }
    std::vector<int64_t> internal;
    s.FindDocs(ids, &internal);
    int64_t unknown = 0;
    rows->assign(tabbed ? qids.size() : 1, {});
    for (size_t i = 0; i < internal.size(); ++i) {
        if (internal[i] < 0)
            ++unknown;
        else
            (*rows)[tabbed ? row[i] : 0].push_back(internal[i]);
    }
    if (!quiet && unknown > 0) {
        tms::LogWarning("tms search: %s: %lld of %zu documents are not in the index (or deleted): ignored\n",
                        path.c_str(), (long long)unknown, ids.size());
    }
    if (!quiet && unknown_queries > 0) {
        tms::LogWarning("tms search: %s: %lld lines name queries not among the queries: ignored\n", path.c_str(),
                        (long long)unknown_queries);
    }
    return tms::Status::OK();
}

tms::Status check_run_output(const SearchArgs& a, const std::string& first_stage) {
    return tms::CheckOutputPath(a.out, tms::OutputKind::kFile,
                                {{"--queries", a.queries},
                                 {"--query-ids", a.query_ids},
                                 {"--subset", a.subset},
                                 {"--query-text", a.query_text},
                                 {"--run", first_stage},
                                 {"--index", a.index}})
        .WithContext("--out");
}

tms::Status run_search(const SearchArgs& a, bool quiet, double* qps) {
    if (a.opts.k <= 0) return tms::Status::InvalidArgument("--k must be > 0, got " + std::to_string(a.opts.k));
    TMS_RETURN_IF_ERROR(check_run_output(a));
    // Every file the search reads or writes, by option: no side output may be another of them
    // (--out: check_run_output).
    struct NamedFile {
        const char* option;
        const std::string& path;
        bool side_output;
    };
    const NamedFile files[] = {{"--queries", a.queries, false},
                               {"--query-ids", a.query_ids, false},
                               {"--query-text", a.query_text, false},
                               {"--subset", a.subset, false},
                               {"--out", a.out, false},
                               {"--record-queries", a.record_queries, true},
                               {"--explain", a.explain, true},
                               {"--certificates", a.certificates, true},
                               {"--index", a.index, false}};
    for (const NamedFile& f : files) {
        if (!f.side_output || f.path.empty()) continue;
        std::vector<std::pair<std::string, std::string>> others;
        for (const NamedFile& g : files)
            if (&g != &f) others.emplace_back(g.option, g.path);
        TMS_RETURN_IF_ERROR(tms::CheckOutputPath(f.path, tms::OutputKind::kFile, others).WithContext(f.option));
    }
    QueryJob job;
    TMS_RETURN_IF_ERROR(open_query_job(a, quiet, &job));
    const tms::QueryBatch& whole = job.whole;
    const std::vector<std::string>& qids = job.qids;
    if (!a.record_queries.empty()) {  // a file that is not a sample fails before the search
        std::vector<std::vector<uint16_t>> held;
        TMS_RETURN_IF_ERROR(read_served_queries(a, size_t(job.searcher->info().dim), &held));
    }
    tms::SearchOptions& opts = job.opts;
    const tms::Searcher* searcher = job.searcher.get();
    const int nq = whole.n_queries;
    const int64_t n_docs = searcher->info().n_docs;
    // --subset's rows: one for every query (1 row), or one per query (each batch's slice of them).
    std::vector<std::vector<int64_t>> subset;
    if (!a.subset.empty()) TMS_RETURN_IF_ERROR(read_subset(a.subset, *searcher, qids, quiet, &subset));
    const auto allow = [&](int q0, int n) {
        auto set = std::make_shared<tms::DocSet>(n_docs, n);
        for (int i = 0; i < n; ++i)
            for (int64_t d : subset[size_t(q0 + i)]) set->Add(i, d);
        opts.allow = std::move(set);
    };
    if (subset.size() == 1) allow(0, 1);
    std::vector<std::vector<std::pair<std::string, float>>> all(nq);
    std::string explained;  // --explain's JSON lines
    tms::SearchTimings phase;
    // Per query: 1 certified, 0 not, -1 not certified nor searched to be (SearchTimings).
    std::vector<int> certified(size_t(nq), -1), depth(size_t(nq), 0);
    int adapted = 0;  // queries whose search could go deeper where not settled (SearchOptions::adaptive)
    tms::Progress prog("searching", nq, !quiet && !a.no_progress, " q");
    const auto t0 = Clock::now();
    for (int q0 = 0; q0 < nq; q0 += a.batch) {
        const tms::QueryBatch b = whole.Slice(q0, std::min(a.batch, nq - q0));
        std::vector<std::vector<tms::SearchHit>> res;
        tms::SearchTimings t;
        if (subset.size() > 1) allow(q0, b.n_queries);
        if (!job.texts.empty()) {
            opts.query_texts = std::make_shared<const std::vector<std::string>>(job.texts.begin() + q0,
                                                                                job.texts.begin() + q0 + b.n_queries);
        }
        TMS_RETURN_IF_ERROR(searcher->Search(b, opts, &res, &t));
        phase.candidates += t.candidates;
        phase.scoring += t.scoring;
        phase.rerank += t.rerank;
        for (size_t i = 0; i < t.certified.size() && int(i) < b.n_queries; ++i)
            certified[size_t(q0) + i] = t.certified[i];
        for (size_t i = 0; i < t.depth.size() && int(i) < b.n_queries; ++i) {
            depth[size_t(q0) + i] = t.depth[i];
            adapted += t.certified.empty();
        }
        if (!a.explain.empty()) {
            std::vector<std::vector<int64_t>> docs(res.size());
            for (size_t i = 0; i < res.size(); ++i)
                for (const tms::SearchHit& h : res[i]) docs[i].push_back(h.internal_id);
            std::vector<std::vector<tms::Explanation>> ex;
            TMS_RETURN_IF_ERROR(searcher->Explain(b, docs, &ex));
            for (size_t i = 0; i < res.size(); ++i) {
                for (size_t j = 0; j < res[i].size(); ++j) {
                    nlohmann::json line = tms::server::ExplanationJson(ex[i][j]);
                    line["query"] = qids[size_t(q0) + i];
                    line["doc"] = res[i][j].doc_id;
                    line["score"] = res[i][j].score;
                    explained += line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
                }
            }
        }
        for (int i = 0; i < b.n_queries; ++i) {
            for (auto& h : res[i]) all[q0 + i].emplace_back(std::move(h.doc_id), h.score);
        }
        prog.Add(b.n_queries);
    }
    prog.Done();
    const double secs = tms::SecondsSince(t0);
    *qps = secs > 0 ? nq / secs : 0;
    TMS_RETURN_IF_ERROR(tms::WriteRun(a.out, qids, all, a.tag));
    if (!a.explain.empty()) {
        TMS_RETURN_IF_ERROR(tms::index::WriteFileAtomically(a.explain, [&](std::FILE* f) {
            return std::fwrite(explained.data(), 1, explained.size(), f) == explained.size();
        }));
    }
    if (!a.certificates.empty()) {
        std::string tsv = "query\tcertified\tdepth\n";
        for (int i = 0; i < nq; ++i) {
            tsv += qids[size_t(i)] + "\t" +
                   (certified[size_t(i)] < 0 ? std::string("-") : std::to_string(certified[size_t(i)])) + "\t" +
                   std::to_string(depth[size_t(i)]) + "\n";
        }
        TMS_RETURN_IF_ERROR(tms::index::WriteFileAtomically(
            a.certificates, [&](std::FILE* f) { return std::fwrite(tsv.data(), 1, tsv.size(), f) == tsv.size(); }));
    }
    if (!a.record_queries.empty()) TMS_RETURN_IF_ERROR(save_served_queries(a, *searcher, quiet));
    if (!quiet) {
        tms::LogInfo("tms search: %d queries in %.3f s (%.1f queries/s, %s%s) -> %s\n", nq, secs, *qps,
                     tms::DeviceName(searcher->device()), a.opts.exhaustive ? ", exhaustive" : "", a.out.c_str());
        tms::LogInfo("tms search: candidates %.3f s, scoring %.3f s, rerank %.3f s\n", phase.candidates, phase.scoring,
                     phase.rerank);
        int n_cert = 0, n_tried = 0, n_again = 0;
        for (int i = 0; i < nq; ++i) {
            n_tried += certified[size_t(i)] >= 0;
            n_cert += certified[size_t(i)] == 1;
            n_again += certified[size_t(i)] >= 0 && depth[size_t(i)] > 0;
        }
        if (n_tried > 0) {
            tms::LogInfo("tms search: %d of %d queries certified (%d searched again, deeper)\n", n_cert, n_tried,
                         n_again);
        }
        if (adapted > 0) {
            int n_deeper = 0;
            for (int i = 0; i < nq; ++i) n_deeper += certified[size_t(i)] < 0 && depth[size_t(i)] > 0;
            tms::LogInfo("tms search: %d of %d queries not settled by their codes, searched again deeper\n", n_deeper,
                         adapted);
        }
        if (!a.opts.exhaustive) {
            const tms::SearchOptions t = searcher->Plan(opts);
            if (t.exhaustive) {
                const tms::IndexInfo& info = searcher->info();
                tms::LogInfo(
                    "tms search: exhaustive: cheaper than the approximate search on %lld "
                    "live documents (at most %lld on the %s; --target-recall 0 searches approximately)\n",
                    (long long)(info.n_docs - info.n_deleted), (long long)tms::SmallIndexDocs(searcher->device(), t),
                    tms::DeviceName(searcher->device()));
            } else if (a.opts.target_recall > 0) {
                const bool moved =
                    t.nprobe != a.opts.nprobe || t.ncandidates != a.opts.ncandidates || t.rerank != a.opts.rerank;
                tms::LogInfo(
                    "tms search: target recall %.2f: nprobe %d, ncandidates %d, rerank %d%s%s\n", a.opts.target_recall,
                    t.nprobe, t.ncandidates, t.rerank, moved ? " (the index's estimate)" : "",
                    t.adaptive && t.certify_steps > 0
                        ? (", each query not settled " + std::to_string(t.certify_steps) + " steps deeper").c_str()
                        : "");
            }
        }
        int64_t vbytes = 0;
        for (const tms::ShardPlacement& p : searcher->placement()) vbytes += p.vector_bytes;
        const tms::VectorTier tier =
            searcher->placement().empty() ? tms::VectorTier::kNone : searcher->placement()[0].vectors;
        tms::LogInfo("tms search: vectors %s (%.2f GB)\n", tms::VectorTierName(tier), double(vbytes) / 1e9);
        if (searcher->placement().size() > 1) {
            std::string where;
            for (const tms::ShardPlacement& p : searcher->placement()) {
                where += (where.empty() ? "" : ", ") + std::to_string(p.shard) + ":" +
                         (p.device == tms::Device::kGpu ? "gpu " + std::to_string(p.gpu) : std::string("cpu"));
            }
            tms::LogInfo("tms search: %zu shards (%s)\n", searcher->placement().size(), where.c_str());
        }
    }
    return tms::Status::OK();
}

void add_search_options(CLI::App* c, SearchArgs* a) {
    c->add_option("--k", a->opts.k, "Results per query (more than the index's documents: all of them)")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000000));
    c->add_flag("--exhaustive", a->opts.exhaustive,
                "Exact MaxSim over every document (needs an index built with --keep-vectors)");
    c->add_option("--device", a->device, "Where to score: auto, cpu or gpu")->capture_default_str();
    c->add_option("--devices", a->devices,
                  "Where the shards go: cpu, all (every GPU), or GPUs like 0 or 0,1 (shards placed by size; "
                  "default: every GPU present, else cpu); overrides --device");
    c->add_option("--vectors", a->vectors, kVectorsHelp)->capture_default_str();
    c->add_option("--stream-mib", a->stream_mib, kStreamHelp)->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--target-recall", a->opts.target_recall,
                  "The speed/recall knob. With the index's recall estimate (tms index --keep-vectors): --nprobe, "
                  "--ncandidates and --rerank, where not given, from the cheapest measured setting whose "
                  "estimated recall@10 reaches this (below the default target also settings cheaper than the "
                  "defaults, e.g. 0.9); a small index is searched exhaustively, exact and cheaper (at most "
                  "--rerank live documents on a CPU, 2 x --ncandidates on a GPU). 0: the settings exactly as "
                  "given")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--nprobe", a->opts.nprobe, "Centroids probed per query token")
        ->capture_default_str()
        ->check(CLI::Range(1, 1 << 24));
    c->add_option("--ncandidates", a->opts.ncandidates, "Candidates kept after pruning (0: all the probes reach)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 30));
    c->add_option("--pruning", a->pruning,
                  "How candidates are pruned to --ncandidates: probe (scored by the probed centroids that hold "
                  "them) or interaction (PLAID's centroid interaction over every candidate token)")
        ->capture_default_str()
        ->check(CLI::IsMember({"interaction", "probe"}));
    c->add_option("--rerank", a->opts.rerank,
                  "Top compressed candidates rescored exactly when vectors are stored (0: none)")
        ->capture_default_str()
        ->check(CLI::Range(0, 1 << 30));
    c->add_option("--batch", a->batch, "Queries per search call")->capture_default_str()->check(CLI::Range(1, 1 << 20));
    c->add_option("--filter", a->opts.filter,
                  "Only documents whose metadata match this SQL WHERE expression, e.g. \"tenant = 7 AND year >= "
                  "2024\" (columns as `tms info` lists them; applied during candidate generation)");
    c->add_option("--filter-time-ms", a->filter_time_ms,
                  "A --filter's evaluation may take this many milliseconds; past it the search fails")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(86400000)));
    c->add_option("--filter-max-bytes", a->filter_max_bytes,
                  "No value a --filter computes may be longer than this many bytes (bounds its memory); "
                  "past it the search fails")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(1), int64_t(INT32_MAX)));
    c->add_option("--subset", a->subset,
                  "Only these documents: a file of external ids, one per line (every query), or QUERY_ID<TAB>DOC_ID "
                  "lines (per query; a query with no line gets no results); with --filter, both must hold");
    c->add_option("--mode", a->mode,
                  "maxsim (late interaction over --queries), bm25 (the queries' texts alone, BM25 over the index's "
                  "text: tms index --text-field) or hybrid (both, fused; BM25's best --lexical-candidates join the "
                  "MaxSim candidates and every one is scored exactly)")
        ->capture_default_str()
        ->check(CLI::IsMember({"maxsim", "bm25", "hybrid"}));
    c->add_option("--query-text", a->query_text,
                  "Each query's text, one line per query in --queries' order (--mode bm25 and hybrid)")
        ->check(CLI::ExistingFile);
    c->add_option("--fusion", a->fusion,
                  "How hybrid search fuses its rankings: weighted (each ranking's scores scaled to [0, 1], "
                  "weighted sum) or rrf (reciprocal rank, 1 / (60 + rank))")
        ->capture_default_str()
        ->check(CLI::IsMember({"rrf", "weighted"}));
    c->add_option("--bm25-weight", a->opts.bm25_weight, "BM25's weight in hybrid fusion (MaxSim's: 1 - this)")
        ->capture_default_str()
        ->check(CLI::Range(0.0, 1.0));
    c->add_option("--lexical-candidates", a->opts.lexical_candidates,
                  "Hybrid search: BM25's best this many join the MaxSim search's best this many")
        ->capture_default_str()
        ->check(CLI::Range(1, 100000));
    c->add_flag("!--no-adaptive", a->opts.adaptive,
                "Every query at the setting --target-recall plans (the index's estimate), instead of at the "
                "defaults with each query whose exact top-k was not among the first 1.6 k of its compressed "
                "ranking searched again --certify-steps deeper (at least 2)");
    c->add_flag("--certify", a->opts.certify,
                "Certify each query's top-k: after the exact rerank a query whose k-th score does not clear "
                "what the documents left out could score, judged by how its reranked documents' exact scores "
                "exceed their approximate ones, is searched once more, --certify-steps deeper (needs stored "
                "vectors and --pruning probe)");
    c->add_option("--certify-steps", a->opts.certify_steps,
                  "How much deeper a query not certified (--certify) or not settled (the default search) is "
                  "searched again: each step doubles the rerank (and, where the candidates' bound failed or the "
                  "query was not settled, the candidates, and probes half again as many lists); 0: not again; "
                  "-1: as deep as the index's estimated setting for --target-recall (at least 1 step certified, 2 "
                  "not settled), else 3 certified, 2 not settled")
        ->capture_default_str()
        ->check(CLI::Range(-1, 8));
    c->add_option("--certificates", a->certificates,
                  "Also write each query's certification, TSV: query, certified (1, 0, or - where the search did "
                  "not certify: no --certify, exhaustive, no vectors), depth (how many steps deeper its second "
                  "search was, certified or not settled; 0: searched once)");
    c->add_option("--explain", a->explain,
                  "Also write why each hit matched, JSON lines: per hit its query, doc, score, maxsim, and per "
                  "query token the best document token (doc_tokens) and its similarity; from the stored vectors "
                  "where readable on the host (--vectors host or disk on a GPU), else the decoded codes "
                  "(from_codes true)");
    c->add_option("--direct-max", a->opts.direct_max,
                  "With --filter or --subset: a query allowed at most this many documents scores all of them "
                  "instead of probing (-1: as many as the widest probing visits, at least 65,536)")
        ->capture_default_str()
        ->check(CLI::Range(int64_t(-1), int64_t(1) << 40));
#if TMS_WITH_MPI
    c->add_option("--mpi-timeout", a->mpi_timeout,
                  "Under mpirun: seconds any rank waits for the others before ending the job")
        ->capture_default_str()
        ->check(CLI::PositiveNumber);
#endif
    c->add_flag("--no-progress", a->no_progress, "No progress bars");
}

}  // namespace tms::cli
