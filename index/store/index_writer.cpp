// Copyright TileMaxSim authors. Writing a new index: its stores (sharded or not), the manifest, and putting it in
// place.

#include <filesystem>
#include <nlohmann/json.hpp>

#include "index/ingest/files.h"
#include "index/store/index_dir.h"
#include "index/store/index_writer.h"
#include "index/store/shards.h"
#include "index/store/store_writer.h"
#include "index/store/vectors_ahead.h"
#include "tilemaxsim/version.h"

namespace tms::index {

namespace fs = std::filesystem;

struct IndexWriter::Impl {
    std::string path;
    fs::path target, tmp;
    std::unique_ptr<FileLock> target_lock;  // writer lock of an index being replaced
    std::unique_ptr<FileLock> tmp_lock;     // marks tmp as alive for RecoverLeftovers
    IndexBuildOptions opts;
    const IndexModel* model = nullptr;
    bool finished = false;
    bool joined = false;  // a part of a distributed build in a build directory rank 0 owns
    // Documents of each shard; one entry: an unsharded index (one store, in tmp itself).
    std::vector<int64_t> shard_docs;
    // > 0: a stream's shards, opened as documents come, each closed at a document boundary once
    // it holds this many tokens (shard_docs grows with them).
    int64_t shard_tokens = 0;
    std::vector<int> mine;  // the shards this writer writes, ascending (every one but in a part)
    std::vector<std::unique_ptr<StoreWriter>> done;  // finished stores, in order
    std::unique_ptr<StoreWriter> cur;                // the shard being written
    int cur_shard = -1;
    std::unique_ptr<VectorsAhead> ahead;  // WriteVectorsAhead's, until FinishShards
    int ahead_dim = 0;
    double ahead_seconds = 0;  // from WriteVectorsAhead until every vector was written
    bool sharded() const { return shard_tokens > 0 || shard_docs.size() > 1; }
    fs::path store_dir(size_t s) const { return sharded() ? tmp / ShardDirName(int(s)) : tmp; }

