// Copyright TileMaxSim authors. tilemaxsim._core: the engine's C++ API for Python (pybind11).
// The Python package (tilemaxsim/__init__.py) converts inputs (numpy, torch, lists) into the
// C-contiguous arrays these functions take; every long call releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <regex>
#include <stdexcept>
#include <string>
#include <vector>

#include "tilemaxsim/tilemaxsim.h"

namespace py = pybind11;

namespace {

// The engine's Status as a C++ exception (thrown with or without the GIL), translated to a
// Python one carrying its one-line message: ValueError (bad input), FileNotFoundError, or
// tilemaxsim.Error.
struct EngineError : std::runtime_error {
    using std::runtime_error::runtime_error;
};
struct NotFoundError : std::runtime_error {
    using std::runtime_error::runtime_error;
};

void check(const tms::Status& st) {
    if (st.ok()) return;
    if (st.code() == tms::Status::Code::kInvalidArgument) throw py::value_error(st.message());
    if (st.code() == tms::Status::Code::kNotFound) throw NotFoundError(st.message());
    throw EngineError(st.message());
}

// An updater's refusal of a batch's ids in Python's words: it names them as a file's lines and
// the CLI's option ("doc-ids: line 3: id 'x' is already in the index (use --replace ...)"). An
// id already there is a ValueError, one the index does not hold a KeyError.
[[noreturn]] void throw_id_error(const tms::Status& st) {
    std::string m = st.message();
    static const std::regex line(R"(^doc-ids: line (\d+): )");
    std::smatch at;
    if (std::regex_search(m, at, line)) m = "ids[" + std::to_string(std::stoll(at[1]) - 1) + "]: " + at.suffix().str();
    const std::string cli = "(use --replace to replace it)", py = "(pass replace=True to replace it)";
    if (const size_t p = m.find(cli); p != std::string::npos) m.replace(p, cli.size(), py);
    if (st.code() == tms::Status::Code::kNotFound) throw py::key_error(m);
    throw py::value_error(m);
}

// dtype: "f32", "f16" or "bf16" (bf16 travels as uint16 bits).
tms::DType parse_dtype(const std::string& d) {
    if (d == "f32") return tms::DType::kF32;
    if (d == "f16") return tms::DType::kF16;
    if (d == "bf16") return tms::DType::kBF16;
    throw py::value_error("dtype must be f32, f16 or bf16, got " + d);
}

// A C-contiguous array of `rank` dimensions whose items are `dtype`'s size.
void check_array(const py::array& a, int rank, tms::DType dtype, const char* what) {
    if (a.ndim() != rank) {
        throw py::value_error(std::string(what) + ": expected " + std::to_string(rank) + " dimensions, got " +
                              std::to_string(a.ndim()));
    }
    if (!(a.flags() & py::array::c_style)) throw py::value_error(std::string(what) + ": not C-contiguous");
    if (a.itemsize() != tms::DTypeSize(dtype)) throw py::value_error(std::string(what) + ": wrong item size");
}

std::vector<int64_t> as_lengths(const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& l) {
    if (l.ndim() != 1) throw py::value_error("lengths: expected one dimension");
    return std::vector<int64_t>(l.data(), l.data() + l.size());
}

py::dict info_dict(const tms::IndexInfo& i) {
    py::dict d;
    d["n_docs"] = i.n_docs;
    d["n_live_docs"] = i.n_docs - i.n_deleted;
    d["n_deleted"] = i.n_deleted;
    d["n_tokens"] = i.n_tokens;
    d["dim"] = i.dim;
    d["n_centroids"] = i.n_centroids;
    d["codec"] = i.codec;
    d["pq_m"] = i.pq_m;
    d["pq_nbits"] = i.pq_nbits;
    d["residual_nbits"] = i.residual_nbits;
    d["has_vectors"] = i.has_vectors;
    d["unit_norm"] = i.unit_norm;
    d["format_version"] = i.format_version;
    d["n_shards"] = i.shards.size();
    d["build_config"] = i.build_config_json;
    d["metadata_rows"] = i.metadata_rows;  // -1: no metadata
    py::dict cols;
    for (const auto& c : i.metadata_columns) cols[py::str(c.name)] = tms::MetaTypeName(c.type);
    d["metadata_columns"] = cols;
    return d;
}

// Hits as (ids per query, scores per query as float32 arrays).
py::tuple hits_to_python(const std::vector<std::vector<tms::SearchHit>>& res) {
    py::list ids, scores;
    for (const auto& q : res) {
        py::list qi;
        py::array_t<float> qs(static_cast<py::ssize_t>(q.size()));
        auto* s = qs.mutable_data();
        for (size_t j = 0; j < q.size(); ++j) {
            qi.append(py::str(q[j].doc_id));
            s[j] = q[j].score;
        }
        ids.append(qi);
        scores.append(qs);
    }
    return py::make_tuple(ids, scores);
}

tms::QueryBatch query_batch(const py::array& q, const std::string& dtype, const std::vector<int32_t>& lens) {
    const tms::DType dt = parse_dtype(dtype);
    check_array(q, 3, dt, "queries");
    tms::QueryBatch b;
    b.data = q.data();
    b.dtype = dt;
    b.n_queries = static_cast<int>(q.shape(0));
    b.q_tokens = static_cast<int>(q.shape(1));
    b.dim = static_cast<int>(q.shape(2));
    if (!lens.empty()) {
        if (int64_t(lens.size()) != b.n_queries) throw py::value_error("lengths: one per query");
        b.lengths = lens.data();
    }
    return b;
}

class PySearcher {
public:
    PySearcher(const std::string& path, const std::string& device, bool load_vectors, int threads, bool progress,
               const std::string& vectors, int64_t filter_time_ms, int64_t filter_max_bytes, int record_queries) {
        tms::SearcherOptions o;
        o.record_queries = record_queries;
        o.filter_time_ms = filter_time_ms;
        o.filter_max_bytes = filter_max_bytes;
        check(tms::ParseDeviceList(device, &o));
        check(tms::ParseVectorTier(vectors, &o.vectors));
        o.load_vectors = load_vectors;
        o.threads = threads;
        o.progress = progress;
        py::gil_scoped_release nogil;
        std::unique_ptr<tms::Searcher> opened;
        check(tms::Searcher::Open(o, path, &opened));
        s_ = std::move(opened);
    }

