// Copyright TileMaxSim authors. .npy files: reading (whole or mapped), writing, viewing as embeddings.
#include <algorithm>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <regex>
#include <sstream>

#include "kernels/maxsim.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"
#include "index/ingest/input_checks.h"
#include "index/ingest/files.h"
#include "index/ingest/npy.h"

namespace tms {
namespace {

Status parse_header(const std::string& path, const std::string& h, HostArray* out) {
    auto bad = [&](const std::string& why) {
        return Status::InvalidArgument(path + ": malformed .npy header: " + why);
    };
    std::smatch m;
    static const std::regex descr_re(R"('descr'\s*:\s*'([^']*)')");
    static const std::regex fortran_re(R"('fortran_order'\s*:\s*(True|False))");
    static const std::regex shape_re(R"('shape'\s*:\s*\(([^)]*)\))");
    // numpy's own parser (ast.literal_eval of a dict) keeps the last of a repeated key; a reader
    // that kept the first would see another array: refuse the ambiguity.
    for (const char* key : {"'descr'", "'fortran_order'", "'shape'"}) {
        size_t n = 0;
        for (size_t at = h.find(key); at != std::string::npos; at = h.find(key, at + 1)) ++n;
        if (n > 1) return bad(std::string("key ") + key + " given twice");
    }
    if (!std::regex_search(h, m, descr_re)) return bad("no 'descr'");
    out->descr = m[1];
    if (!std::regex_search(h, m, fortran_re)) return bad("no 'fortran_order'");
    if (m[1] == "True")
        return Status::InvalidArgument(path + ": Fortran-order arrays are not supported (save with C order)");
    if (!std::regex_search(h, m, shape_re)) return bad("no 'shape'");
    out->shape.clear();
    std::stringstream ss(m[1]);
    std::string tok;
    while (std::getline(ss, tok, ',')) {
        const auto b = tok.find_first_not_of(" \t"), e = tok.find_last_not_of(" \t");
        if (b == std::string::npos) continue;
        tok = tok.substr(b, e - b + 1);
        if (tok.empty() || tok.find_first_not_of("0123456789") != std::string::npos)
            return bad("shape '" + std::string(m[1]) + "'");
        if (tok.size() > 15) return bad("dimension " + tok + " is too large");
        out->shape.push_back(std::stoll(tok));
    }
    return Status::OK();
}

int descr_size(const std::string& d) {
    if (d.size() < 3) return 0;
    const char order = d[0];
    if (order != '<' && order != '|' && order != '=') return -1;  // big-endian not supported
    const char kind = d[1];
    if (kind == 'V') return d == "<V2" || d == "|V2" ? 2 : 0;  // bfloat16 (ml_dtypes) as numpy saves it
    if (kind != 'f' && kind != 'i' && kind != 'u') return 0;
    try {
        return std::stoi(d.substr(2));
    } catch (...) {
        return 0;
    }
}

std::string shape_str(const std::vector<int64_t>& s) {
    std::string r;
    for (size_t i = 0; i < s.size(); ++i) r += (i ? "x" : "") + std::to_string(s[i]);
    return s.empty() ? "scalar" : r;
}

}  // namespace

Status index::CheckShape(const std::vector<int64_t>& shape, int64_t elem_size, const std::string& what) {
    constexpr int64_t kMaxBytes = int64_t(1) << 50;  // 1 PiB: larger is a corrupt header
    int64_t n = 1;
    for (const int64_t d : shape) {
        if (d < 0 || d > kMaxBytes)
            return Status::InvalidArgument(what + ": dimension " + std::to_string(d) + " out of range");
        if (d != 0 && n > kMaxBytes / elem_size / d) {
            return Status::InvalidArgument(what + ": shape " + shape_str(shape) +
                                           " is larger than any file (corrupt header?)");
        }
        n *= d;
    }
    return Status::OK();
}

namespace {

// Checks the preamble and header at the start of `head` (the first bytes of a .npy of `total`
// bytes, or < 0 for a stream; `noun`: "file" or "body"): on success *data_offset is where the payload starts, and
// `total` matches the header's shape exactly. `what` names the input in messages.
Status parse_preamble(const std::string& head, int64_t total, const std::string& what, const char* noun, HostArray* out,
                      int64_t* data_offset, int64_t* elem_size) {
    if (head.size() < 8 || std::memcmp(head.data(), "\x93NUMPY", 6) != 0) {
        return Status::InvalidArgument(what + ": not a .npy file (bad magic)");
    }
    const auto* b = reinterpret_cast<const unsigned char*>(head.data());
    const int major = b[6];
    uint32_t hlen = 0;
    int64_t pre = 0;
    if (major == 1) {
        if (head.size() < 10) return Status::InvalidArgument(what + ": truncated .npy header");
        hlen = b[8] | (b[9] << 8);
        pre = 10;
    } else if (major == 2 || major == 3) {
        if (head.size() < 12) return Status::InvalidArgument(what + ": truncated .npy header");
        hlen = b[8] | (b[9] << 8) | (b[10] << 16) | (uint32_t(b[11]) << 24);
        pre = 12;
    } else {
        return Status::InvalidArgument(what + ": unsupported .npy version " + std::to_string(major));
    }
    if (hlen > (1u << 20) || (total >= 0 && pre + int64_t(hlen) > total) || pre + int64_t(hlen) > int64_t(head.size()))
        return Status::InvalidArgument(what + ": truncated .npy header");
    TMS_RETURN_IF_ERROR(parse_header(what, head.substr(size_t(pre), hlen), out));
    const int es = descr_size(out->descr);
    if (es < 0) return Status::InvalidArgument(what + ": big-endian dtype '" + out->descr + "' is not supported");
    if (es == 0)
        return Status::InvalidArgument(what + ": unsupported dtype '" + out->descr +
                                       "' (expected float16, float32 or an integer type)");
    TMS_RETURN_IF_ERROR(index::CheckShape(out->shape, es, what));
    const int64_t need = out->numel() * es;
    const int64_t have = total - pre - hlen;
    if (total >= 0 && have != need) {  // a stream (total < 0) reads the payload the header says
        return Status::InvalidArgument(what + ": " + (have < need ? "truncated" : "trailing bytes") + ": header says " +
                                       shape_str(out->shape) + " " + out->descr + " (" + std::to_string(need) +
                                       " bytes of data), " + noun + " has " + std::to_string(have));
    }
    *data_offset = pre + hlen;
    *elem_size = es;
    return Status::OK();
}

// Reads and checks a file's header (parse_preamble).
Status read_header(const std::string& path, HostArray* out, int64_t* data_offset, int64_t* elem_size) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return Status::NotFound(path + ": no such file");
    if (std::filesystem::is_directory(path, ec))
        return Status::InvalidArgument(path + ": is a directory, expected a .npy file");
    std::ifstream f(path, std::ios::binary);
    if (!f) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
    const auto file_size = static_cast<int64_t>(std::filesystem::file_size(path, ec));
    std::string head(size_t(std::min<int64_t>(file_size, 12 + (int64_t(1) << 20))), '\0');
    if (!f.read(head.data(), std::streamsize(head.size()))) return Status::IOError(path + ": read failed");
    return parse_preamble(head, file_size, path, "file", out, data_offset, elem_size);
}

}  // namespace