    Status open_next() {
        if (shard_tokens > 0) {
            mine.push_back(int(done.size()));
            shard_docs.push_back(INT64_MAX);
        }
        const size_t s = size_t(mine[done.size()]);
        int64_t first = 0;
        for (size_t i = 0; i < s; ++i) first += shard_docs[i];
        cur_shard = int(s);
        cur = std::make_unique<StoreWriter>();
        if (sharded()) {
            std::error_code ec;
            fs::create_directory(store_dir(s), ec);
            if (ec) return Status::IOError(store_dir(s).string() + ": cannot create: " + ec.message());
        }
        return cur->Open(store_dir(s), opts, *model, first, ahead.get(), s);
    }
    Status finish_cur() {
        nlohmann::json meta;
        if (shard_tokens > 0) {
            shard_docs[size_t(cur_shard)] = cur->n_docs;
            meta = {{"shard", cur_shard}};  // how many follow is not known yet
        } else if (sharded()) {
            meta = {{"shard", cur_shard}, {"n_shards", shard_docs.size()}};
        }
        TMS_RETURN_IF_ERROR(cur->Finish(meta));
        CrashPoint("build:shard");
        done.push_back(std::move(cur));
        return Status::OK();
    }
};

IndexWriter::IndexWriter() : impl_(std::make_unique<Impl>()) {}

IndexWriter::~IndexWriter() {
    if (!impl_->finished) {
        impl_->cur.reset();
        impl_->done.clear();
        impl_->ahead.reset();  // its threads write into the directory
        // Created by Create, ours (a part's build directory is rank 0's to remove).
        if (!impl_->tmp.empty() && !impl_->joined) RemoveIndexDir(impl_->tmp);
    }
}

const std::string IndexWriter::build_dir() const { return impl_->tmp.string(); }
double IndexWriter::vectors_ahead_seconds() const { return impl_->ahead_seconds; }

Status IndexWriter::Create(const std::string& path, const IndexBuildOptions& opts, const IndexModel& model,
                           std::unique_ptr<IndexWriter>* out, std::unique_ptr<FileLock> target_lock,
                           std::vector<int64_t> shard_docs, const WriterPart* part) {
    const bool parted = part && part->size > 1;
    if (parted && (part->rank < 0 || part->rank >= part->size))
        return Status::InvalidArgument(path + ": bad build part");
    if (parted && part->rank != 0) {  // join rank 0's build directory
        std::unique_ptr<IndexWriter> w(new IndexWriter());
        Impl& im = *w->impl_;
        im.path = path;
        im.joined = true;
        im.tmp = part->dir;
        std::error_code ec;
        if (!fs::is_directory(im.tmp, ec)) {
            return Status::IOError(part->dir +
                                   ": the build directory of rank 0 is not visible here (a distributed "
                                   "build writes every shard into one directory: a shared filesystem)");
        }
        im.shard_docs = shard_docs.empty() ? std::vector<int64_t>{INT64_MAX} : std::move(shard_docs);
        for (int s = part->rank; s < int(im.shard_docs.size()); s += part->size) im.mine.push_back(s);
        im.opts = opts;
        im.model = &model;
        if (!im.mine.empty()) TMS_RETURN_IF_ERROR(im.open_next());
        *out = std::move(w);
        return Status::OK();
    }
    std::unique_ptr<IndexWriter> w;
    TMS_RETURN_IF_ERROR(Begin(path, opts, &w, std::move(target_lock), std::move(shard_docs), part));
    TMS_RETURN_IF_ERROR(w->SetModel(model));
    *out = std::move(w);
    return Status::OK();
}

Status IndexWriter::Begin(const std::string& path, const IndexBuildOptions& opts, std::unique_ptr<IndexWriter>* out,
                          std::unique_ptr<FileLock> target_lock, std::vector<int64_t> shard_docs,
                          const WriterPart* part) {
    const bool parted = part && part->size > 1;
    if (parted && part->rank != 0) return Status::InvalidArgument(path + ": a joining part is made by Create");
    fs::path target;
    TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &target));
    RecoverLeftovers(target);
    std::error_code ec;
    const bool exists = fs::exists(fs::symlink_status(target, ec));
    if (exists) {
        if (!opts.overwrite) {
            return Status::AlreadyExists(path + ": already exists (pass --overwrite to replace it)");
        }
        // Only ever replace an index this project wrote, or an empty directory.
        const bool empty_dir = fs::is_directory(target, ec) && fs::is_empty(target, ec);
        if (!empty_dir && !IsIndexDir(target)) {
            return Status::InvalidArgument(path +
                                           ": exists and is not an index written by tms; refusing to overwrite it");
        }
        // No other writer may change the old index while the new one is built: it would be lost.
        if (!target_lock && !empty_dir) TMS_RETURN_IF_ERROR(AcquireWriterLock(target, &target_lock));
    }
    const fs::path parent = target.parent_path();
    if (!fs::exists(parent, ec)) {
        fs::create_directories(parent, ec);
        if (ec) return Status::IOError(parent.string() + ": cannot create: " + ec.message());
    }
    std::unique_ptr<IndexWriter> w(new IndexWriter());
    Impl& im = *w->impl_;
    im.path = path;
    im.target = target;
    im.target_lock = std::move(target_lock);
    im.shard_docs = shard_docs.empty() ? std::vector<int64_t>{INT64_MAX} : std::move(shard_docs);
    // The last shard takes what remains (a distributed build's counts are exact: every rank
    // splits the same way).
    if (im.sharded() && !parted) im.shard_docs.back() = INT64_MAX;
    for (int s = 0; s < int(im.shard_docs.size()); s += parted ? part->size : 1) im.mine.push_back(s);
    TMS_RETURN_IF_ERROR(MakeBuildDir(target, &im.tmp));
    // Locked before it carries the marker: RecoverLeftovers never takes it for a dead build's.
    TMS_RETURN_IF_ERROR(
        FileLock::Acquire(im.tmp / kWriterLockFile, true, 0, true, im.tmp.string() + ": locked", &im.tmp_lock));
    TMS_RETURN_IF_ERROR(WriteMarker(im.tmp));
    im.opts = opts;
    CrashPoint("build:created");
    *out = std::move(w);
    return Status::OK();
}