    static tms::SearchOptions search_options(int k, bool exhaustive, int nprobe, int ncandidates, int rerank,
                                             const std::string& pruning, const std::string& filter,
                                             double target_recall) {
        tms::SearchOptions o;
        o.k = k;
        o.exhaustive = exhaustive;
        o.nprobe = nprobe;
        o.ncandidates = ncandidates;
        o.rerank = rerank;
        o.filter = filter;
        if (!(target_recall >= 0 && target_recall <= 1)) {
            throw py::value_error("target_recall must be in [0, 1], got " + std::to_string(target_recall));
        }
        o.target_recall = target_recall;
        if (pruning != "probe" && pruning != "interaction") {
            throw py::value_error("pruning must be probe or interaction, got " + pruning);
        }
        o.pruning = pruning == "probe" ? tms::Pruning::kProbe : tms::Pruning::kInteraction;
        return o;
    }

    // The settings a search with these options runs (Searcher::Plan).
    py::dict plan(int k, bool exhaustive, int nprobe, int ncandidates, int rerank, const std::string& pruning,
                  double target_recall) {
        const tms::SearchOptions p =
            s_->Plan(search_options(k, exhaustive, nprobe, ncandidates, rerank, pruning, "", target_recall));
        py::dict d;
        d["exhaustive"] = p.exhaustive;
        d["nprobe"] = p.nprobe;
        d["ncandidates"] = p.ncandidates;
        d["rerank"] = p.rerank;
        d["target_recall"] = p.target_recall;
        d["deeper_steps"] = p.adaptive ? p.certify_steps : 0;  // a query not settled (adaptive)
        return d;
    }

