// Copyright TileMaxSim authors. An index directory as a file-system object: the marker that
// makes it ours, the locks that order its writers and readers, its replacement by a new copy,
// and the recovery of what an interrupted writer left behind. Internal (not installed).
//
// Locks (flock, released by the kernel when a process dies):
//   DIR/TILEMAXSIM         the marker, written first by every build. Readers hold it shared
//                          while they open and load; whatever replaces files a reader may be
//                          loading (an updater's open, commit and close; the swap of a rebuilt
//                          copy) holds it exclusive.
//   DIR/TILEMAXSIM.writer  held exclusive by the one writer (build into a temporary directory,
//                          add, delete, compact, overwrite) for the whole command.
// Both are re-checked after locking: a lock taken on a directory that was swapped away
// meanwhile is dropped and taken again on the current one.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "tilemaxsim/status.h"

namespace tms::index {

inline constexpr const char* kMarkerFile = "TILEMAXSIM";
inline constexpr const char* kWriterLockFile = "TILEMAXSIM.writer";

/// An flock held on a file until destroyed.
class FileLock {
public:
    ~FileLock();
    FileLock(const FileLock&) = delete;
    FileLock& operator=(const FileLock&) = delete;
    /// Lock `file`, shared or exclusive, waiting up to `wait_s` seconds (0: fail at once);
    /// `create`: create the file if missing. Fails with `busy` as the message when the wait
    /// runs out.
    static Status Acquire(const std::filesystem::path& file, bool exclusive, double wait_s, bool create,
                          const std::string& busy, std::unique_ptr<FileLock>* out);

private:
    explicit FileLock(int fd) : fd_(fd) {}
    int fd_ = -1;
};

/// The path the library writes for a user's path (an index directory, an output file):
/// absolute, no trailing separator, "."/".." removed, a symbolic link replaced by what it points
/// to (so that replacing the index or file replaces the target, not the link). Fails on an
/// empty path.
Status ResolveTargetPath(const std::string& path, std::filesystem::path* out);

/// True for the names this project and RocksDB write at the top of an index directory (any other
/// entry is a user's: ReplaceIndexDir carries it into the new copy).
bool IsIndexEntryName(const std::string& name);

/// Writes DIR/TILEMAXSIM (and syncs it): DIR is an index this project created.
Status WriteMarker(const std::filesystem::path& dir);

/// True when `dir` holds the marker, or is an index written before markers existed (a
/// RocksDB database with this project's column families and format metadata). Only such a
/// directory is ever replaced or removed.
bool IsIndexDir(const std::filesystem::path& dir);
/// The check for an index written before markers (in the RocksDB adapter).
bool IsUnmarkedIndex(const std::filesystem::path& dir);

/// The writer lock of the index at `dir` (creating the lock file and, for an index written
/// before markers, the marker). Refused with a message naming the index when another writer
/// holds it (after a short wait).
Status AcquireWriterLock(const std::filesystem::path& dir, std::unique_ptr<FileLock>* out);
/// The marker of `dir`, shared (a reader's open) or exclusive (a change of files a reader may
/// be loading). No lock (nullptr, OK) for an index without a marker.
Status AcquireMarkerLock(const std::filesystem::path& dir, bool exclusive, std::unique_ptr<FileLock>* out);
/// "DIR: another process is writing this index ...": a writer's refusal.
Status WriterBusyError(const std::filesystem::path& dir);
/// True when some process holds the writer lock of `dir` now.
bool WriterActive(const std::filesystem::path& dir);

/// A new temporary sibling of `target` for a build: TARGET.tmp-build-PID-N, created empty.
Status MakeBuildDir(const std::filesystem::path& target, std::filesystem::path* out);

/// Removes the index (or build) directory `dir`, its marker last, so that a removal cut short
/// leaves a directory RecoverLeftovers still knows as ours. False when something stayed.
bool RemoveIndexDir(const std::filesystem::path& dir);

/// Puts the complete index `fresh` at `target`. Entries of the old index that this project did
/// not write (IsIndexEntryName) are hard-linked into `fresh` first, so that a user's file in
/// the index directory survives compaction and --overwrite. An existing index there is exchanged
/// atomically with it (renameat2 RENAME_EXCHANGE; where the file system lacks it, two renames
/// whose interruption RecoverLeftovers repairs) once no reader is loading it, then removed.
Status ReplaceIndexDir(const std::filesystem::path& fresh, const std::filesystem::path& target);

/// Repairs what interrupted writers left next to `target` (TARGET.tmp-build-* and
/// TARGET.old-* directories that carry the marker and whose writer is gone): an old copy is
/// moved back when `target` is missing, the rest is removed; one line on stderr for each.
void RecoverLeftovers(const std::filesystem::path& target);

/// Test hook: with TMS_CRASH_POINT=NAME (or NAME@N, the N-th time) in the environment the
/// process kills itself (SIGKILL) at the named point; TMS_PAUSE_POINT=NAME:SECONDS sleeps
/// there (printing "paused-at NAME"; SIGUSR1 ends the sleep early); TMS_LIST_POINTS=1 prints
/// each point reached ("crash-point NAME") on stderr.
void CrashPoint(const char* name);

/// fsync of a directory, so that a rename or an unlink in it is durable (best effort).
void SyncDir(const std::filesystem::path& dir);

/// Bytes free to unprivileged users on the file system holding `path` (-1 when unknown).
int64_t FreeBytes(const std::filesystem::path& path);

}  // namespace tms::index
