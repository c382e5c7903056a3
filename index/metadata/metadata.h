// Copyright TileMaxSim authors. Document metadata in SQLite: the file of an index, its writers,
// the snapshot searches filter by, and the filter language. Internal (not installed).
//
// INDEX/metadata.sqlite (at the index root, also for a sharded index) holds one table
//   docs (doc INTEGER PRIMARY KEY, id TEXT NOT NULL, "<column>" <INTEGER|REAL|TEXT>, ...)
// indexed on id, with PRAGMA user_version the format version. `doc` is the global internal id.
// Readers only ever look at rows with doc < n_docs of the stores they opened: a writer commits
// its rows before the stores' commit that makes their documents exist, so the rows of a commit
// interrupted between the two are invisible (and the next writer deletes them). An index
// without the file has no metadata. The journal mode is DELETE (no -wal/-shm files beside it:
// compaction replaces the index directory as a whole).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tilemaxsim/metadata.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms::index {

inline constexpr const char* kMetadataFile = "metadata.sqlite";
/// The index's recall estimate (tilemaxsim/estimate.h), beside its metadata.
inline constexpr const char* kEstimateFile = "estimate.json";
inline constexpr int kMetadataFormatVersion = 1;
inline constexpr int kMaxMetaColumns = 1000;

/// One value of a metadata cell, or one literal of a filter.
struct MetaValue {
    enum class Kind : uint8_t { kNull = 0, kInteger, kReal, kText };
    Kind kind = Kind::kNull;
    int64_t i = 0;
    double r = 0;
    std::string s;  ///< kText (also an array or object, as its JSON text)
};
using FilterParam = MetaValue;
/// The attributes of one document: (column index, value); columns not named are NULL.
using MetaCells = std::vector<std::pair<int, MetaValue>>;

/// The lexical index of an index's text: an FTS5 table (`texts`) over one metadata column of
/// type text, with external content (the docs table holds the text; triggers keep the FTS5
/// index in step with every insert and delete of a row, in the same transaction, so it follows
/// the metadata's crash rules). Recorded in the file (table text_index). Deleted documents'
/// rows, and so their text, count in BM25's statistics until a compaction drops them.
struct TextIndexSpec {
    std::string column;                   ///< the docs column indexed
    std::string tokenizer = "unicode61";  ///< unicode61, porter (stemmed unicode61), trigram
    /// The docs column of each document's token spans (IndexBuildOptions::spans_field; empty:
    /// none): a JSON array of [start, end] character offsets into `column`'s text, one pair per
    /// token. Recorded in the file (table text_spans).
    std::string spans_column;
};
/// InvalidArgument naming the accepted words unless `t` is unicode61, porter or trigram.
Status CheckTextTokenizer(const std::string& t);
/// The text index of the metadata file at `path` (*has false when there is none, or no file).
Status ReadTextIndexSpec(const std::string& path, TextIndexSpec* out, bool* has);
/// The FTS5 query a search's text becomes: each whitespace-separated word that holds a letter
/// or digit, as a quoted string (FTS5 tokenizes it as the index does: a phrase of its tokens),
/// the words OR-ed; empty when there is none.
std::string FtsQuery(const std::string& text);

/// A column name as the file and filters accept it; messages start with `what`.
Status CheckMetaColumnName(const std::string& name, const std::string& what);

/// One write transaction on a metadata file: nothing of it is visible before Commit, and
/// destroying an uncommitted writer rolls it back (a created file is removed).
class MetadataWriter {
public:
    /// A new file at `path` with `columns` (built as PATH.tmp, put in place by Commit with the
    /// file and its directory synced), and with `text` its text index (the column must be one
    /// of `columns`, of type text).
    static Status Create(const std::string& path, const std::vector<MetaColumn>& columns,
                         std::unique_ptr<MetadataWriter>* out, const TextIndexSpec* text = nullptr);
    /// The existing file at `path`, one transaction until Commit.
    static Status Open(const std::string& path, std::unique_ptr<MetadataWriter>* out);
    ~MetadataWriter();
    const std::vector<MetaColumn>& columns() const { return columns_; }
    /// Appends `cols` to the table (ALTER TABLE ADD COLUMN), in order.
    Status AddColumns(const std::vector<MetaColumn>& cols);
    /// Deletes the rows with doc >= `doc`.
    Status DeleteFrom(int64_t doc);
    /// One row; `cells` index columns().
    Status Insert(int64_t doc, const std::string& id, const MetaCells& cells);
    /// Commits durably (and puts a created file in place).
    Status Commit();

private:
    MetadataWriter() = default;
    struct Db;
    std::unique_ptr<Db> db_;
    std::vector<MetaColumn> columns_;
    std::string path_, tmp_;  // tmp_: a created file until Commit
};