Status ParseNpy(const std::string& bytes, const std::string& what, HostArray* out) {
    int64_t off = 0, es = 0;
    TMS_RETURN_IF_ERROR(parse_preamble(bytes, int64_t(bytes.size()), what, "body", out, &off, &es));
    out->bytes.assign(bytes.begin() + off, bytes.end());
    return Status::OK();
}

Status ReadNpyStream(std::FILE* f, const std::string& what, HostArray* out, bool* end) {
    *end = false;
    std::string head(10, '\0');
    const size_t got = std::fread(head.data(), 1, 10, f);
    if (got == 0 && std::feof(f)) {
        *end = true;
        return Status::OK();
    }
    if (got < 10) return Status::InvalidArgument(what + ": truncated .npy header");
    const auto* b = reinterpret_cast<const unsigned char*>(head.data());
    if (std::memcmp(head.data(), "\x93NUMPY", 6) != 0)
        return Status::InvalidArgument(what + ": not a .npy (bad magic)");
    if (b[6] == 2 || b[6] == 3) {
        head.resize(12);
        if (std::fread(head.data() + 10, 1, 2, f) != 2)
            return Status::InvalidArgument(what + ": truncated .npy header");
    }
    const auto* h = reinterpret_cast<const unsigned char*>(head.data());
    const uint32_t hlen = head.size() == 10 ? uint32_t(h[8] | (h[9] << 8))
                                            : uint32_t(h[8] | (h[9] << 8) | (h[10] << 16) | (uint32_t(h[11]) << 24));
    if (hlen > (1u << 20)) return Status::InvalidArgument(what + ": truncated .npy header");
    const size_t pre = head.size();
    head.resize(pre + hlen);
    if (std::fread(head.data() + pre, 1, hlen, f) != hlen)
        return Status::InvalidArgument(what + ": truncated .npy header");
    int64_t off = 0, es = 0;
    TMS_RETURN_IF_ERROR(parse_preamble(head, -1, what, "stream", out, &off, &es));
    const int64_t need = out->numel() * es;
    try {
        out->bytes.resize(static_cast<size_t>(need));
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted(what + ": out of memory reading " + std::to_string(need) + " bytes");
    }
    const size_t read = need > 0 ? std::fread(out->bytes.data(), 1, size_t(need), f) : 0;
    if (int64_t(read) != need) {
        return Status::InvalidArgument(what + ": truncated: header says " + shape_str(out->shape) + " " + out->descr +
                                       " (" + std::to_string(need) + " bytes of data), the stream ended after " +
                                       std::to_string(read));
    }
    return Status::OK();
}

