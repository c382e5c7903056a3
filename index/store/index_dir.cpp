// Copyright TileMaxSim authors. Index directories: marker, locks, replacement, leftovers.
#include "index/store/index_dir.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"
#include "base/log.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace fs = std::filesystem;

namespace tms::index {
namespace {

std::string errno_text(int e) { return std::strerror(e); }

// renameat2's flags are not supported by this file system (or kernel): fall back to rename.
bool renameat2_unsupported(int e) { return e == EINVAL || e == ENOSYS || e == ENOTSUP; }

bool same_inode(int fd, const fs::path& file) {
    struct stat a {
    }, b{};
    if (::fstat(fd, &a) != 0 || ::stat(file.c_str(), &b) != 0) return false;
    return a.st_dev == b.st_dev && a.st_ino == b.st_ino;
}

// TARGET.tmp-build-PID-N / TARGET.old-PID: the leftover kinds, by name.
enum class Leftover { kNone, kBuild, kOld };
Leftover leftover_kind(const std::string& name, const std::string& base) {
    auto digits_after = [&](const std::string& prefix) {
        if (name.size() <= prefix.size() || name.compare(0, prefix.size(), prefix) != 0) return false;
        return name.find_first_not_of("0123456789-", prefix.size()) == std::string::npos;
    };
    if (digits_after(base + ".tmp-build-")) return Leftover::kBuild;
    if (digits_after(base + ".old-")) return Leftover::kOld;
    return Leftover::kNone;
}

// A build directory killed before its marker was written holds nothing, or only its writer
// lock: ours by its name alone, and nothing in it to lose.
bool unmarked_build_dir(const fs::path& dir) {
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().filename() != kWriterLockFile || !fs::is_regular_file(it->symlink_status(ec))) return false;
    }
    return !ec;
}

}  // namespace

void SyncDir(const fs::path& dir) {
    const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)::fsync(fd);
    ::close(fd);
}

FileLock::~FileLock() {
    if (fd_ >= 0) {
        ::flock(fd_, LOCK_UN);
        ::close(fd_);
    }
}

