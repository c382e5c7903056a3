// Copyright TileMaxSim authors. The index's recall estimate: pseudo-queries drawn from its own
// documents, searched exhaustively (the truth) and at a ladder of settings.
#include "engine/estimate.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include <signal.h>

#include <nlohmann/json.hpp>

#include "base/first_error.h"
#include "engine/backend.h"
#include "index/index_data.h"
#include "index/ingest/files.h"
#include "index/store/index_reader.h"
#include "index/metadata/metadata.h"
#include "kernels/maxsim.h"
#include "tilemaxsim/index_builder.h"
#include "tilemaxsim/searcher.h"

namespace tms {
namespace {

// (nprobe, ncandidates, rerank) measured before SearchOptions' default setting (for targets below
// the default one) and after it, cheapest first.
constexpr int kCheaper[][3] = {{2, 128, 32}, {4, 256, 64}, {6, 512, 128}};
constexpr int kDeeper[][3] = {{12, 2048, 512}, {16, 4096, 1024}, {24, 8192, 2048}, {32, 16384, 4096}};

// A recall past which the ladder stops (deeper points would cost more and measure the same).
constexpr double kEnough = 0.999;

std::string estimate_path(const std::string& index) { return index + "/" + index::kEstimateFile; }

// ESTIMATE.tmp-PID files that a killed estimate left (WriteFileAtomically's temporaries): removed
// when their process is gone, so that they do not pile up in the index directory.
void remove_dead_writers_files(const std::string& index) {
    namespace fs = std::filesystem;
    const std::string prefix = std::string(index::kEstimateFile) + ".tmp-";
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(index, ec)) {
        const std::string name = e.path().filename().string();
        if (name.rfind(prefix, 0) != 0) continue;
        const std::string pid = name.substr(prefix.size());
        if (pid.empty() || pid.find_first_not_of("0123456789") != std::string::npos || pid.size() > 9) continue;
        if (::kill(pid_t(std::stol(pid)), 0) != 0 && errno == ESRCH) fs::remove(e.path(), ec);
    }
}

// The options in range and the index at `path` one with vectors (the truth), its info into *info.
Status check_index(const std::string& path, const EstimateOptions& o, IndexInfo* info) {
    if (o.queries < 0 || o.query_tokens < 1 || !(o.noise >= 0) || !(o.mix >= 0 && o.mix <= 1) || o.content_tokens < 0 ||
        !(o.pad_noise >= 0)) {
        return Status::InvalidArgument(
            "estimate: queries >= 0, query_tokens >= 1, noise >= 0, mix in [0, 1], content_tokens >= 0, pad_noise >= "
            "0");
    }
    TMS_RETURN_IF_ERROR(ReadIndexInfo(path, info));
    if (o.documents != nullptr) {
        const std::vector<int64_t>* lens = o.doc_lengths;
        const bool lens_fit = lens != nullptr &&
                              std::all_of(lens->begin(), lens->end(), [](int64_t l) { return l >= 0; }) &&
                              std::accumulate(lens->begin(), lens->end(), int64_t(0)) == o.documents->rows;
        if (!lens_fit || o.documents->dim != info->dim || int64_t(lens->size()) != info->n_docs ||
            info->n_deleted != 0 || o.documents->data == nullptr ||
            (o.documents->dtype != DType::kF16 && o.documents->dtype != DType::kF32)) {
            return Status::InvalidArgument(
                "estimate: the documents given are not the ones " + path + " was built from (" +
                std::to_string(lens ? lens->size() : 0) + " documents of dimension " +
                std::to_string(o.documents->dim) + "; the index holds " + std::to_string(info->n_docs) +
                " of dimension " + std::to_string(info->dim) + ", " + std::to_string(info->n_deleted) + " deleted)");
        }
        return Status::OK();
    }
    if (!info->has_vectors) {
        return Status::NotSupported(path +
                                    ": the recall estimate needs stored vectors (build with --keep-vectors) or the "
                                    "documents the index was built from");
    }
    return Status::OK();
}

// Row offsets of documents of these lengths: document d is rows [off[d], off[d + 1]).
std::vector<int64_t> row_offsets(const std::vector<int64_t>& lens) {
    std::vector<int64_t> off(1, 0);
    for (const int64_t l : lens) off.push_back(off.back() + l);
    return off;
}

// Each query's exact top-k over `docs` (rows offsets[d] .. offsets[d + 1] are document d), by
// internal id: the truth of an estimate measured from the build's input.
Status exact_top_k(const QueryBatch& q, const EmbeddingView& docs, const std::vector<int64_t>& offsets, int k,
                   std::vector<std::vector<SearchHit>>* out) {
    const int64_t n_docs = int64_t(offsets.size()) - 1;
    const int nq = q.n_queries;
    std::vector<std::vector<std::pair<float, int64_t>>> best(static_cast<size_t>(nq));  // min-heaps of (score, -id)
    constexpr int64_t kBlock = 4096;
    std::vector<float> scores;
    std::vector<int64_t> off;
    for (int64_t d0 = 0; d0 < n_docs; d0 += kBlock) {
        const int64_t nb = std::min(kBlock, n_docs - d0);
        off.assign(offsets.begin() + d0, offsets.begin() + d0 + nb + 1);
        for (int64_t& o : off) o -= offsets[size_t(d0)];
        scores.assign(size_t(nq) * size_t(nb), 0.f);
        kernels::MaxSimParams p;
        p.queries = q.data;
        p.q_dtype = q.dtype;
        p.n_queries = nq;
        p.q_stride = q.q_tokens;
        p.dim = q.dim;
        p.query_lens = q.lengths;
        p.doc_tokens = static_cast<const char*>(docs.data) +
                       size_t(offsets[size_t(d0)]) * size_t(docs.dim) * size_t(docs.dtype == DType::kF16 ? 2 : 4);
        p.d_dtype = docs.dtype;
        p.doc_offsets = off.data();
        p.n_docs = nb;
        p.n_tokens = off.back();
        p.scores = scores.data();
        TMS_RETURN_IF_ERROR(kernels::maxsim_cpu(p));
        for (int i = 0; i < nq; ++i) {
            auto& h = best[size_t(i)];
            for (int64_t j = 0; j < nb; ++j) {
                // Ties to the lower id, as exhaustive search ranks them.
                const std::pair<float, int64_t> e{scores[size_t(i) * size_t(nb) + size_t(j)], -(d0 + j)};
                if (int(h.size()) < k) {
                    h.push_back(e);
                    std::push_heap(h.begin(), h.end(), std::greater<>());
                } else if (e > h.front()) {
                    std::pop_heap(h.begin(), h.end(), std::greater<>());
                    h.back() = e;
                    std::push_heap(h.begin(), h.end(), std::greater<>());
                }
            }
        }
    }
    out->assign(size_t(nq), {});
    for (int i = 0; i < nq; ++i) {
        auto& h = best[size_t(i)];
        std::sort(h.begin(), h.end(), std::greater<>());
        for (const auto& [sc, neg] : h) (*out)[size_t(i)].push_back({std::string(), -neg, sc});
        if (q.lengths && q.lengths[i] == 0) (*out)[size_t(i)].clear();  // no tokens: matches nothing
    }
    return Status::OK();
}

}  // namespace