Status LoadNpy(const std::string& path, HostArray* out) {
    int64_t off = 0, es = 0;
    TMS_RETURN_IF_ERROR(read_header(path, out, &off, &es));
    const int64_t need = out->numel() * es;
    try {
        out->bytes.resize(static_cast<size_t>(need));
    } catch (const std::bad_alloc&) {
        return Status::ResourceExhausted(path + ": out of memory reading " + std::to_string(need) + " bytes");
    }
    std::ifstream f(path, std::ios::binary);
    f.seekg(off);
    if (need > 0 && !f.read(reinterpret_cast<char*>(out->bytes.data()), need)) {
        return Status::IOError(path + ": read failed");
    }
    return Status::OK();
}

namespace index {

MappedNpy::~MappedNpy() {
    if (map_ != nullptr) munmap(map_, map_len_);
}

void MappedNpy::Release(size_t from, size_t upto) const {
    if (map_ == nullptr) return;
    const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
    const size_t off = static_cast<size_t>(data_ - static_cast<const uint8_t*>(map_));
    const size_t begin = from == 0 ? 0 : (off + from) / page * page;  // whole pages only
    const size_t end = std::min(map_len_, off + upto) / page * page;
    if (end > begin) madvise(static_cast<uint8_t*>(map_) + begin, end - begin, MADV_DONTNEED);
}

void MappedNpy::Advise(bool random) const {
    if (map_ != nullptr) madvise(map_, map_len_, random ? MADV_RANDOM : MADV_SEQUENTIAL);
}

Status MappedNpy::OpenRange(const std::string& path, size_t offset, size_t nbytes, HostArray header,
                            std::unique_ptr<MappedNpy>* out) {
    std::unique_ptr<MappedNpy> m(new MappedNpy());
    m->header_ = std::move(header);
    m->nbytes_ = nbytes;
    const int fd = ::open(path.c_str(), O_RDONLY);
    if (fd < 0) return Status::IOError(path + ": cannot open: " + std::strerror(errno));
    m->map_len_ = offset + nbytes;
    void* p = m->map_len_ ? mmap(nullptr, m->map_len_, PROT_READ, MAP_SHARED, fd, 0) : nullptr;
    ::close(fd);
    if (p == MAP_FAILED) return Status::IOError(path + ": mmap failed: " + std::strerror(errno));
    if (p) madvise(p, m->map_len_, MADV_SEQUENTIAL);
    m->map_ = p;
    m->data_ = static_cast<const uint8_t*>(p) + offset;
    *out = std::move(m);
    return Status::OK();
}

Status MappedNpy::Open(const std::string& path, std::unique_ptr<MappedNpy>* out) {
    HostArray header;
    int64_t off = 0, es = 0;
    TMS_RETURN_IF_ERROR(read_header(path, &header, &off, &es));
    const size_t nbytes = static_cast<size_t>(header.numel() * es);
    return OpenRange(path, static_cast<size_t>(off), nbytes, std::move(header), out);
}

}  // namespace index

