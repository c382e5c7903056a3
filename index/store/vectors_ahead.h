// Copyright TileMaxSim authors. The fp16 vectors of a build, written into the stores' vectors files ahead of the codes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "index/store/file_io.h"
#include "index/store/format.h"
#include "index/store/index_writer.h"
#include "tilemaxsim/status.h"

namespace tms::index {

namespace fs = std::filesystem;

// The fp16 vectors of a build's stores, written into their vectors files by threads of their
// own ahead of the codes: they do not depend on the model, so the bulk of a build's bytes goes
// to disk while k-means trains. One task per store chunk (the chunks StoreWriter makes: every
// chunk_docs documents of a store), written by a ChunkWriter in pieces
// and checksummed; StoreWriter::flush_chunk waits for its chunk's reference. The writing runs at
// most `max_lead` bytes ahead of the chunk the store writer waits for, so that the encoder still
// finds the input rows in the page cache where the input is larger than memory (else the
// input would be read from disk twice).
class VectorsAhead {
public:
    struct Store {  // consecutive stores from the input's first document on
        fs::path dir;
        int64_t n_docs = 0;
    };
    static Status Start(const std::vector<Store>& stores, const std::vector<int64_t>& doclens, int chunk_docs, int dim,
                        int64_t max_lead, VectorSource source, std::unique_ptr<VectorsAhead>* out);
    ~VectorsAhead();
    // Chunk c of store s, once written; or the first error of any chunk.
    Status Wait(size_t s, int64_t c, VectorRef* ref);
    // Seconds from Start until every chunk was written (once they all were).
    double seconds();

private:
    struct Task {
        size_t store;
        int64_t tok0, n_tok;  // the chunk's tokens, numbered across the whole input
        uint64_t offset;      // in the store's vectors file
    };
    VectorsAhead() = default;
    void Work();
    int dim_ = 0;
    VectorSource source_;
    std::vector<Task> tasks_;
    std::vector<size_t> first_task_;  // [stores + 1]
    std::vector<Fd> fds_;
    std::vector<Fd> direct_fds_;  // the same files opened O_DIRECT (-1: none)
    std::atomic<bool> direct_ok_{true};
    std::vector<std::string> names_;
    std::vector<uint32_t> crc_;
    std::vector<char> done_;
    size_t n_done_ = 0;
    size_t frontier_ = 0;  // the last chunk waited for: chunks up to frontier_ + lead_ are written
    size_t lead_ = 0;
    std::chrono::steady_clock::time_point start_;
    double seconds_ = 0;
    std::mutex mu_;
    std::condition_variable cv_;
    Status error_;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> next_{0};
    std::vector<std::thread> threads_;
};

}  // namespace tms::index