Status MakePseudoQueries(const std::string& path, const EstimateOptions& o, int n_wanted, std::vector<uint16_t>* q,
                         std::vector<int32_t>* lens, int* n_out) {
    if (n_wanted < 1) return Status::InvalidArgument("estimate: ask for at least one pseudo-query");
    IndexInfo info;
    TMS_RETURN_IF_ERROR(check_index(path, o, &info));
    const int dim = info.dim;
    // The tokens come from the index's stored vectors (its shards), or from the documents given
    // (one "shard" of rows, document d from input_off[d]).
    std::vector<index::IndexData> shards;
    std::vector<int64_t> input_off;
    std::vector<std::pair<size_t, int64_t>> live;  // (shard, local id)
    if (o.documents != nullptr) {
        input_off = row_offsets(*o.doc_lengths);
        for (int64_t d = 0; d < int64_t(o.doc_lengths->size()); ++d)
            if ((*o.doc_lengths)[size_t(d)] > 0) live.emplace_back(0, d);
    } else {
        TMS_RETURN_IF_ERROR(index::ReadIndexShards(path, index::VectorLoad::kFileOrMemory, false, &shards));
        for (size_t sh = 0; sh < shards.size(); ++sh)
            for (int64_t d = 0; d < shards[sh].info.n_docs; ++d)
                if (!shards[sh].deleted[size_t(d)]) live.emplace_back(sh, d);
    }
    if (live.empty()) return Status::InvalidArgument("estimate: the index has no live document to draw queries from");
    const auto first_row = [&](std::pair<size_t, int64_t> doc) {
        return o.documents ? input_off[size_t(doc.second)] : shards[doc.first].doc_offsets[size_t(doc.second)];
    };
    std::mt19937_64 rng(o.seed);
    std::shuffle(live.begin(), live.end(), rng);
    const int n = int(std::min<int64_t>(n_wanted, int64_t(live.size())));
    const int qt = o.query_tokens;
    std::normal_distribution<float> n01;
    std::uniform_real_distribution<float> u01;
    const auto doc_len = [&](std::pair<size_t, int64_t> doc) {
        if (o.documents) return (*o.doc_lengths)[size_t(doc.second)];
        const index::IndexData& d = shards[doc.first];
        return d.doc_offsets[size_t(doc.second) + 1] - d.doc_offsets[size_t(doc.second)];
    };
    // First every draw, in one sequence (the queries depend on the seed alone): each query token
    // is a corpus row moved by noise. Then the rows are read on every thread: the first read of
    // a vectors file's chunk checks all of it, and the rows come from all over the files.
    struct Token {
        size_t shard;
        int64_t row;   // in its shard
        size_t noise;  // its dim noise values in `noise`
        uint16_t* out;
    };
    std::vector<Token> tokens;
    std::vector<float> noise;
    const auto take = [&](std::pair<size_t, int64_t> doc, int64_t t, float norm, uint16_t* out) {
        tokens.push_back({doc.first, first_row(doc) + t, noise.size(), out});
        const float sd = norm / std::sqrt(float(dim));
        for (int c = 0; c < dim; ++c) noise.push_back(sd * n01(rng));
    };
    const auto random_doc_token = [&](float norm, uint16_t* out) {
        const auto other = live[size_t(rng() % live.size())];
        const int64_t t = int64_t(rng() % uint64_t(doc_len(other)));
        take(other, t, norm, out);
    };
    q->assign(size_t(n) * qt * dim, 0);
    lens->assign(size_t(n), 0);
    std::vector<int> pads;  // per query: its padding token, copied over the rest after the reads
    std::vector<int64_t> pick;
    for (int i = 0; i < n; ++i) {
        const int64_t len = doc_len(live[size_t(i)]);
        pick.clear();
        if (o.content_tokens > 0) {  // a span, as the words of a query are
            const int64_t m = std::min<int64_t>({o.content_tokens, qt, len});
            const int64_t start = int64_t(rng() % uint64_t(len - m + 1));
            for (int64_t t = 0; t < m; ++t) pick.push_back(start + t);
        } else {
            pick.resize(size_t(len));
            for (int64_t t = 0; t < len; ++t) pick[size_t(t)] = t;
            std::shuffle(pick.begin(), pick.end(), rng);
            pick.resize(size_t(std::min<int64_t>(qt, len)));
        }
        uint16_t* qi = q->data() + size_t(i) * qt * dim;
        for (size_t j = 0; j < pick.size(); ++j) {
            if (o.content_tokens == 0 && o.mix > 0 && u01(rng) < o.mix) {  // a token of another document
                random_doc_token(o.noise, qi + j * dim);
            } else {
                take(live[size_t(i)], pick[j], o.noise, qi + j * dim);
            }
        }
        int used = int(pick.size());
        pads.push_back(-1);
        // The rest of a span query: one vector, far from the query's words and matched only
        // weakly by the corpus, as the [MASK]s that pad a ColBERT query are.
        if (o.content_tokens > 0 && used < qt) {
            random_doc_token(o.pad_noise, qi + size_t(used) * dim);
            pads.back() = used;
            used = qt;
        }
        (*lens)[size_t(i)] = used;
    }
    // out = the unit vector of the row moved by its noise, renormalised.
    FirstError err;
#pragma omp parallel
    {
        std::vector<uint16_t> row(static_cast<size_t>(dim));
        std::vector<float> x(static_cast<size_t>(dim));
#pragma omp for schedule(dynamic, 16)
        for (size_t k = 0; k < tokens.size(); ++k) {
            if (err.failed()) continue;
            const Token& tk = tokens[k];
            if (o.documents) {
                const EmbeddingView& v = *o.documents;
                for (int c = 0; c < dim; ++c) {
                    row[size_t(c)] =
                        v.dtype == DType::kF16
                            ? static_cast<const uint16_t*>(v.data)[size_t(tk.row) * size_t(dim) + size_t(c)]
                            : kernels::float_to_half(
                                  static_cast<const float*>(v.data)[size_t(tk.row) * size_t(dim) + size_t(c)]);
                }
            } else if (const index::IndexData& d = shards[tk.shard]; !d.vector_files.empty()) {
                err.Set(d.vector_files[0].file->Read(tk.row, 1, row.data()));
                if (err.failed()) continue;
            } else {
                std::copy_n(d.vectors.begin() + tk.row * dim, size_t(dim), row.begin());
            }
            double n2 = 0;
            for (int c = 0; c < dim; ++c) {
                x[size_t(c)] = kernels::half_to_float(row[size_t(c)]);
                n2 += double(x[size_t(c)]) * x[size_t(c)];
            }
            const float inv = n2 > 0 ? float(1.0 / std::sqrt(n2)) : 0.f;
            n2 = 0;
            for (int c = 0; c < dim; ++c) {
                x[size_t(c)] = x[size_t(c)] * inv + noise[tk.noise + size_t(c)];
                n2 += double(x[size_t(c)]) * x[size_t(c)];
            }
            const float sc = n2 > 0 ? float(1.0 / std::sqrt(n2)) : 0.f;
            for (int c = 0; c < dim; ++c) tk.out[c] = kernels::float_to_half(x[size_t(c)] * sc);
        }
    }
    TMS_RETURN_IF_ERROR(err.status());
    for (int i = 0; i < n; ++i) {
        if (pads[size_t(i)] < 0) continue;
        uint16_t* qi = q->data() + size_t(i) * qt * dim;
        for (int t = pads[size_t(i)] + 1; t < qt; ++t) {
            std::copy_n(qi + size_t(pads[size_t(i)]) * dim, size_t(dim), qi + size_t(t) * dim);
        }
    }
    *n_out = n;
    return Status::OK();
}