    // subset: allowed external ids, none (no subset), one list (every query) or one per query.
    // mode maxsim, bm25 or hybrid; texts: one per query (bm25, hybrid).
    py::tuple search(const py::array& q, const std::string& dtype, const std::vector<int32_t>& lens, int k,
                     bool exhaustive, int nprobe, int ncandidates, int rerank, const std::string& pruning,
                     const std::string& filter, double target_recall,
                     const std::vector<std::vector<std::string>>& subset, const std::string& mode,
                     const std::vector<std::string>& texts, const std::string& fusion, double bm25_weight,
                     int lexical_candidates, bool certify, int certify_steps, bool adaptive) {
        tms::QueryBatch b = query_batch(q, dtype, lens);
        tms::SearchOptions o =
            search_options(k, exhaustive, nprobe, ncandidates, rerank, pruning, filter, target_recall);
        o.certify = certify;
        o.certify_steps = certify_steps;
        o.adaptive = adaptive;
        check(tms::ParseSearchMode(mode, &o.mode));
        check(tms::ParseFusion(fusion, &o.fusion));
        o.bm25_weight = bm25_weight;
        o.lexical_candidates = lexical_candidates;
        if (o.mode != tms::SearchMode::kMaxSim) o.query_texts = std::make_shared<const std::vector<std::string>>(texts);
        if (subset.size() > 1 && int64_t(subset.size()) != b.n_queries) {
            throw py::value_error("subset: " + std::to_string(subset.size()) + " lists for " +
                                  std::to_string(b.n_queries) + " queries (one list, or one per query)");
        }
        std::vector<std::vector<tms::SearchHit>> res;
        tms::SearchTimings t;
        const std::shared_ptr<const tms::Searcher> s = s_;  // a refresh() meanwhile leaves it
        {
            py::gil_scoped_release nogil;
            if (!subset.empty()) {  // ids the index does not hold allow nothing
                auto set = std::make_shared<tms::DocSet>(s->info().n_docs, int(subset.size()));
                std::vector<int64_t> internal;
                for (size_t r = 0; r < subset.size(); ++r) {
                    s->FindDocs(subset[r], &internal);
                    for (int64_t d : internal)
                        if (d >= 0) set->Add(int(r), d);
                }
                o.allow = std::move(set);
            }
            check(s->Search(b, o, &res, &t));
        }
        // Per query: certified 1 / 0, or -1 where the search did not certify, and the steps
        // deeper its second search went (SearchTimings).
        py::list certified, depth;
        for (int i = 0; i < b.n_queries; ++i) {
            certified.append(size_t(i) < t.certified.size() ? int(t.certified[size_t(i)]) : -1);
            depth.append(size_t(i) < t.depth.size() ? int(t.depth[size_t(i)]) : 0);
        }
        const py::tuple hits = hits_to_python(res);
        return py::make_tuple(hits[0], hits[1], certified, depth);
    }

    py::tuple rerank(const py::array& q, const std::string& dtype, const std::vector<int32_t>& lens,
                     const std::vector<std::vector<std::string>>& candidates, int k, bool skip_unknown) {
        tms::QueryBatch b = query_batch(q, dtype, lens);
        if (int64_t(candidates.size()) != b.n_queries) {
            throw py::value_error(std::to_string(candidates.size()) + " candidate lists for " +
                                  std::to_string(b.n_queries) + " queries");
        }
        std::vector<std::vector<tms::SearchHit>> res;
        const std::shared_ptr<const tms::Searcher> s = s_;  // a refresh() meanwhile leaves it
        {
            py::gil_scoped_release nogil;
            std::vector<std::vector<int64_t>> internal(candidates.size());
            for (size_t i = 0; i < candidates.size(); ++i) {
                s->FindDocs(candidates[i], &internal[i]);
                std::vector<int64_t> kept;
                for (size_t j = 0; j < internal[i].size(); ++j) {
                    if (internal[i][j] >= 0) {
                        kept.push_back(internal[i][j]);
                    } else if (!skip_unknown) {
                        throw py::value_error("query " + std::to_string(i) + ": document '" + candidates[i][j] +
                                              "' is not in the index");
                    }
                }
                internal[i] = std::move(kept);
            }
            check(s->Rerank(b, internal, k, &res));
        }
        return hits_to_python(res);
    }