std::string NpyHeader(const std::string& descr, const std::vector<int64_t>& shape) {
    std::string shp = "(";
    for (size_t i = 0; i < shape.size(); ++i) {
        shp += std::to_string(shape[i]) + (shape.size() == 1 ? "," : (i + 1 < shape.size() ? ", " : ""));
    }
    shp += ")";
    std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shp + ", }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header.push_back('\n');
    const char pre[10] = {'\x93',
                          'N',
                          'U',
                          'M',
                          'P',
                          'Y',
                          1,
                          0,
                          static_cast<char>(header.size() & 0xff),
                          static_cast<char>(header.size() >> 8)};
    return std::string(pre, 10) + header;
}

Status SaveNpy(const std::string& path, const std::string& descr, const std::vector<int64_t>& shape, const void* data,
               size_t nbytes) {
    const std::string header = NpyHeader(descr, shape);
    return index::WriteFileAtomically(path, [&](std::FILE* f) {
        return std::fwrite(header.data(), 1, header.size(), f) == header.size() &&
               std::fwrite(data, 1, nbytes, f) == nbytes;
    });
}

Status EmbeddingsFromArray(const HostArray& arr, int rank, const std::string& what, EmbeddingView* out) {
    return index::EmbeddingsFromRaw(arr, arr.bytes.data(), rank, what, out);
}

Status index::EmbeddingsFromRaw(const HostArray& arr, const void* data, int rank, const std::string& what,
                                EmbeddingView* out, bool check_finite) {
    const bool bf16 = arr.descr == "<V2" || arr.descr == "|V2";
    if (arr.descr != "<f2" && arr.descr != "<f4" && !bf16) {
        return Status::InvalidArgument(what + ": dtype '" + arr.descr +
                                       "' not supported; expected float16 (<f2), "
                                       "float32 (<f4) or bfloat16 (ml_dtypes, saved as <V2)");
    }
    if (static_cast<int>(arr.shape.size()) != rank) {
        return Status::InvalidArgument(what + ": expected a rank-" + std::to_string(rank) + " array (" +
                                       (rank == 2 ? "[n_tokens, dim]" : "[n_queries, n_tokens, dim]") +
                                       "), got shape " + shape_str(arr.shape));
    }
    const int64_t dim = arr.shape.back();
    if (dim < 32 || dim > 1024) {
        return Status::InvalidArgument(what + ": dimension " + std::to_string(dim) +
                                       " outside the supported range [32, 1024]");
    }
    out->dtype = bf16 ? DType::kBF16 : arr.descr == "<f2" ? DType::kF16 : DType::kF32;
    out->data = data;
    out->dim = static_cast<int>(dim);
    out->rows = arr.numel() / dim;
    if (!check_finite) return Status::OK();
    const int64_t n = arr.numel();
    const int64_t first_bad = index::FirstBadValue(*out);
    if (first_bad < n) {
        const float v = kernels::load_as_float(out->data, out->dtype, first_bad);
        if (rank == 3) {  // [n_queries, tokens, dim]
            const int64_t tokens = arr.shape[1];
            return Status::InvalidArgument(
                what + ": " + BadValueText(v) + " at query " + std::to_string(first_bad / dim / tokens) + ", token " +
                std::to_string(first_bad / dim % tokens) + ", column " + std::to_string(first_bad % dim));
        }
        return NonFiniteError(what, first_bad / dim, static_cast<int>(first_bad % dim), v);
    }
    return Status::OK();
}

Status IntegersFromArray(const HostArray& arr, const std::string& what, std::vector<int64_t>* out) {
    if (arr.shape.size() != 1) {
        return Status::InvalidArgument(what + ": expected a rank-1 integer array, got shape " + shape_str(arr.shape));
    }
    const std::string& d = arr.descr;
    const int64_t n = arr.shape[0];
    out->resize(n);
    auto get = [&](auto tag) {
        using T = decltype(tag);
        for (int64_t i = 0; i < n; ++i) {
            T v;
            std::memcpy(&v, arr.bytes.data() + i * sizeof(T), sizeof(T));
            (*out)[i] = static_cast<int64_t>(v);
        }
    };
    // int32 and int64 only (narrower types overflow on real corpora; uint64 wraps past 2^63).
    if (d == "<i4")
        get(int32_t{});
    else if (d == "<i8")
        get(int64_t{});
    else
        return Status::InvalidArgument(what + ": dtype '" + d + "' not supported (expected int32 or int64)");
    return Status::OK();
}

}  // namespace tms