/// The columns and the number of rows with doc < n_docs of the file at `path`; *rows = -1 (and
/// no columns) when there is no file.
Status ReadMetadataInfo(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns, int64_t* rows);
/// row(doc, id, cells) for every row with doc < n_docs of the file at `path`, in doc order;
/// `columns` is filled first (the cells' indexes).
Status ForEachMetadataRow(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns,
                          const std::function<Status(int64_t doc, const std::string& id, const MetaCells& cells)>& row);

/// The metadata of an opened index, copied into memory (SQLite's backup API) at open, so that
/// searches see the snapshot the stores were read at whatever writers do next.
class MetadataSnapshot {
public:
    /// Rows with doc < n_docs of the index at `index_dir` (index_dir/kMetadataFile); *out stays
    /// null when the index has no metadata file.
    static Status Load(const std::string& index_dir, int64_t n_docs, std::unique_ptr<MetadataSnapshot>* out);
    ~MetadataSnapshot();
    const std::vector<MetaColumn>& columns() const { return columns_; }
    int64_t rows() const { return rows_; }
    int64_t n_docs() const { return n_docs_; }
    /// The documents whose row satisfies `where`, an SQL boolean expression over the columns
    /// and `id` (CompileFilter): bits [(n_docs + 31) / 32] words, bit d % 32 of word d / 32 set
    /// for internal id d; *count the documents set. Thread-safe (one connection behind a
    /// mutex). The snapshot does not change: the 16 most recently used expressions keep their
    /// result (a search repeating a filter pays a copy, not a scan), and each column a filter
    /// names gets an index at its first use (a filter on another value of it reads only the
    /// matching rows).
    Status Filter(const std::string& where, std::vector<uint32_t>* bits, int64_t* count) const;
    /// The columns `fields` (every column when empty; `id` the external id) of documents `docs`
    /// (internal ids below n_docs), one JSON object each ({} for a document without a row):
    /// integers and reals as numbers, text as strings, NULL as null. InvalidArgument naming an
    /// unknown field.
    Status Rows(const std::vector<int64_t>& docs, const std::vector<std::string>& fields,
                std::vector<std::string>* objects) const;
    /// The index has a text index (TextIndexSpec).
    bool has_text() const { return has_text_; }
    /// Its spans column (TextIndexSpec::spans_column; empty: none).
    const std::string& spans_column() const { return spans_column_; }
    /// BM25 over the text index (FTS5's bm25(), k1 1.2, b 0.75): the best `k` documents for
    /// `text` (FtsQuery) among those set in `allowed` (bits over n_docs; null: all), best first,
    /// ties to the lower id; scores are -bm25() (higher is better, above 0). NotSupported without
    /// a text index. Thread-safe.
    Status Lexical(const std::string& text, int k, const uint32_t* allowed,
                   std::vector<std::pair<int64_t, float>>* hits) const;
    /// Bounds on each evaluation of Filter (SearcherOptions::filter_time_ms, filter_max_bytes):
    /// past either it fails with one line naming the limit.
    void SetLimits(int64_t time_ms, int64_t max_bytes);

private:
    MetadataSnapshot() = default;
    struct Impl;
    std::unique_ptr<Impl> impl_;
    std::vector<MetaColumn> columns_;
    int64_t rows_ = 0, n_docs_ = 0;
    bool has_text_ = false;
    std::string spans_column_;
};

/// The filter expression rewritten for SQLite: every identifier a known column (or `id`), a
/// keyword (AND OR NOT IN IS NULL LIKE GLOB BETWEEN ESCAPE TRUE FALSE) or a whitelisted function
/// followed by '(' (lower upper length abs coalesce ifnull substr instr round json_extract);
/// every literal (single-quoted string with '' escapes, integer, real, hex) replaced by ?N and
/// returned in `params` to bind; "double-quoted" identifiers checked as columns. Anything else
/// (`;`, comments, parameters, backticks, brackets, unknown identifiers such as SELECT or a
/// misspelt column) is InvalidArgument with one line starting "filter: ", e.g.
/// "filter: unknown column 'yeer' (columns: id, tenant, year)",
/// "filter: unexpected ';' at character 12", "filter: empty expression". *used (optional): the
/// columns the expression names, as declared, each once.
Status CompileFilter(const std::string& where, const std::vector<MetaColumn>& columns, std::string* sql,
                     std::vector<FilterParam>* params, std::vector<std::string>* used = nullptr);

}  // namespace tms::index