    // The stored vectors of documents by external id, as fp16 bits [tokens, dim] (uint16 arrays:
    // the package views them as float16). An id the index does not hold is a KeyError.
    py::list document_vectors(const std::vector<std::string>& ids) {
        std::vector<int64_t> internal;
        std::vector<std::vector<uint16_t>> rows;
        const std::shared_ptr<const tms::Searcher> s = s_;  // a refresh() meanwhile leaves it
        {
            py::gil_scoped_release nogil;
            s->FindDocs(ids, &internal);
        }
        for (size_t i = 0; i < ids.size(); ++i)
            if (internal[i] < 0) throw py::key_error("document '" + ids[i] + "' is not in the index");
        {
            py::gil_scoped_release nogil;
            check(s->DocumentVectors(internal, &rows));
        }
        const py::ssize_t dim = s->info().dim;
        py::list out;
        for (const auto& r : rows) {
            py::array_t<uint16_t> a({py::ssize_t(r.size()) / dim, dim});
            std::copy(r.begin(), r.end(), a.mutable_data());
            out.append(a);
        }
        return out;
    }

    py::dict info() const { return info_dict(s_->info()); }
    std::string device() const { return tms::DeviceName(s_->device()); }

    // The sample of served queries: ([n, tokens, dim] fp16 bits, queries seen).
    py::tuple served() const {
        const tms::ServedQueries s = s_->Served();
        py::array_t<uint16_t> a({py::ssize_t(s.n_queries), py::ssize_t(s.q_tokens), py::ssize_t(s.dim)});
        std::copy(s.tokens.begin(), s.tokens.end(), a.mutable_data());
        return py::make_tuple(a, s.seen);
    }

    // Searcher::Explain of each query's documents (external ids): per query a list of
    // (doc_tokens int32 array, similarities float32 array, from_codes, spans int32 [n, 2] array or
    // None); KeyError for an unknown id.
    py::list explain(const py::array& q, const std::string& dtype, const std::vector<int32_t>& lens,
                     const std::vector<std::vector<std::string>>& ids) {
        tms::QueryBatch b = query_batch(q, dtype, lens);
        if (int64_t(ids.size()) != b.n_queries) {
            throw py::value_error(std::to_string(ids.size()) + " id lists for " + std::to_string(b.n_queries) +
                                  " queries");
        }
        std::vector<std::vector<tms::Explanation>> ex;
        const std::shared_ptr<const tms::Searcher> s = s_;
        std::string missing;
        tms::Status st;
        {
            py::gil_scoped_release nogil;
            std::vector<std::vector<int64_t>> docs(ids.size());
            for (size_t i = 0; i < ids.size() && missing.empty(); ++i) {
                s->FindDocs(ids[i], &docs[i]);
                for (size_t j = 0; j < docs[i].size() && missing.empty(); ++j)
                    if (docs[i][j] < 0) missing = ids[i][j];
            }
            if (missing.empty()) st = s->Explain(b, docs, &ex);
        }
        if (!missing.empty()) throw py::key_error("document '" + missing + "' is not in the index");
        check(st);
        py::list out;
        for (const auto& per_query : ex) {
            py::list l;
            for (const tms::Explanation& e : per_query) {
                py::array_t<int32_t> t(py::ssize_t(e.doc_tokens.size()));
                py::array_t<float> sim(py::ssize_t(e.similarities.size()));
                std::copy(e.doc_tokens.begin(), e.doc_tokens.end(), t.mutable_data());
                std::copy(e.similarities.begin(), e.similarities.end(), sim.mutable_data());
                py::object spans = py::none();
                if (!e.spans.empty()) {
                    py::array_t<int32_t> a({py::ssize_t(e.spans.size()), py::ssize_t(2)});
                    for (size_t k = 0; k < e.spans.size(); ++k) {
                        a.mutable_at(py::ssize_t(k), 0) = e.spans[k].first;
                        a.mutable_at(py::ssize_t(k), 1) = e.spans[k].second;
                    }
                    spans = std::move(a);
                }
                l.append(py::make_tuple(t, sim, e.from_codes, spans));
            }
            out.append(l);
        }
        return out;
    }