const RecallPoint* RecallEstimate::Default() const {
    const SearchOptions d;
    for (const RecallPoint& p : points)
        if (p.nprobe == d.nprobe && p.ncandidates == d.ncandidates && p.rerank == d.rerank) return &p;
    return nullptr;
}

const RecallPoint* RecallEstimate::For(double target) const {
    // From the default target up, the defaults are the floor: pseudo-queries can rate a corpus
    // easier than its real queries find it (BENCHMARKS.md, "Recall estimate"), and the default
    // search does not trade recall for speed on that estimate alone; a lower target asks to.
    const RecallPoint* d = Default();
    const size_t first = d != nullptr && target >= SearchOptions().target_recall ? size_t(d - points.data()) : 0;
    for (size_t i = first; i < points.size(); ++i)
        if (points[i].Lower() >= target) return &points[i];
    if (points.empty()) return nullptr;
    double best = 0;
    for (size_t i = first; i < points.size(); ++i) best = std::max(best, points[i].recall);
    for (size_t i = first; i < points.size(); ++i)
        if (points[i].recall >= best - kSaturated) return &points[i];
    return &points.back();
}

int NextAutoCodecPqM(const RecallEstimate& e, double target, int dim, int first_pq_m, int pq_m) {
    const int next = 2 * pq_m;
    if (e.Reaches(target) || pq_m <= 0 || next > 4 * first_pq_m || dim % next != 0) return 0;
    return next;
}

