// Copyright TileMaxSim authors.
#include "tools/tms/common.h"

#include <cstdio>
#include <cstdlib>

#include "base/log.h"
#include "base/progress.h"

namespace tms::cli {

std::atomic<bool> g_shortage{false};

std::string one_line(const std::string& s) {
    std::string out;
    for (const char c : s) {
        if (static_cast<unsigned char>(c) >= 0x20 && c != 0x7f) {
            out += c;
        } else {
            char buf[8];
            std::snprintf(buf, sizeof(buf),
                          c == '\n'   ? "\\n"
                          : c == '\t' ? "\\t"
                                      : "\\x%02x",
                          static_cast<unsigned char>(c));
            out += buf;
        }
    }
    return out;
}

int exit_code(const tms::Status& st) { return st.code() == tms::Status::Code::kInternal ? 3 : 1; }

int fail(const std::string& cmd, const tms::Status& st) {
    std::fprintf(stderr, "tms %s: error: %s\n", cmd.c_str(), one_line(st.message()).c_str());
    if (st.code() == tms::Status::Code::kResourceExhausted) g_shortage = true;
    return exit_code(st);
}

tms::Status parse_placement(const std::string& device, const std::string& devices, const std::string& vectors,
                            tms::SearcherOptions* so) {
    TMS_RETURN_IF_ERROR(parse_device(device, &so->device));
    if (!devices.empty()) TMS_RETURN_IF_ERROR(tms::ParseDeviceList(devices, so).WithContext("--devices"));
    return tms::ParseVectorTier(vectors, &so->vectors).WithContext("--vectors");
}

tms::Status parse_device(const std::string& s, tms::Device* d) {
    if (s == "auto")
        *d = tms::Device::kAuto;
    else if (s == "cpu")
        *d = tms::Device::kCpu;
    else if (s == "gpu")
        *d = tms::Device::kGpu;
    else
        return tms::Status::InvalidArgument("--device must be auto, cpu or gpu, got '" + s + "'");
    return tms::Status::OK();
}

tms::Pruning parse_pruning(const std::string& s) {
    return s == "probe" ? tms::Pruning::kProbe : tms::Pruning::kInteraction;
}

#if TMS_WITH_MPI
// Launched by mpirun (Open MPI, or a PMI / PMIx launcher): `tms search` runs on every rank.
bool under_mpirun() {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
        if (std::getenv(v)) return true;
    return false;
}
#endif

tms::Status load_metadata(const std::string& file, const std::string& types, std::unique_ptr<tms::DocMetadata>* out) {
    out->reset();
    if (file.empty()) return tms::Status::OK();
    auto md = std::make_unique<tms::DocMetadata>();
    TMS_RETURN_IF_ERROR(tms::ParseMetaColumns(types, &md->declared));
    TMS_RETURN_IF_ERROR(tms::LoadMetadataJsonl(file, md.get()));
    *out = std::move(md);
    return tms::Status::OK();
}

std::string low_recall_advice(const tms::RecallEstimate& e) {
    if (e.points.empty() || e.points.back().recall >= 0.95) return "";
    return std::string("more bytes a token (--codec auto, --pq-m, --nbits 4)") +
           (e.compressed ? ", --keep-vectors (an exact rerank)" : "") + " or more centroids";
}

void print_estimate(const char* who, const tms::RecallEstimate& e, double secs) {
    const tms::RecallPoint* t = e.For(tms::SearchOptions().target_recall);
    if (e.points.empty() || t == nullptr) return;
    tms::LogInfo(
        "%s: estimated recall@%d of the default search %.4f (%d %s%s, %.1f s); for recall %.2f: "
        "nprobe %d, ncandidates %d%s%s (estimated %.4f, at least %.4f)\n",
        who, e.k, (e.Default() ? e.Default() : &e.points[0])->recall, e.queries,
        e.sampled ? "sample queries" : "pseudo-queries", e.compressed ? ", compressed ranking against the input" : "",
        secs, tms::SearchOptions().target_recall, t->nprobe, t->ncandidates, e.compressed ? "" : ", rerank ",
        e.compressed ? "" : std::to_string(t->rerank).c_str(), t->recall, t->Lower());
    const std::string advice = low_recall_advice(e);
    if (!advice.empty()) {
        tms::LogWarning(
            "%s: hint: even the deepest setting measured reaches only %.4f; %s would rank candidates "
            "better\n",
            who, e.points.back().recall, advice.c_str());
    }
}

tms::Status estimate_index(const char* who, const std::string& path, const tms::EstimateOptions& eo) {
    tms::RecallEstimate e;
    const auto t0 = std::chrono::steady_clock::now();
    TMS_RETURN_IF_ERROR(tms::EstimateRecall(path, eo, &e));
    print_estimate(who, e, tms::SecondsSince(t0));
    return tms::Status::OK();
}

}  // namespace tms::cli
