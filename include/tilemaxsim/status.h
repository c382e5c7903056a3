// Copyright TileMaxSim authors. Status: the error type of every public call (RocksDB style).
#pragma once

#include <string>
#include <utility>

namespace tms {

/// Result of every fallible call. A default-constructed Status is OK.
/// Messages are one line, naming the file or argument and the problem.
/// Thread-safety: value type, no shared state.
class [[nodiscard]] Status {
public:
    enum class Code {
        kOk = 0,
        kInvalidArgument,    ///< bad input: a file, an option, a shape
        kNotFound,           ///< missing file or index
        kNotSupported,       ///< valid request this build or this index cannot serve
        kIOError,            ///< the OS or RocksDB failed to read or write
        kCorruption,         ///< stored data fails a check
        kResourceExhausted,  ///< out of memory (host or device)
        kAlreadyExists,      ///< refusing to overwrite
        kInternal,           ///< a bug: please report
        kCancelled,          ///< the caller asked the work to stop
    };

    Status() = default;
    Status(Code code, std::string msg) : code_(code), msg_(std::move(msg)) {}

    static Status OK() { return {}; }
    static Status InvalidArgument(std::string m) { return {Code::kInvalidArgument, std::move(m)}; }
    static Status NotFound(std::string m) { return {Code::kNotFound, std::move(m)}; }
    static Status NotSupported(std::string m) { return {Code::kNotSupported, std::move(m)}; }
    static Status IOError(std::string m) { return {Code::kIOError, std::move(m)}; }
    static Status Corruption(std::string m) { return {Code::kCorruption, std::move(m)}; }
    static Status ResourceExhausted(std::string m) { return {Code::kResourceExhausted, std::move(m)}; }
    static Status AlreadyExists(std::string m) { return {Code::kAlreadyExists, std::move(m)}; }
    static Status Internal(std::string m) { return {Code::kInternal, std::move(m)}; }
    static Status Cancelled(std::string m) { return {Code::kCancelled, std::move(m)}; }

    bool ok() const { return code_ == Code::kOk; }
    Code code() const { return code_; }
    const std::string& message() const { return msg_; }
    /// "InvalidArgument: docs.npy: ..." ; "OK" when ok().
    std::string ToString() const;
    /// Prefix the message with context ("path: "), keeping the code.
    Status WithContext(const std::string& ctx) const { return ok() ? *this : Status(code_, ctx + ": " + msg_); }

private:
    Code code_ = Code::kOk;
    std::string msg_;
};

const char* StatusCodeName(Status::Code code);

}  // namespace tms

/// Propagate a non-OK Status to the caller.
#define TMS_RETURN_IF_ERROR(expr)          \
    do {                                   \
        ::tms::Status _tms_st = (expr);    \
        if (!_tms_st.ok()) return _tms_st; \
    } while (0)