Status EstimateRecall(const std::string& path, const EstimateOptions& o, RecallEstimate* out) {
    IndexInfo info;
    TMS_RETURN_IF_ERROR(check_index(path, o, &info));
    Device device;
    TMS_RETURN_IF_ERROR(engine::ResolveDevice(o.device, &device));
    std::vector<uint16_t> qdata;
    std::vector<int32_t> lens;
    QueryBatch qb;
    if (o.sample != nullptr) {
        if (o.sample->n_queries < 1 || o.sample->dim != info.dim) {
            return Status::InvalidArgument("estimate: the sample has " + std::to_string(o.sample->n_queries) +
                                           " queries of dimension " + std::to_string(o.sample->dim) + "; the index " +
                                           path + " has dimension " + std::to_string(info.dim));
        }
        qb = *o.sample;
    }
    std::unique_ptr<Searcher> own;
    const Searcher* s = o.searcher;
    if (s == nullptr) {
        SearcherOptions so;
        so.device = o.device;
        so.progress = false;
        so.gather = false;
        TMS_RETURN_IF_ERROR(Searcher::Open(so, path, &own));
        s = own.get();
    } else {
        device = s->device();
    }
    if (o.sample == nullptr) {
        const int wanted = o.queries > 0 ? o.queries : device == Device::kGpu ? 256 : 64;
        int n = 0;
        TMS_RETURN_IF_ERROR(MakePseudoQueries(path, o, wanted, &qdata, &lens, &n));
        qb = QueryBatch{qdata.data(), DType::kF16, n, o.query_tokens, info.dim, lens.data()};
    }
    const int nq = qb.n_queries;
    RecallEstimate e;
    e.queries = nq;
    e.sampled = o.sample != nullptr;
    e.compressed = o.documents != nullptr;
    {
        const std::time_t now = std::time(nullptr);
        std::tm utc{};
        gmtime_r(&now, &utc);
        char when[32];
        std::strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &utc);
        e.measured_at = when;
    }
    const auto stopped = [&] { return o.stop != nullptr && o.stop->load(); };
    const Status kStopped = Status::Cancelled("estimate: stopped before its end (nothing stored)");
    SearchOptions ex;
    ex.exhaustive = true;
    ex.k = e.k;
    std::vector<std::vector<SearchHit>> truth, got;
    if (stopped()) return kStopped;
    if (o.documents != nullptr) {
        TMS_RETURN_IF_ERROR(exact_top_k(qb, *o.documents, row_offsets(*o.doc_lengths), e.k, &truth));
    } else {
        TMS_RETURN_IF_ERROR(s->Search(qb, ex, &truth));
    }
    const SearchOptions defaults;
    std::vector<std::array<int, 3>> ladder;
    for (const auto& l : kCheaper) ladder.push_back({l[0], l[1], l[2]});
    ladder.push_back({defaults.nprobe, defaults.ncandidates, defaults.rerank});
    const size_t n_first = ladder.size();  // measured whatever they reach: they include the defaults
    for (const auto& l : kDeeper) ladder.push_back({l[0], l[1], l[2]});
    for (const auto& l : ladder) {
        SearchOptions a;
        a.k = e.k;
        a.target_recall = 0;
        a.nprobe = l[0];
        a.ncandidates = l[1];
        a.rerank = l[2];
        if (stopped()) return kStopped;
        TMS_RETURN_IF_ERROR(s->Search(qb, a, &got));
        double sum = 0, sum_sq = 0;
        int counted = 0;
        for (int i = 0; i < nq; ++i) {
            if (truth[size_t(i)].empty()) continue;
            std::set<int64_t> want;
            for (const SearchHit& h : truth[size_t(i)]) want.insert(h.internal_id);
            int hit = 0;
            for (const SearchHit& h : got[size_t(i)]) hit += int(want.count(h.internal_id));
            const double r = double(hit) / double(want.size());
            sum += r;
            sum_sq += r * r;
            ++counted;
        }
        const double mean = counted ? sum / counted : 1.0;
        // The standard error of the mean of the queries' recalls (the sample variance's n - 1).
        const double se = counted > 1 ? std::sqrt(std::max(0.0, (sum_sq - sum * mean) / (counted - 1)) / counted) : 0.0;
        e.points.push_back({l[0], l[1], l[2], mean, se});
        if (e.points.size() >= n_first && e.points.back().recall >= kEnough) break;  // deeper cannot do better
        // The compressed ranking past the defaults: a deeper point that measures no better
        // says the codec bounds the curve (deeper ones would cost more for the same).
        if (e.compressed && e.points.size() > n_first && e.points.back().recall <= e.points[e.points.size() - 2].recall)
            break;
    }
    e.documents = info.n_docs - info.n_deleted;
    if (o.store) TMS_RETURN_IF_ERROR(StoreRecallEstimate(path, e, &o));
    *out = std::move(e);
    return Status::OK();
}