    // The index as it is now, sharing what this searcher loaded (Searcher::Refresh); searches in
    // flight finish on the searcher they started on.
    void refresh() {
        std::unique_ptr<tms::Searcher> next;
        const std::shared_ptr<const tms::Searcher> now = s_;
        {
            py::gil_scoped_release nogil;
            check(now->Refresh(&next));
        }
        s_ = std::move(next);
    }

private:
    std::shared_ptr<tms::Searcher> s_;
};

tms::EmbeddingView tokens_view(const py::array& tokens, const std::string& dtype) {
    const tms::DType dt = parse_dtype(dtype);
    check_array(tokens, 2, dt, "documents");
    return tms::EmbeddingView{tokens.data(), dt, static_cast<int64_t>(tokens.shape(0)),
                              static_cast<int>(tokens.shape(1))};
}

// Documents' metadata: JSON object texts (none: no metadata) and declared types "name:type,...".
std::unique_ptr<tms::DocMetadata> doc_metadata(const std::vector<std::string>& objects, const std::string& types) {
    if (objects.empty()) return nullptr;
    auto md = std::make_unique<tms::DocMetadata>();
    md->objects = objects;
    md->source = "metadata";
    if (!types.empty()) check(tms::ParseMetaColumns(types, &md->declared));
    return md;
}

// A build's options: IndexBuildOptions' JSON, with the keywords build_index takes beside it.
tms::IndexBuildOptions build_options(const std::string& options_json, bool overwrite, bool progress,
                                     const std::string& device) {
    tms::IndexBuildOptions o;
    if (!options_json.empty()) check(tms::ParseBuildOptionsJson(options_json, &o));
    o.overwrite = overwrite;
    o.progress = progress;
    tms::SearcherOptions dev;
    check(tms::ParseDeviceList(device, &dev));
    o.device = dev.device;
    if (!dev.gpus.empty()) o.gpu = dev.gpus[0];
    return o;
}

// What build_index returns: the build's counts.
py::dict build_counts(const tms::BuildStats& st) {
    py::dict d;
    d["n_docs"] = st.n_docs;
    d["n_tokens"] = st.n_tokens;
    d["n_centroids"] = st.n_centroids;
    d["seconds"] = st.seconds_total;
    return d;
}

py::dict build_index(const std::string& path, const py::array& tokens, const std::string& dtype,
                     const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& lengths,
                     const std::vector<std::string>& ids, const std::string& options_json, bool overwrite,
                     bool progress, const std::string& device, const std::vector<std::string>& metadata,
                     const std::string& metadata_types) {
    const tms::IndexBuildOptions o = build_options(options_json, overwrite, progress, device);
    const tms::EmbeddingView v = tokens_view(tokens, dtype);
    const std::vector<int64_t> lens = as_lengths(lengths);
    const auto md = doc_metadata(metadata, metadata_types);
    tms::BuildStats st;
    {
        py::gil_scoped_release nogil;
        std::unique_ptr<tms::IndexBuilder> b;
        check(tms::IndexBuilder::Create(o, path, &b));
        check(b->Build(v, lens, ids, &st, md.get()));
    }
    return build_counts(st);
}

// An index built from batches as they come (IndexStreamBuilder): add(...) per batch, finish().
class PyStreamBuilder {
public:
    PyStreamBuilder(const std::string& path, const std::string& options_json, bool overwrite, bool progress,
                    const std::string& device, int64_t expected_tokens) {
        const tms::IndexBuildOptions o = build_options(options_json, overwrite, progress, device);
        py::gil_scoped_release nogil;
        check(tms::IndexStreamBuilder::Create(o, path, expected_tokens, &b_));
    }
    void add(const py::array& tokens, const std::string& dtype,
             const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& lengths,
             const std::vector<std::string>& ids, const std::vector<std::string>& metadata,
             const std::string& metadata_types) {
        const tms::EmbeddingView v = tokens_view(tokens, dtype);
        const std::vector<int64_t> lens = as_lengths(lengths);
        const auto md = doc_metadata(metadata, metadata_types);
        py::gil_scoped_release nogil;
        check(b_->Add(v, lens, ids, md.get()));
    }
    py::dict finish() {
        tms::BuildStats st;
        {
            py::gil_scoped_release nogil;
            check(b_->Finish(&st));
        }
        return build_counts(st);
    }
    int64_t n_docs() const { return b_->n_docs(); }
    int64_t n_tokens() const { return b_->n_tokens(); }

private:
    std::unique_ptr<tms::IndexStreamBuilder> b_;
};

void add_documents(const std::string& path, const py::array& tokens, const std::string& dtype,
                   const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& lengths,
                   const std::vector<std::string>& ids, bool replace, bool progress,
                   const std::vector<std::string>& metadata, const std::string& metadata_types) {
    const tms::EmbeddingView v = tokens_view(tokens, dtype);
    const std::vector<int64_t> lens = as_lengths(lengths);
    const auto md = doc_metadata(metadata, metadata_types);
    py::gil_scoped_release nogil;
    std::unique_ptr<tms::IndexUpdater> u;
    check(tms::IndexUpdater::Open(path, progress, &u));
    const tms::Status st = u->Add(v, lens, ids, replace, md.get());
    if (st.code() == tms::Status::Code::kAlreadyExists) throw_id_error(st);
    check(st);
    check(u->Commit());
}

int64_t delete_documents(const std::string& path, const std::vector<std::string>& ids) {
    py::gil_scoped_release nogil;
    std::unique_ptr<tms::IndexUpdater> u;
    check(tms::IndexUpdater::Open(path, false, &u));
    int64_t already = 0;
    const tms::Status st = u->Delete(ids, &already);
    if (st.code() == tms::Status::Code::kNotFound) throw_id_error(st);
    check(st);
    check(u->Commit());
    return already;
}

}  // namespace