Status IndexWriter::SetShardTokens(int64_t shard_tokens) {
    Impl& im = *impl_;
    if (im.model || im.ahead || im.sharded() || im.mine.size() != 1 || shard_tokens <= 0) {
        return Status::Internal(im.path + ": a stream's shards are set on an unsharded writer, before its model");
    }
    im.shard_tokens = shard_tokens;
    im.shard_docs.clear();
    im.mine.clear();
    return Status::OK();
}

Status IndexWriter::SetModel(const IndexModel& model) {
    Impl& im = *impl_;
    if (im.model) return Status::Internal(im.path + ": the writer has its model");
    im.model = &model;
    if (im.ahead && model.dim != im.ahead_dim) {
        return Status::Internal(im.path + ": the model's dimension differs from the vectors written ahead");
    }
    return im.open_next();
}

Status IndexWriter::WriteVectorsAhead(const std::vector<int64_t>& doclens, int dim, int64_t max_lead,
                                      VectorSource source) {
    Impl& im = *impl_;
    if (im.model || im.ahead || im.mine.size() != im.shard_docs.size() || !im.opts.keep_vectors) {
        return Status::Internal(im.path +
                                ": vectors are written ahead by a whole build with vectors, before its model");
    }
    std::vector<VectorsAhead::Store> stores;
    int64_t first = 0;
    for (size_t s = 0; s < im.shard_docs.size(); ++s) {
        const int64_t n = std::min(im.shard_docs[s], int64_t(doclens.size()) - first);
        if (im.sharded()) {
            std::error_code ec;
            fs::create_directory(im.store_dir(s), ec);
            if (ec) return Status::IOError(im.store_dir(s).string() + ": cannot create: " + ec.message());
        }
        stores.push_back({im.store_dir(s), n});
        first += n;
    }
    im.ahead_dim = dim;
    return VectorsAhead::Start(stores, doclens, std::max(1, im.opts.chunk_docs), dim, max_lead, std::move(source),
                               &im.ahead);
}

Status IndexWriter::AppendDocs(const int64_t* doclens, int64_t n, const uint32_t* token_centroids, const uint8_t* codes,
                               const uint16_t* vectors, const std::string* ids) {
    Impl& im = *impl_;
    const int nb = im.model->n_code_bytes, dim = im.model->dim;
    int64_t t = 0;
    for (int64_t i = 0; i < n;) {
        if (!im.cur && im.shard_tokens > 0) TMS_RETURN_IF_ERROR(im.open_next());  // a stream's next shard
        if (!im.cur) return Status::InvalidArgument(im.path + ": more documents than this writer's shards hold");
        if (im.cur->n_docs == im.shard_docs[size_t(im.cur_shard)]) {
            TMS_RETURN_IF_ERROR(im.finish_cur());
            if (im.done.size() == im.mine.size()) {
                return Status::InvalidArgument(im.path + ": more documents than this writer's shards hold");
            }
            TMS_RETURN_IF_ERROR(im.open_next());
        }
        // The documents the current shard still takes: their vectors in one write, then each.
        int64_t i1 = n;
        if (im.shard_tokens > 0) {  // up to the document that fills the shard
            int64_t held = im.cur->n_tokens;
            for (i1 = i; i1 < n && held < im.shard_tokens; ++i1) held += doclens[i1];
        } else {
            const int64_t room = im.shard_docs[size_t(im.cur_shard)] - im.cur->n_docs;  // INT64_MAX - n unsharded
            i1 = room >= n - i ? n : i + room;
        }
        const bool vecs = im.opts.keep_vectors && !im.ahead;
        if (vecs) {
            int64_t run = 0;
            for (int64_t j = i; j < i1; ++j) run += doclens[j];
            TMS_RETURN_IF_ERROR(im.cur->WriteVectors(vectors + t * dim, run));
        }
        for (; i < i1; ++i) {
            const int64_t len = doclens[i];
            TMS_RETURN_IF_ERROR(
                im.cur->Append(len, token_centroids + t, codes + t * nb, vecs ? vectors + t * dim : nullptr, ids[i]));
            t += len;
        }
        // A stream's shard closes once full; the next opens with the next document.
        if (im.shard_tokens > 0 && im.cur->n_tokens >= im.shard_tokens) TMS_RETURN_IF_ERROR(im.finish_cur());
    }
    return Status::OK();
}