Status StoreRecallEstimate(const std::string& path, const RecallEstimate& e, const EstimateOptions* recipe) {
    nlohmann::json j;
    j["queries"] = e.queries;
    j["k"] = e.k;
    j["measured_at"] = e.measured_at;
    if (e.compressed) j["compressed"] = true;
    if (e.sampled) {
        j["sample"] = true;
    } else if (recipe != nullptr) {
        const EstimateOptions& o = *recipe;
        j["query_tokens"] = o.query_tokens;
        j["noise"] = std::round(double(o.noise) * 1e4) / 1e4;
        j["mix"] = std::round(double(o.mix) * 1e4) / 1e4;
        j["content_tokens"] = o.content_tokens;
        j["pad_noise"] = std::round(double(o.pad_noise) * 1e4) / 1e4;
        j["seed"] = o.seed;
    }
    j["documents"] = e.documents;
    for (const RecallPoint& p : e.points) {
        j["points"].push_back({{"nprobe", p.nprobe},
                               {"ncandidates", p.ncandidates},
                               {"rerank", p.rerank},
                               {"recall", p.recall},
                               {"se", p.se}});
    }
    const std::string text = j.dump(1) + "\n";
    remove_dead_writers_files(path);
    return index::WriteFileAtomically(
        estimate_path(path), [&](std::FILE* f) { return std::fwrite(text.data(), 1, text.size(), f) == text.size(); });
}