Status FileLock::Acquire(const fs::path& file, bool exclusive, double wait_s, bool create, const std::string& busy,
                         std::unique_ptr<FileLock>* out) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(wait_s);
    for (;;) {
        const int fd = ::open(file.c_str(), (create ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC, 0644);
        if (fd < 0) return Status::IOError(file.string() + ": cannot open lock file: " + errno_text(errno));
        for (;;) {
            if (::flock(fd, (exclusive ? LOCK_EX : LOCK_SH) | LOCK_NB) == 0) break;
            if (errno != EWOULDBLOCK && errno != EINTR) {
                const int e = errno;
                ::close(fd);
                return Status::IOError(file.string() + ": cannot lock: " + errno_text(e));
            }
            if (std::chrono::steady_clock::now() >= deadline) {
                ::close(fd);
                return Status::IOError(busy);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        // The directory may have been swapped between the open and the lock: the lock must be
        // on the file the path names now.
        if (same_inode(fd, file)) {
            out->reset(new FileLock(fd));
            return Status::OK();
        }
        ::flock(fd, LOCK_UN);
        ::close(fd);
        if (std::chrono::steady_clock::now() >= deadline && !fs::exists(file)) {
            return Status::NotFound(file.parent_path().string() + ": no such index");
        }
    }
}

Status ResolveTargetPath(const std::string& path, fs::path* out) {
    if (path.empty()) return Status::InvalidArgument("empty path");
    std::error_code ec;
    fs::path p = fs::absolute(fs::path(path), ec);
    if (ec) return Status::InvalidArgument(path + ": bad path: " + ec.message());
    p = p.lexically_normal();
    while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();  // "idx/" -> "idx"
    // Follow symbolic links (a chain of them), so that the index is replaced where it lives.
    for (int hops = 0; hops < 40 && fs::is_symlink(fs::symlink_status(p, ec)); ++hops) {
        fs::path t = fs::read_symlink(p, ec);
        if (ec) return Status::IOError(path + ": cannot read the symbolic link: " + ec.message());
        p = (t.is_absolute() ? t : p.parent_path() / t).lexically_normal();
        while (!p.has_filename() && p.has_relative_path()) p = p.parent_path();
    }
    if (p == p.root_path()) return Status::InvalidArgument(path + ": the root directory cannot be replaced");
    *out = p;
    return Status::OK();
}

bool IsIndexEntryName(const std::string& n) {
    const auto starts = [&](const char* p) { return n.rfind(p, 0) == 0; };
    const auto ends = [&](const char* p) {
        const size_t l = std::strlen(p);
        return n.size() >= l && n.compare(n.size() - l, l, p) == 0;
    };
    // Ours: the marker and its lock, the shard manifest and shards, vectors, metadata (and its
    // journal), the estimate, and the temporary files of atomic writes.
    if (starts(kMarkerFile) || n == "SHARDS" || starts("shard-") || n == "vectors.f16" || starts("metadata.sqlite") ||
        n == "estimate.json" || n.find(".tmp-") != std::string::npos) {
        return true;
    }
    // RocksDB's (db/filename.h): CURRENT, IDENTITY, LOCK, LOG*, MANIFEST-*, OPTIONS-*, numbered
    // tables, blobs and logs.
    if (n == "CURRENT" || n == "IDENTITY" || n == "LOCK" || starts("LOG") || starts("MANIFEST-") ||
        starts("OPTIONS-")) {
        return true;
    }
    const size_t dot = n.find('.');
    return dot != std::string::npos && dot > 0 &&
           std::all_of(n.begin(), n.begin() + long(dot), [](char c) { return c >= '0' && c <= '9'; }) &&
           (ends(".sst") || ends(".blob") || ends(".log") || ends(".dbtmp"));
}

namespace {

// `from` (a file, a symbolic link or a directory tree) appears at `to` too: files hard-linked
// (the original stays until the old index is removed, so a crash loses nothing).
Status link_tree(const fs::path& from, const fs::path& to) {
    std::error_code ec;
    const fs::file_status st = fs::symlink_status(from, ec);
    if (fs::is_symlink(st)) {
        fs::copy_symlink(from, to, ec);
    } else if (fs::is_directory(st)) {
        fs::create_directory(to, ec);
        for (fs::directory_iterator it(from, ec), end; !ec && it != end; it.increment(ec)) {
            TMS_RETURN_IF_ERROR(link_tree(it->path(), to / it->path().filename()));
        }
    } else {
        fs::create_hard_link(from, to, ec);
        if (ec) fs::copy_file(from, to, ec);  // a file system without hard links
    }
    if (ec) return Status::IOError(from.string() + ": cannot keep it in the new index: " + ec.message());
    return Status::OK();
}

// The parent directories of `p` from the nearest up, symbolic links resolved.
std::vector<fs::path> ancestors(const fs::path& p) {
    std::error_code ec;
    fs::path a = fs::weakly_canonical(p.parent_path(), ec);
    if (ec) a = p.parent_path();
    std::vector<fs::path> out;
    for (; !a.empty(); a = a.parent_path()) {
        out.push_back(a);
        if (a == a.root_path()) break;
    }
    return out;
}

}  // namespace

Status WriteMarker(const fs::path& dir) {
    const fs::path f = dir / kMarkerFile;
    const int fd = ::open(f.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return Status::IOError(f.string() + ": cannot create: " + errno_text(errno));
    static const char kText[] = "TileMaxSim index directory: written and removed only by tms.\n";
    const bool ok = ::write(fd, kText, sizeof(kText) - 1) == ssize_t(sizeof(kText) - 1) && ::fsync(fd) == 0;
    const int e = errno;
    ::close(fd);
    if (!ok) return Status::IOError(f.string() + ": write failed: " + errno_text(e));
    return Status::OK();
}

bool IsIndexDir(const fs::path& dir) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) return false;
    return fs::is_regular_file(dir / kMarkerFile, ec) || IsUnmarkedIndex(dir);
}

Status AcquireWriterLock(const fs::path& dir, std::unique_ptr<FileLock>* out) {
    std::error_code ec;
    if (!fs::exists(dir / kMarkerFile, ec)) TMS_RETURN_IF_ERROR(WriteMarker(dir));  // an index from before markers
    // A short wait: a reader's probe (WriterActive) holds the lock for microseconds.
    return FileLock::Acquire(dir / kWriterLockFile, true, 0.5, true, WriterBusyError(dir).message(), out);
}

Status WriterBusyError(const fs::path& dir) {
    return Status::IOError(dir.string() +
                           ": another process is writing this index (index --overwrite, add, delete or "
                           "compact); try again when it has finished");
}

Status AcquireMarkerLock(const fs::path& dir, bool exclusive, std::unique_ptr<FileLock>* out) {
    out->reset();
    std::error_code ec;
    if (!fs::exists(dir / kMarkerFile, ec)) return Status::OK();
    // Readers wait for a commit or a swap (short); writers wait for readers still loading.
    const double wait = exclusive ? 600.0 : 120.0;
    return FileLock::Acquire(dir / kMarkerFile, exclusive, wait, false,
                             dir.string() + (exclusive ? ": timed out waiting for searchers still opening the index"
                                                       : ": timed out waiting for a writer to finish replacing files"),
                             out);
}

bool WriterActive(const fs::path& dir) {
    const int fd = ::open((dir / kWriterLockFile).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    const bool busy = ::flock(fd, LOCK_SH | LOCK_NB) != 0;
    ::close(fd);  // closing drops the probe's lock
    return busy;
}

bool RemoveIndexDir(const fs::path& dir) {
    std::error_code ec;
    std::vector<fs::path> entries;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        if (it->path().filename() != kMarkerFile) entries.push_back(it->path());
    }
    if (ec) return false;
    bool ok = true;
    for (size_t i = 0; i < entries.size(); ++i) {
        fs::remove_all(entries[i], ec);
        ok = ok && !ec;
        if (i == 0) CrashPoint("remove:partial");
    }
    if (!ok) return false;
    fs::remove(dir / kMarkerFile, ec);
    return !ec && fs::remove(dir, ec) && !ec;
}

Status MakeBuildDir(const fs::path& target, fs::path* out) {
    static std::atomic<int> seq{0};
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const fs::path p = target.parent_path() / (target.filename().string() + ".tmp-build-" +
                                                   std::to_string(::getpid()) + "-" + std::to_string(seq++));
        if (::mkdir(p.c_str(), 0755) == 0) {
            *out = p;
            return Status::OK();
        }
        if (errno != EEXIST) return Status::IOError(p.string() + ": cannot create: " + errno_text(errno));
    }
    return Status::IOError(target.string() + ": cannot create a temporary build directory");
}

