// Copyright TileMaxSim authors. Text and output files: id lists, and writing any output atomically.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>

#include "index/ingest/files.h"
#include "index/store/index_dir.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

namespace tms {

Status index::WriteFileAtomically(const std::string& path, const std::function<bool(std::FILE*)>& fill) {
    namespace fs = std::filesystem;
    if (path == "-") {  // standard output, as written
        if (!fill(stdout) || std::fflush(stdout) != 0) return Status::IOError("standard output: write failed");
        return Status::OK();
    }
    // A device, a FIFO or a pipe (/dev/stdout, /proc/self/fd/N: links the kernel resolves, not
    // paths) is written in place, through the path as given.
    std::error_code ec;
    const fs::file_status given = fs::status(path, ec);
    if (fs::is_directory(given)) return Status::InvalidArgument(path + ": is a directory");
    const bool in_place = fs::exists(given) && !fs::is_regular_file(given);
    fs::path target = path;
    if (!in_place) TMS_RETURN_IF_ERROR(ResolveTargetPath(path, &target).WithContext("output"));
    const std::string out = in_place ? path : target.string() + ".tmp-" + std::to_string(::getpid());
    std::FILE* f = std::fopen(out.c_str(), in_place ? "ab" : "wb");
    if (f == nullptr) return Status::IOError(out + ": cannot open for writing: " + std::strerror(errno));
    const auto fail = [&](const std::string& what, int err) {
        std::fclose(f);
        if (!in_place) std::remove(out.c_str());
        return Status::IOError(out + ": " + what + ": " + std::strerror(err));
    };
    if (!fill(f) || std::fflush(f) != 0) return fail("write failed", errno);
    if (!in_place && ::fsync(::fileno(f)) != 0) return fail("fsync failed", errno);
    if (std::fclose(f) != 0) {
        const int err = errno;
        if (!in_place) std::remove(out.c_str());
        return Status::IOError(out + ": close failed: " + std::strerror(err));
    }
    if (in_place) return Status::OK();
    if (std::rename(out.c_str(), target.c_str()) != 0) {
        const int err = errno;
        std::remove(out.c_str());
        return Status::IOError(path + ": cannot rename " + out + " to it: " + std::strerror(err));
    }
    return Status::OK();
}

Status ReadLines(const std::string& path, std::vector<std::string>* lines, bool allow_empty) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Status::NotFound(path + ": no such file");
    std::ifstream f(path);
    if (!f) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
    lines->clear();
    std::string line;
    int64_t no = 0;
    while (std::getline(f, line)) {
        ++no;
        if (!line.empty() && line.back() == '\r') line.pop_back();
        if (line.empty() && !allow_empty)
            return Status::InvalidArgument(path + ":" + std::to_string(no) + ": empty line");
        lines->push_back(line);
    }
    return Status::OK();
}

Status WriteLines(const std::string& path, const std::vector<std::string>& lines) {
    return index::WriteFileAtomically(path, [&](std::FILE* f) {
        for (const auto& l : lines) {
            if (std::fwrite(l.data(), 1, l.size(), f) != l.size() || std::fputc('\n', f) == EOF) return false;
        }
        return true;
    });
}

}  // namespace tms