Status ReadRecallEstimate(const std::string& path, RecallEstimate* out) {
    const std::string p = estimate_path(path);
    std::ifstream f(p);
    if (!f) return Status::NotFound(p + ": no recall estimate");
    std::stringstream ss;
    ss << f.rdbuf();
    RecallEstimate e;
    try {
        const nlohmann::json j = nlohmann::json::parse(ss.str());
        e.queries = j.at("queries").get<int>();
        e.k = j.at("k").get<int>();
        e.sampled = j.value("sample", false);
        e.measured_at = j.value("measured_at", std::string());
        e.compressed = j.value("compressed", false);
        e.documents = j.value("documents", int64_t(0));
        for (const auto& x : j.at("points")) {
            RecallPoint pt{x.at("nprobe").get<int>(), x.at("ncandidates").get<int>(), x.at("rerank").get<int>(),
                           x.at("recall").get<double>(), x.value("se", 0.0)};
            if (pt.nprobe < 1 || pt.ncandidates < 0 || pt.rerank < 0 || !(pt.recall >= 0 && pt.recall <= 1) ||
                !(pt.se >= 0 && pt.se <= 1)) {
                return Status::Corruption(p + ": a point out of range");
            }
            e.points.push_back(pt);
        }
    } catch (const std::exception& ex) {
        return Status::Corruption(p + ": " + ex.what());
    }
    *out = std::move(e);
    return Status::OK();
}

}  // namespace tms