Status ReplaceIndexDir(const fs::path& fresh, const fs::path& target) {
    const fs::path parent = target.parent_path();
    std::error_code ec;
    if (!fs::exists(fs::symlink_status(target, ec))) {
        // Never onto something that appeared meanwhile (rename would replace an empty directory).
        int rc = ::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_NOREPLACE);
        if (rc != 0 && renameat2_unsupported(errno)) rc = ::rename(fresh.c_str(), target.c_str());
        if (rc != 0) {
            return Status::IOError(target.string() + ": cannot move the new index into place: " + errno_text(errno));
        }
        SyncDir(parent);
        return Status::OK();
    }
    // A user's files in the old index go into the new copy (the writer lock keeps them still).
    for (fs::directory_iterator it(target, ec), end; !ec && it != end; it.increment(ec)) {
        const std::string name = it->path().filename().string();
        if (!IsIndexEntryName(name)) TMS_RETURN_IF_ERROR(link_tree(it->path(), fresh / name));
    }
    // No reader is loading the old copy from here on; readers that wait re-check the marker,
    // find the new copy and load that.
    std::unique_ptr<FileLock> readers;
    TMS_RETURN_IF_ERROR(AcquireMarkerLock(target, true, &readers));
    CrashPoint("swap:locked");
    // TMS_TEST_NO_RENAME_EXCHANGE: the path of file systems without the exchange, for tests.
    static const bool exchange = std::getenv("TMS_TEST_NO_RENAME_EXCHANGE") == nullptr;
    if (exchange) {
        if (::renameat2(AT_FDCWD, fresh.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) == 0) {
            SyncDir(parent);
            CrashPoint("swap:exchanged");
            RemoveIndexDir(fresh);  // now the old copy
            return Status::OK();
        }
        if (!renameat2_unsupported(errno)) {
            return Status::IOError(target.string() +
                                   ": cannot exchange the new index with the old: " + errno_text(errno));
        }
    }
    const fs::path old = parent / (target.filename().string() + ".old-" + std::to_string(::getpid()));
    fs::rename(target, old, ec);
    if (ec) return Status::IOError(target.string() + ": cannot move the old index aside: " + ec.message());
    CrashPoint("swap:aside");
    fs::rename(fresh, target, ec);
    if (ec) {
        std::error_code ec2;
        fs::rename(old, target, ec2);
        return Status::IOError(target.string() + ": cannot move the new index into place: " + ec.message());
    }
    SyncDir(parent);
    RemoveIndexDir(old);
    return Status::OK();
}

