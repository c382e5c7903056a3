// Copyright TileMaxSim authors. The fp16 vectors of a build, written into the stores' vectors files ahead of the codes.

#include <fcntl.h>
#include <cstdlib>

#include "base/progress.h"
#include "index/store/chunk_writer.h"
#include "index/store/crc32c.h"
#include "index/store/vectors_ahead.h"

namespace tms::index {

namespace fs = std::filesystem;

Status VectorsAhead::Start(const std::vector<Store>& stores, const std::vector<int64_t>& doclens, int chunk_docs,
                           int dim, int64_t max_lead, VectorSource source, std::unique_ptr<VectorsAhead>* out) {
    std::unique_ptr<VectorsAhead> a(new VectorsAhead());
    a->start_ = std::chrono::steady_clock::now();
    a->dim_ = dim;
    a->source_ = std::move(source);
    int64_t doc = 0, tok = 0;
    for (const Store& st : stores) {
        a->first_task_.push_back(a->tasks_.size());
        a->names_.push_back((st.dir / kVectorsFile).string());
        Fd f;
        f.fd = ::open(a->names_.back().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (f.fd < 0) return io_error(a->names_.back() + ": cannot create", errno);
        a->fds_.push_back(std::move(f));
        Fd direct;  // none where the file system has no direct I/O
        direct.fd = ::open(a->names_.back().c_str(), O_WRONLY | O_DIRECT | O_CLOEXEC);
        a->direct_fds_.push_back(std::move(direct));
        uint64_t offset = 0;
        for (int64_t d0 = 0; d0 < st.n_docs; d0 += chunk_docs) {
            Task t{a->fds_.size() - 1, tok, 0, offset};
            for (int64_t d = d0; d < std::min(st.n_docs, d0 + chunk_docs); ++d) t.n_tok += doclens[size_t(doc + d)];
            tok += t.n_tok;
            offset += uint64_t(t.n_tok) * uint64_t(dim) * sizeof(uint16_t);
            a->tasks_.push_back(t);
        }
        doc += st.n_docs;
    }
    a->first_task_.push_back(a->tasks_.size());
    const uint64_t bytes = uint64_t(tok) * uint64_t(dim) * sizeof(uint16_t);
    a->lead_ = size_t(double(std::max<int64_t>(max_lead, 0)) / double(std::max<uint64_t>(bytes, 1)) *
                      double(a->tasks_.size()));
    a->crc_.assign(a->tasks_.size(), 0);
    a->done_.assign(a->tasks_.size(), 0);
    const int n = int(std::min<size_t>({8, std::max(1u, std::thread::hardware_concurrency()), a->tasks_.size()}));
    for (int i = 0; i < n; ++i) a->threads_.emplace_back([p = a.get()] { p->Work(); });
    *out = std::move(a);
    return Status::OK();
}

VectorsAhead::~VectorsAhead() {
    {
        std::lock_guard<std::mutex> g(mu_);
        stop_ = true;
        cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
}

Status VectorsAhead::Wait(size_t s, int64_t c, VectorRef* ref) {
    const size_t i = first_task_[s] + size_t(c);
    if (i >= first_task_[s + 1]) return Status::Internal(names_[s] + ": more chunks than were written ahead");
    std::unique_lock<std::mutex> l(mu_);
    if (i > frontier_) {
        frontier_ = i;
        cv_.notify_all();
    }
    cv_.wait(l, [&] { return done_[i] || !error_.ok(); });
    if (!done_[i]) return error_;
    *ref = {tasks_[i].offset, uint64_t(tasks_[i].n_tok) * uint64_t(dim_) * sizeof(uint16_t), crc_[i]};
    return Status::OK();
}

double VectorsAhead::seconds() {
    std::lock_guard<std::mutex> g(mu_);
    return seconds_;
}

void VectorsAhead::Work() {
    std::vector<uint16_t> buf;
    std::unique_ptr<char, decltype(&std::free)> aligned(
        static_cast<char*>(std::aligned_alloc(ChunkWriter::kAlign, ChunkWriter::kBuffer)), &std::free);
    const uint64_t row = uint64_t(dim_) * sizeof(uint16_t);
    const int64_t piece = int64_t(std::max<uint64_t>(1, ChunkWriter::kBuffer / row));  // a direct write's rows
    for (size_t i; !stop_ && (i = next_.fetch_add(1)) < tasks_.size();) {
        {
            std::unique_lock<std::mutex> l(mu_);
            cv_.wait(l, [&] { return stop_ || i <= frontier_ + lead_; });
        }
        if (stop_) break;
        const Task& t = tasks_[i];
        ChunkWriter w(fds_[t.store].fd, direct_fds_[t.store].fd, t.offset, uint64_t(t.n_tok) * row, names_[t.store],
                      &direct_ok_, aligned.get());
        Status st;
        uint32_t crc = 0;
        try {
            for (int64_t r = 0; r < t.n_tok && st.ok() && !stop_; r += piece) {
                const int64_t n = std::min(piece, t.n_tok - r);
                const uint16_t* v = source_(t.tok0 + r, n, &buf);
                st = w.Put(reinterpret_cast<const char*>(v), uint64_t(n) * row);
                crc = Crc32(v, uint64_t(n) * row, crc);
            }
        } catch (const std::bad_alloc&) {
            st = Status::ResourceExhausted(names_[t.store] + ": out of host memory writing vectors");
        }
        std::lock_guard<std::mutex> g(mu_);
        if (st.ok() && !stop_) {
            crc_[i] = crc;
            done_[i] = 1;
            if (++n_done_ == tasks_.size()) seconds_ = SecondsSince(start_);
        } else if (!st.ok() && error_.ok()) {
            error_ = st;
            stop_ = true;
        }
        cv_.notify_all();
    }
}

}  // namespace tms::index