PYBIND11_MODULE(_core, m) {
    m.doc() = "TileMaxSim's engine (C++): use the tilemaxsim package, not this module";
    m.attr("__version__") = tms::VersionString();
    py::register_exception<EngineError>(m, "Error", PyExc_RuntimeError);
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const NotFoundError& e) {
            PyErr_SetString(PyExc_FileNotFoundError, e.what());
        }
    });
    m.def("search_defaults", [] {  // SearchOptions' defaults: the Python keywords' source
        const tms::SearchOptions o;
        py::dict d;
        d["nprobe"] = o.nprobe;
        d["ncandidates"] = o.ncandidates;
        d["rerank"] = o.rerank;
        d["pruning"] = tms::PruningName(o.pruning);
        d["target_recall"] = o.target_recall;
        return d;
    });
    m.def("set_log_level", [](const std::string& level) {
        tms::LogLevel l;
        const tms::Status st = tms::ParseLogLevel(level, &l);
        if (!st.ok()) throw py::value_error(st.message());
        tms::SetLogLevel(l);
    });
    m.def("log_level", [] {
        static const char* const names[] = {"error", "warning", "info", "debug"};
        return std::string(names[int(tms::GetLogLevel())]);
    });
    m.def("searcher_defaults", [] {  // SearcherOptions' defaults that Searcher's keywords expose
        const tms::SearcherOptions o;
        py::dict d;
        d["filter_time_ms"] = o.filter_time_ms;
        d["filter_max_bytes"] = o.filter_max_bytes;
        return d;
    });
    m.def(
        "estimate_recall",
        [](const std::string& path, int queries, const std::string& device, const py::object& sample,
           const std::string& sample_dtype, const std::vector<int32_t>& sample_lens, const py::object& documents,
           const std::string& documents_dtype, const std::vector<int64_t>& documents_lens) {
            tms::EstimateOptions o;
            o.queries = queries;
            tms::SearcherOptions so;
            check(tms::ParseDeviceList(device, &so));
            o.device = so.device;
            tms::QueryBatch b;
            if (!sample.is_none()) {
                b = query_batch(sample.cast<py::array>(), sample_dtype, sample_lens);
                o.sample = &b;
            }
            // An index without vectors: the documents it was built from are the truth.
            tms::EmbeddingView docs;
            py::array docs_array;
            if (!documents.is_none()) {
                docs_array = documents.cast<py::array>();
                docs = tokens_view(docs_array, documents_dtype);
                o.documents = &docs;
                o.doc_lengths = &documents_lens;
            }
            tms::RecallEstimate e;
            {
                py::gil_scoped_release nogil;
                check(tms::EstimateRecall(path, o, &e));
            }
            py::list points;
            for (const tms::RecallPoint& p : e.points) {
                py::dict d;
                d["nprobe"] = p.nprobe;
                d["ncandidates"] = p.ncandidates;
                d["rerank"] = p.rerank;
                d["recall"] = p.recall;
                d["se"] = p.se;
                points.append(d);
            }
            py::dict r;
            r["queries"] = e.queries;
            r["sample"] = e.sampled;
            r["compressed"] = e.compressed;
            r["measured_at"] = e.measured_at;
            r["k"] = e.k;
            r["points"] = points;
            return r;
        },
        py::arg("path"), py::arg("queries"), py::arg("device"), py::arg("sample"), py::arg("sample_dtype"),
        py::arg("sample_lens"), py::arg("documents"), py::arg("documents_dtype"), py::arg("documents_lens"));
    m.def("build_index", &build_index, py::arg("path"), py::arg("tokens"), py::arg("dtype"), py::arg("lengths"),
          py::arg("ids"), py::arg("options_json"), py::arg("overwrite"), py::arg("progress"), py::arg("device"),
          py::arg("metadata"), py::arg("metadata_types"));
    py::class_<PyStreamBuilder>(m, "StreamBuilder")
        .def(py::init<const std::string&, const std::string&, bool, bool, const std::string&, int64_t>(),
             py::arg("path"), py::arg("options_json"), py::arg("overwrite"), py::arg("progress"), py::arg("device"),
             py::arg("expected_tokens"))
        .def("add", &PyStreamBuilder::add, py::arg("tokens"), py::arg("dtype"), py::arg("lengths"), py::arg("ids"),
             py::arg("metadata"), py::arg("metadata_types"))
        .def("finish", &PyStreamBuilder::finish)
        .def_property_readonly("n_docs", &PyStreamBuilder::n_docs)
        .def_property_readonly("n_tokens", &PyStreamBuilder::n_tokens);
    m.def("add_documents", &add_documents, py::arg("path"), py::arg("tokens"), py::arg("dtype"), py::arg("lengths"),
          py::arg("ids"), py::arg("replace"), py::arg("progress"), py::arg("metadata"), py::arg("metadata_types"));
    m.def("delete_documents", &delete_documents, py::arg("path"), py::arg("ids"));
    // (next, reaches, recall) of `--codec auto`'s ladder after a PQ build at `path` whose ladder
    // began at `first_pq_m` sub-quantizers (tms::NextAutoCodecPqM: 0 keeps it), whether its stored
    // estimate reaches `target` beyond its sampling error, and the recall of the point it plans with.
    m.def("auto_codec_next", [](const std::string& path, double target, int first_pq_m) {
        tms::RecallEstimate e;
        check(tms::ReadRecallEstimate(path, &e));
        tms::IndexInfo info;
        check(tms::ReadIndexInfo(path, &info));
        const tms::RecallPoint* p = e.For(target);
        return py::make_tuple(tms::NextAutoCodecPqM(e, target, info.dim, first_pq_m, info.pq_m), e.Reaches(target),
                              p ? p->recall : 0.0);
    });
    m.def("index_info", [](const std::string& path) {
        tms::IndexInfo i;
        check(tms::ReadIndexInfo(path, &i));
        return info_dict(i);
    });
    py::class_<PySearcher>(m, "Searcher")
        .def(py::init<const std::string&, const std::string&, bool, int, bool, const std::string&, int64_t, int64_t,
                      int>(),
             py::arg("path"), py::arg("device"), py::arg("load_vectors"), py::arg("threads"), py::arg("progress"),
             py::arg("vectors"), py::arg("filter_time_ms"), py::arg("filter_max_bytes"), py::arg("record_queries"))
        .def("served", &PySearcher::served)
        .def("refresh", &PySearcher::refresh)
        .def("explain", &PySearcher::explain)
        .def("search", &PySearcher::search)
        .def("plan", &PySearcher::plan)
        .def("rerank", &PySearcher::rerank)
        .def("document_vectors", &PySearcher::document_vectors)
        .def("info", &PySearcher::info)
        .def("device", &PySearcher::device);
}