void RecoverLeftovers(const fs::path& target) {
    std::error_code ec;
    const fs::path parent = target.parent_path();
    const std::string base = target.filename().string();
    std::vector<std::pair<Leftover, fs::path>> found;
    for (fs::directory_iterator it(parent, ec), end; !ec && it != end; it.increment(ec)) {
        const Leftover k = leftover_kind(it->path().filename().string(), base);
        if (k != Leftover::kNone && !fs::is_symlink(it->symlink_status(ec)) && fs::is_directory(it->path(), ec) &&
            (fs::is_regular_file(it->path() / kMarkerFile, ec) ||
             (k == Leftover::kBuild && unmarked_build_dir(it->path())))) {
            found.emplace_back(k, it->path());
        }
    }
    // Old copies first: one of them may become the index again.
    std::sort(found.begin(), found.end(), [](auto& a, auto& b) { return a.first > b.first; });
    for (const auto& [kind, dir] : found) {
        // A live writer holds the directory's writer lock: leave its work alone.
        std::unique_ptr<FileLock> lock;
        if (!FileLock::Acquire(dir / kWriterLockFile, true, 0, true, "busy", &lock).ok()) continue;
        if (kind == Leftover::kOld && !fs::exists(fs::symlink_status(target, ec))) {
            fs::rename(dir, target, ec);
            if (!ec) {
                SyncDir(parent);
                LogWarning("tms: %s: restored from %s (an interrupted replacement)\n", target.c_str(),
                           dir.filename().c_str());
                continue;
            }
        }
        if (RemoveIndexDir(dir)) {
            LogWarning("tms: removed %s, left by an interrupted %s\n", dir.c_str(),
                       kind == Leftover::kBuild ? "build" : "replacement");
        }
    }
}

void CrashPoint(const char* name) {
    static const char* crash = std::getenv("TMS_CRASH_POINT");
    static const char* pause = std::getenv("TMS_PAUSE_POINT");
    static const bool list = std::getenv("TMS_LIST_POINTS") != nullptr;
    if (!crash && !pause && !list) return;
    static std::mutex mu;
    static std::map<std::string, int> hits;
    std::lock_guard<std::mutex> g(mu);
    const int n = ++hits[name];
    if (list) std::fprintf(stderr, "crash-point %s\n", name);
    if (crash) {
        const std::string c(crash);
        const auto at = c.find('@');
        const std::string want = c.substr(0, at);
        const int nth = at == std::string::npos ? 1 : std::atoi(c.c_str() + at + 1);
        if (want == name && n == nth) ::kill(::getpid(), SIGKILL);
    }
    if (pause) {
        const std::string p(pause);
        const auto colon = p.rfind(':');
        if (p.substr(0, colon) == name && n == 1) {
            // SIGUSR1 ends the pause early (the test has done what it paused the process for).
            static volatile sig_atomic_t resumed = 0;
            std::signal(SIGUSR1, [](int) { resumed = 1; });
            std::fprintf(stderr, "paused-at %s\n", name);
            const auto until =
                std::chrono::steady_clock::now() + std::chrono::duration<double>(std::atof(p.c_str() + colon + 1));
            while (!resumed && std::chrono::steady_clock::now() < until) {
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
        }
    }
}

int64_t FreeBytes(const fs::path& path) {
    struct statvfs s {};
    fs::path p = path;
    std::error_code ec;
    while (!p.empty() && !fs::exists(p, ec)) p = p.parent_path();
    if (::statvfs(p.empty() ? "." : p.c_str(), &s) != 0) return -1;
    return int64_t(s.f_bavail) * int64_t(s.f_frsize);
}

}  // namespace tms::index

namespace tms {

Status CheckOutputPath(const std::string& out, OutputKind kind,
                       const std::vector<std::pair<std::string, std::string>>& inputs) {
    if (out == "-") return Status::OK();
    fs::path target;
    TMS_RETURN_IF_ERROR(index::ResolveTargetPath(out, &target));
    std::error_code ec;
    if (kind != OutputKind::kIndex && index::IsIndexDir(target)) {
        return Status::InvalidArgument(out + ": is an index directory; refusing to write there");
    }
    for (const fs::path& a : index::ancestors(target)) {
        if (index::IsIndexDir(a)) {
            return Status::InvalidArgument(out + ": inside the index " + a.string() +
                                           "; refusing to write there (choose a path outside it)");
        }
    }
    const fs::path canon = fs::weakly_canonical(target, ec);
    for (const auto& [option, path] : inputs) {
        if (path.empty() || path == "-") continue;
        // The same file, or (neither there yet: another output) the same path.
        if (kind == OutputKind::kFile && ((fs::exists(target, ec) && fs::equivalent(path, target, ec)) ||
                                          (!ec && fs::weakly_canonical(fs::absolute(path, ec), ec) == canon && !ec))) {
            return Status::InvalidArgument(out + ": is the file of " + option + " (" + path +
                                           "); refusing to write over it");
        }
        if (kind == OutputKind::kIndex && !ec) {
            const fs::path in = fs::weakly_canonical(fs::absolute(path, ec), ec);
            const fs::path rel = in.lexically_relative(canon);
            if (!ec && !rel.empty() && *rel.begin() != "..") {
                return Status::InvalidArgument(out + ": holds the input " + option + " (" + path +
                                               "), which replacing the index would delete; move it out first");
            }
        }
        ec.clear();
    }
    return Status::OK();
}

}  // namespace tms