Status IndexWriter::FinishShards() {
    Impl& im = *impl_;
    if (im.cur) TMS_RETURN_IF_ERROR(im.finish_cur());
    im.cur.reset();
    if (im.done.size() != im.mine.size()) return Status::InvalidArgument(im.path + ": fewer documents than shards");
    if (im.ahead) im.ahead_seconds = im.ahead->seconds();
    im.ahead.reset();                   // every chunk of every store was waited for
    if (im.joined) im.finished = true;  // its part is done; rank 0 completes the index
    return Status::OK();
}

Status IndexWriter::Finish() {
    TMS_RETURN_IF_ERROR(FinishShards());
    return Complete();
}

Status IndexWriter::Complete() {
    Impl& im = *impl_;
    if (im.joined) return Status::InvalidArgument(im.path + ": a part of a distributed build does not complete it");
    if (im.sharded()) {
        nlohmann::json shards = nlohmann::json::array();
        for (size_t s = 0; s < im.shard_docs.size(); ++s) {
            std::error_code ec;
            if (!fs::is_directory(im.store_dir(s), ec)) {
                return Status::Internal(im.store_dir(s).string() + ": a shard of the build is missing");
            }
            shards.push_back(ShardDirName(int(s)));
        }
        const nlohmann::json manifest = {
            {"format_version", kShardedFormatVersion}, {"shards", shards}, {"model_crc", ModelCrc(*im.model)}};
        const std::string text = manifest.dump(1) + "\n";
        CrashPoint("build:manifest");
        TMS_RETURN_IF_ERROR(WriteFileAtomically((im.tmp / kManifestFile).string(), [&](std::FILE* f) {
            return std::fwrite(text.data(), 1, text.size(), f) == text.size();
        }));
    }
    CrashPoint("build:complete");
    TMS_RETURN_IF_ERROR(ReplaceIndexDir(im.tmp, im.target));
    im.finished = true;
    return Status::OK();
}

Status WriteIndex(const std::string& path, const IndexData& d, const IndexBuildOptions& opts,
                  std::unique_ptr<FileLock> target_lock,
                  const std::function<Status(const std::string&)>& before_complete) {
    IndexBuildOptions o = opts;
    o.keep_vectors = !d.vectors.empty();
    const int64_t n = d.info.n_docs;
    std::vector<int64_t> lens(n);
    for (int64_t i = 0; i < n; ++i) lens[i] = d.doc_offsets[i + 1] - d.doc_offsets[i];
    std::unique_ptr<IndexWriter> w;
    TMS_RETURN_IF_ERROR(IndexWriter::Create(path, o, d.model, &w, std::move(target_lock),
                                            SplitShards(lens, ResolveShardCount(o.shards, d.info.n_tokens))));
    TMS_RETURN_IF_ERROR(w->AppendDocs(lens.data(), n, d.token_centroids.data(), d.codes.data(),
                                      d.vectors.empty() ? nullptr : d.vectors.data(), d.doc_ids.data()));
    TMS_RETURN_IF_ERROR(w->FinishShards());
    if (before_complete) TMS_RETURN_IF_ERROR(before_complete(w->build_dir()));
    return w->Complete();
}

}  // namespace tms::index
