// Copyright TileMaxSim authors. Document metadata in SQLite: the file beside an index, its writer, its
// readers and the snapshot searches filter with. The only user of SQLite.
#include <sqlite3.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "index/metadata/filter_functions.h"
#include "index/metadata/filter_language.h"
#include "index/metadata/metadata.h"
#include "nlohmann/json.hpp"
#include "index/metadata/names.h"
#include "index/store/index_dir.h"
#include "tilemaxsim/options.h"

namespace fs = std::filesystem;

namespace tms::index {
namespace {

constexpr int kFilterCache = 16;
constexpr int kBusyTimeoutMs = 120000;  // a writer's transaction, at most: readers wait for it

MetaType type_of_decl(const char* decl) {
    const std::string d = upper(decl ? decl : "");
    if (d == "INTEGER") return MetaType::kInteger;
    if (d == "REAL") return MetaType::kReal;
    return MetaType::kText;
}

std::string sql_type(MetaType t) { return upper(MetaTypeName(t)); }

// ---- SQLite -------------------------------------------------------------------------------

struct Stmt {
    sqlite3_stmt* s = nullptr;
    Stmt() = default;
    Stmt(const Stmt&) = delete;
    Stmt& operator=(const Stmt&) = delete;
    Stmt(Stmt&& o) noexcept : s(std::exchange(o.s, nullptr)) {}
    void reset() {
        sqlite3_finalize(s);
        s = nullptr;
    }
    ~Stmt() { reset(); }
};

struct Conn {
    sqlite3* db = nullptr;
    Conn() = default;
    Conn(const Conn&) = delete;
    Conn& operator=(const Conn&) = delete;
    ~Conn() { sqlite3_close_v2(db); }
};

// An SQLite failure as a Status; `what` names the file.
Status sql_error(sqlite3* db, int rc, const std::string& what) {
    // The handle may not hold the error (a backup step fails on its own object): then rc says it.
    const std::string msg = db && sqlite3_errcode(db) != SQLITE_OK ? sqlite3_errmsg(db) : sqlite3_errstr(rc);
    switch (rc & 0xff) {
        case SQLITE_CORRUPT:
        case SQLITE_NOTADB: return Status::Corruption(what + ": damaged metadata file (" + msg + ")");
        case SQLITE_FULL: return Status::IOError(what + ": disk full");
        case SQLITE_NOMEM: return Status::ResourceExhausted(what + ": out of memory");
        case SQLITE_BUSY:
        case SQLITE_LOCKED: return Status::IOError(what + ": locked by another process for too long (" + msg + ")");
        default: return Status::IOError(what + ": " + msg);
    }
}

Status exec(sqlite3* db, const std::string& sql, const std::string& what) {
    const int rc = sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

Status prepare(sqlite3* db, const std::string& sql, const std::string& what, Stmt* out) {
    out->reset();
    const int rc = sqlite3_prepare_v2(db, sql.c_str(), int(sql.size()), &out->s, nullptr);
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

// Opens `path` (an existing file unless `create`). Readers open it read-write too, where the file
// system allows, so that SQLite can roll back what a killed writer's transaction left in it (a
// hot journal) before reading. Writers' commits are durable when they return: synchronous=EXTRA
// also syncs the directory after the journal's deletion, which is the commit in DELETE mode.
Status open_file(const std::string& path, bool create, bool writer, Conn* out) {
    const int flags = SQLITE_OPEN_READWRITE | (create ? SQLITE_OPEN_CREATE : 0) | SQLITE_OPEN_NOMUTEX;
    const int rc = sqlite3_open_v2(path.c_str(), &out->db, flags, nullptr);
    if (rc != SQLITE_OK) return sql_error(out->db, rc, path);
    sqlite3_extended_result_codes(out->db, 1);
    sqlite3_busy_timeout(out->db, kBusyTimeoutMs);
    if (writer) TMS_RETURN_IF_ERROR(exec(out->db, "PRAGMA journal_mode=DELETE; PRAGMA synchronous=EXTRA", path));
    return Status::OK();
}

// The format version and columns of the file's docs table.
Status read_schema(sqlite3* db, const std::string& what, std::vector<MetaColumn>* columns) {
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(db, "PRAGMA user_version", what, &st));
    if (sqlite3_step(st.s) != SQLITE_ROW) return sql_error(db, sqlite3_errcode(db), what);
    const int version = sqlite3_column_int(st.s, 0);
    if (version != kMetadataFormatVersion) {
        return Status::NotSupported(what + ": metadata format version " + std::to_string(version) +
                                    " is not supported by this build (reads " + std::to_string(kMetadataFormatVersion) +
                                    ")");
    }
    TMS_RETURN_IF_ERROR(prepare(db, "PRAGMA table_info(docs)", what, &st));
    columns->clear();
    int i = 0, rc;
    for (; (rc = sqlite3_step(st.s)) == SQLITE_ROW; ++i) {
        const auto* name = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 1));
        const std::string nm = name ? name : "";
        if (i < 2) {
            if (nm != (i == 0 ? "doc" : "id")) return Status::Corruption(what + ": not a metadata file (table docs)");
            continue;
        }
        columns->push_back(MetaColumn{nm, type_of_decl(reinterpret_cast<const char*>(sqlite3_column_text(st.s, 2)))});
    }
    if (rc != SQLITE_DONE) return sql_error(db, rc, what);
    if (i < 2) return Status::Corruption(what + ": not a metadata file (no table docs)");
    return Status::OK();
}

Status bind_value(sqlite3* db, sqlite3_stmt* s, int at, const MetaValue& v, const std::string& what) {
    int rc = SQLITE_OK;
    switch (v.kind) {
        case MetaValue::Kind::kNull: rc = sqlite3_bind_null(s, at); break;
        case MetaValue::Kind::kInteger: rc = sqlite3_bind_int64(s, at, v.i); break;
        case MetaValue::Kind::kReal: rc = sqlite3_bind_double(s, at, v.r); break;
        case MetaValue::Kind::kText:
            rc = sqlite3_bind_text64(s, at, v.s.data(), v.s.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
            break;
    }
    return rc == SQLITE_OK ? Status::OK() : sql_error(db, rc, what);
}

MetaValue column_value(sqlite3_stmt* s, int c) {
    MetaValue v;
    switch (sqlite3_column_type(s, c)) {
        case SQLITE_INTEGER:
            v.kind = MetaValue::Kind::kInteger;
            v.i = sqlite3_column_int64(s, c);
            break;
        case SQLITE_FLOAT:
            v.kind = MetaValue::Kind::kReal;
            v.r = sqlite3_column_double(s, c);
            break;
        case SQLITE_NULL: break;
        default: {  // text (or a blob, which no writer stores)
            v.kind = MetaValue::Kind::kText;
            const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(s, c));
            v.s.assign(p ? p : "", size_t(sqlite3_column_bytes(s, c)));
        }
    }
    return v;
}

bool file_exists(const std::string& path) {
    std::error_code ec;
    return fs::exists(path, ec);
}

// An SQL string literal of `s`.
std::string sql_literal(const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
    return out + "'";
}

// FTS5's tokenize= argument for each tokenizer's name.
std::string fts_tokenize(const std::string& t) { return t == "porter" ? "porter unicode61" : t; }

// The text index recorded in `db` (*has false without one).
Status read_text_spec(sqlite3* db, const std::string& what, TextIndexSpec* out, bool* has) {
    *has = false;
    Stmt st;
    TMS_RETURN_IF_ERROR(
        prepare(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'text_index'", what, &st));
    int rc = sqlite3_step(st.s);
    if (rc != SQLITE_ROW) return sql_error(db, rc, what);
    if (sqlite3_column_int(st.s, 0) == 0) return Status::OK();
    TMS_RETURN_IF_ERROR(prepare(db, "SELECT column_name, tokenizer FROM text_index", what, &st));
    if ((rc = sqlite3_step(st.s)) != SQLITE_ROW) return Status::Corruption(what + ": its text index is not described");
    const auto text = [&](int c) {
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st.s, c));
        return std::string(p ? p : "");
    };
    out->column = text(0);
    out->tokenizer = text(1);
    *has = true;
    out->spans_column.clear();
    TMS_RETURN_IF_ERROR(
        prepare(db, "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'text_spans'", what, &st));
    if ((rc = sqlite3_step(st.s)) != SQLITE_ROW) return sql_error(db, rc, what);
    if (sqlite3_column_int(st.s, 0) == 0) return Status::OK();
    TMS_RETURN_IF_ERROR(prepare(db, "SELECT column_name FROM text_spans", what, &st));
    if ((rc = sqlite3_step(st.s)) != SQLITE_ROW)
        return Status::Corruption(what + ": its token spans are not described");
    out->spans_column = text(0);
    return Status::OK();
}

}  // namespace

Status CheckTextTokenizer(const std::string& t) {
    if (t == "unicode61" || t == "porter" || t == "trigram") return Status::OK();
    return Status::InvalidArgument("text tokenizer '" + t + "': expected unicode61, porter or trigram");
}

Status ReadTextIndexSpec(const std::string& path, TextIndexSpec* out, bool* has) {
    *has = false;
    if (!file_exists(path)) return Status::OK();
    Conn c;
    TMS_RETURN_IF_ERROR(open_file(path, false, false, &c));
    return read_text_spec(c.db, path, out, has);
}

std::string FtsQuery(const std::string& text) {
    std::string out, word;
    const auto flush = [&] {
        const bool has_word = std::any_of(word.begin(), word.end(), [](char c) {
            return std::isalnum(static_cast<unsigned char>(c)) || static_cast<unsigned char>(c) >= 0x80;
        });
        if (has_word) {
            out += out.empty() ? "\"" : " OR \"";
            for (char c : word) out += c == '"' ? std::string("\"\"") : std::string(1, c);
            out += '"';
        }
        word.clear();
    };
    for (char c : text) {
        if (std::isspace(static_cast<unsigned char>(c))) {
            flush();
        } else {
            word += c;
        }
    }
    flush();
    return out;
}

// ---- writing ---------------------------------------------------------------------------------

struct MetadataWriter::Db {
    Conn conn;
    Stmt insert;  // for the current columns
    bool in_txn = false;
    ~Db() {
        if (in_txn) (void)sqlite3_exec(conn.db, "ROLLBACK", nullptr, nullptr, nullptr);
    }
};

MetadataWriter::~MetadataWriter() {
    db_.reset();
    if (!tmp_.empty()) {
        std::error_code ec;
        fs::remove(tmp_, ec);
        fs::remove(tmp_ + "-journal", ec);
    }
}

Status MetadataWriter::Create(const std::string& path, const std::vector<MetaColumn>& columns,
                              std::unique_ptr<MetadataWriter>* out, const TextIndexSpec* text) {
    std::unique_ptr<MetadataWriter> w(new MetadataWriter());
    w->path_ = path;
    w->tmp_ = path + ".tmp";
    std::error_code ec;
    fs::remove(w->tmp_, ec);  // what an interrupted writer left (the caller holds the writer lock)
    fs::remove(w->tmp_ + "-journal", ec);
    w->db_ = std::make_unique<Db>();
    TMS_RETURN_IF_ERROR(open_file(w->tmp_, true, true, &w->db_->conn));
    std::string ddl = "BEGIN; PRAGMA user_version=" + std::to_string(kMetadataFormatVersion) +
                      "; CREATE TABLE docs (doc INTEGER PRIMARY KEY, id TEXT NOT NULL";
    for (const MetaColumn& c : columns) ddl += ", " + sql_name(c.name) + " " + sql_type(c.type);
    ddl += "); CREATE INDEX docs_id ON docs(id);";
    if (text) {
        const auto col = std::find_if(columns.begin(), columns.end(),
                                      [&](const MetaColumn& c) { return lower(c.name) == lower(text->column); });
        if (col == columns.end() || col->type != MetaType::kText) {
            return Status::InvalidArgument(path + ": the text field '" + text->column +
                                           "' is not a metadata field of text values");
        }
        TMS_RETURN_IF_ERROR(CheckTextTokenizer(text->tokenizer));
        // External content: the FTS5 index reads the text from docs; the triggers keep it in step.
        const std::string c = sql_name(col->name);
        ddl +=
            "CREATE TABLE text_index (column_name TEXT NOT NULL, tokenizer TEXT NOT NULL); "
            "INSERT INTO text_index VALUES (" +
            sql_literal(col->name) + ", " + sql_literal(text->tokenizer) + "); CREATE VIRTUAL TABLE texts USING fts5(" +
            c + ", content='docs', content_rowid='doc', tokenize=" + sql_literal(fts_tokenize(text->tokenizer)) +
            "); CREATE TRIGGER texts_ai AFTER INSERT ON docs BEGIN INSERT INTO texts(rowid, " + c +
            ") VALUES (new.doc, new." + c +
            "); END; CREATE TRIGGER texts_ad AFTER DELETE ON docs BEGIN INSERT INTO texts(texts, rowid, " + c +
            ") VALUES ('delete', old.doc, old." + c +
            "); END; CREATE TRIGGER texts_au AFTER UPDATE ON docs BEGIN INSERT INTO texts(texts, rowid, " + c +
            ") VALUES ('delete', old.doc, old." + c + "); INSERT INTO texts(rowid, " + c + ") VALUES (new.doc, new." +
            c + "); END;";
        if (!text->spans_column.empty()) {
            const auto sp = std::find_if(columns.begin(), columns.end(), [&](const MetaColumn& m) {
                return lower(m.name) == lower(text->spans_column);
            });
            if (sp == columns.end() || sp->type != MetaType::kText) {
                return Status::InvalidArgument(path + ": the spans field '" + text->spans_column +
                                               "' is not a metadata field of token spans");
            }
            ddl += "CREATE TABLE text_spans (column_name TEXT NOT NULL); INSERT INTO text_spans VALUES (" +
                   sql_literal(sp->name) + ");";
        }
    }
    TMS_RETURN_IF_ERROR(exec(w->db_->conn.db, ddl, path));
    w->db_->in_txn = true;
    w->columns_ = columns;
    *out = std::move(w);
    return Status::OK();
}

Status MetadataWriter::Open(const std::string& path, std::unique_ptr<MetadataWriter>* out) {
    std::unique_ptr<MetadataWriter> w(new MetadataWriter());
    w->path_ = path;
    w->db_ = std::make_unique<Db>();
    TMS_RETURN_IF_ERROR(open_file(path, false, true, &w->db_->conn));
    TMS_RETURN_IF_ERROR(exec(w->db_->conn.db, "BEGIN IMMEDIATE", path));
    w->db_->in_txn = true;
    TMS_RETURN_IF_ERROR(read_schema(w->db_->conn.db, path, &w->columns_));
    *out = std::move(w);
    return Status::OK();
}

Status MetadataWriter::AddColumns(const std::vector<MetaColumn>& cols) {
    for (const MetaColumn& c : cols) {
        TMS_RETURN_IF_ERROR(CheckMetaColumnName(c.name, path_));
        TMS_RETURN_IF_ERROR(
            exec(db_->conn.db, "ALTER TABLE docs ADD COLUMN " + sql_name(c.name) + " " + sql_type(c.type), path_));
        columns_.push_back(c);
    }
    if (!cols.empty()) db_->insert.reset();
    return Status::OK();
}

Status MetadataWriter::DeleteFrom(int64_t doc) {
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(db_->conn.db, "DELETE FROM docs WHERE doc >= ?1", path_, &st));
    sqlite3_bind_int64(st.s, 1, doc);
    const int rc = sqlite3_step(st.s);
    return rc == SQLITE_DONE ? Status::OK() : sql_error(db_->conn.db, rc, path_);
}

Status MetadataWriter::Insert(int64_t doc, const std::string& id, const MetaCells& cells) {
    sqlite3* db = db_->conn.db;
    if (!db_->insert.s) {
        std::string sql = "INSERT INTO docs (doc, id", vals = "?1, ?2";
        for (size_t c = 0; c < columns_.size(); ++c) {
            sql += ", " + sql_name(columns_[c].name);
            vals += ", ?" + std::to_string(c + 3);
        }
        TMS_RETURN_IF_ERROR(prepare(db, sql + ") VALUES (" + vals + ")", path_, &db_->insert));
    }
    sqlite3_stmt* s = db_->insert.s;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    sqlite3_bind_int64(s, 1, doc);
    sqlite3_bind_text64(s, 2, id.data(), id.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    for (const auto& [c, v] : cells) {
        if (c < 0 || size_t(c) >= columns_.size()) return Status::Internal(path_ + ": metadata cell of no column");
        TMS_RETURN_IF_ERROR(bind_value(db, s, c + 3, v, path_));
    }
    const int rc = sqlite3_step(s);
    return rc == SQLITE_DONE ? Status::OK() : sql_error(db, rc, path_);
}

Status MetadataWriter::Commit() {
    db_->insert.reset();
    TMS_RETURN_IF_ERROR(exec(db_->conn.db, "COMMIT", path_));
    db_->in_txn = false;
    db_.reset();
    if (tmp_.empty()) return Status::OK();
    // The commit synced the new file. A journal of an older file at the target would be taken
    // for this one's: none may survive the rename.
    std::error_code ec;
    fs::remove(path_ + "-journal", ec);
    fs::rename(tmp_, path_, ec);
    if (ec) return Status::IOError(path_ + ": cannot move " + tmp_ + " to it: " + ec.message());
    tmp_.clear();
    SyncDir(fs::path(path_).parent_path());
    return Status::OK();
}

// ---- reading -------------------------------------------------------------------------------

Status ReadMetadataInfo(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns, int64_t* rows) {
    columns->clear();
    *rows = -1;
    if (!file_exists(path)) return Status::OK();
    Conn c;
    TMS_RETURN_IF_ERROR(open_file(path, false, false, &c));
    TMS_RETURN_IF_ERROR(exec(c.db, "BEGIN", path));  // schema and count of one state
    TMS_RETURN_IF_ERROR(read_schema(c.db, path, columns));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(c.db, "SELECT count(*) FROM docs WHERE doc >= 0 AND doc < ?1", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    const int rc = sqlite3_step(st.s);
    if (rc != SQLITE_ROW) return sql_error(c.db, rc, path);
    *rows = sqlite3_column_int64(st.s, 0);
    return Status::OK();
}

Status ForEachMetadataRow(const std::string& path, int64_t n_docs, std::vector<MetaColumn>* columns,
                          const std::function<Status(int64_t, const std::string&, const MetaCells&)>& row) {
    Conn c;
    TMS_RETURN_IF_ERROR(open_file(path, false, false, &c));
    TMS_RETURN_IF_ERROR(exec(c.db, "BEGIN", path));
    TMS_RETURN_IF_ERROR(read_schema(c.db, path, columns));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(c.db, "SELECT * FROM docs WHERE doc >= 0 AND doc < ?1 ORDER BY doc", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    MetaCells cells;
    std::string id;
    int rc;
    while ((rc = sqlite3_step(st.s)) == SQLITE_ROW) {
        cells.clear();
        const int64_t doc = sqlite3_column_int64(st.s, 0);
        const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(st.s, 1));
        id.assign(p ? p : "", size_t(sqlite3_column_bytes(st.s, 1)));
        for (int k = 0; k < int(columns->size()); ++k) {
            MetaValue v = column_value(st.s, k + 2);
            if (v.kind != MetaValue::Kind::kNull) cells.emplace_back(k, std::move(v));
        }
        TMS_RETURN_IF_ERROR(row(doc, id, cells));
    }
    return rc == SQLITE_DONE ? Status::OK() : sql_error(c.db, rc, path);
}

// ---- the snapshot ----------------------------------------------------------------------------

namespace {

// Only reads of the table and the filter's functions (LIKE and GLOB are functions too) are
// allowed in a snapshot's statements, whatever text reaches prepare.
int filter_authorizer(void*, int action, const char* a, const char* b, const char*, const char*) {
    switch (action) {
        case SQLITE_SELECT: return SQLITE_OK;
        case SQLITE_READ: return a && std::strcmp(a, "docs") == 0 ? SQLITE_OK : SQLITE_DENY;
        case SQLITE_FUNCTION: {
            const std::string f = lower(b ? b : "");
            if (f == "like" || f == "glob") return SQLITE_OK;
            return std::any_of(std::begin(kFilterFunctions), std::end(kFilterFunctions),
                               [&](const char* k) { return f == k; })
                       ? SQLITE_OK
                       : SQLITE_DENY;
        }
        default: return SQLITE_DENY;
    }
}

}  // namespace

struct MetadataSnapshot::Impl {
    Conn mem;
    std::mutex mu;
    // Lexical's statement, and the documents it may return while it runs (mu held; null: all).
    Stmt lexical;
    const uint32_t* allow = nullptr;
    int64_t n_docs = 0;
    FilterDeadline deadline;  // of the evaluation under way (mu held)
    int64_t time_ms = SearcherOptions().filter_time_ms, max_bytes = SearcherOptions().filter_max_bytes;
    struct Compiled {
        std::string where;
        Stmt stmt;
        std::vector<FilterParam> params;
        std::vector<uint32_t> bits;  // the result, once evaluated (count >= 0)
        int64_t count = -1;
    };
    std::list<Compiled> lru;  // most recent first
    std::unordered_map<std::string, std::list<Compiled>::iterator> by_where;
    std::unordered_set<std::string> indexed;  // columns with an index

    // An index on each of `columns` that has none. The authorizer admits filters only, so it
    // is lifted for these statements (their names are checked columns, never user text).
    Status Index(const std::vector<std::string>& columns) {
        for (const std::string& c : columns) {
            if (indexed.count(c)) continue;
            sqlite3_set_authorizer(mem.db, nullptr, nullptr);
            // Stored values of any length are indexed (the limit binds what filters compute).
            const int limit = sqlite3_limit(mem.db, SQLITE_LIMIT_LENGTH, INT32_MAX);
            const std::string sql =
                "CREATE INDEX IF NOT EXISTS " + sql_name("tms_ix_" + c) + " ON docs(" + sql_name(c) + ")";
            const int rc = sqlite3_exec(mem.db, sql.c_str(), nullptr, nullptr, nullptr);
            sqlite3_limit(mem.db, SQLITE_LIMIT_LENGTH, limit);
            sqlite3_set_authorizer(mem.db, filter_authorizer, nullptr);
            if (rc != SQLITE_OK)
                return Status::Internal(std::string("filter: indexing ") + c + ": " + sqlite3_errmsg(mem.db));
            indexed.insert(c);
        }
        return Status::OK();
    }
};

MetadataSnapshot::~MetadataSnapshot() = default;

Status MetadataSnapshot::Load(const std::string& index_dir, int64_t n_docs, std::unique_ptr<MetadataSnapshot>* out) {
    out->reset();
    const std::string path = (fs::path(index_dir) / kMetadataFile).string();
    if (!file_exists(path)) return Status::OK();
    std::unique_ptr<MetadataSnapshot> s(new MetadataSnapshot());
    s->impl_ = std::make_unique<Impl>();
    s->n_docs_ = n_docs;
    sqlite3*& mem = s->impl_->mem.db;
    int rc =
        sqlite3_open_v2(":memory:", &mem, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
    if (rc != SQLITE_OK) return sql_error(mem, rc, path);
    {
        Conn file;
        TMS_RETURN_IF_ERROR(open_file(path, false, false, &file));
        sqlite3_backup* b = sqlite3_backup_init(mem, "main", file.db, "main");
        if (!b) return sql_error(mem, sqlite3_errcode(mem), path);
        rc = sqlite3_backup_step(b, -1);  // every page, in one read transaction of the file
        sqlite3_backup_finish(b);
        if (rc != SQLITE_DONE) return sql_error(file.db, rc, path);
    }
    TMS_RETURN_IF_ERROR(read_schema(mem, path, &s->columns_));
    Stmt st;
    TMS_RETURN_IF_ERROR(prepare(mem, "DELETE FROM docs WHERE doc >= ?1 OR doc < 0", path, &st));
    sqlite3_bind_int64(st.s, 1, n_docs);
    if ((rc = sqlite3_step(st.s)) != SQLITE_DONE) return sql_error(mem, rc, path);
    TMS_RETURN_IF_ERROR(prepare(mem, "SELECT count(*) FROM docs", path, &st));
    if ((rc = sqlite3_step(st.s)) != SQLITE_ROW) return sql_error(mem, rc, path);
    s->rows_ = sqlite3_column_int64(st.s, 0);
    st.reset();  // no statement may be active while functions are replaced
    TextIndexSpec text;
    TMS_RETURN_IF_ERROR(read_text_spec(mem, path, &text, &s->has_text_));
    s->spans_column_ = text.spans_column;
    s->impl_->n_docs = n_docs;
    rc = sqlite3_create_function_v2(
        mem, "tms_allowed", 1, SQLITE_UTF8, s->impl_.get(),
        [](sqlite3_context* ctx, int, sqlite3_value** v) {
            const auto* im = static_cast<const Impl*>(sqlite3_user_data(ctx));
            const int64_t d = sqlite3_value_int64(v[0]);
            const bool in = d >= 0 && d < im->n_docs && (!im->allow || ((im->allow[d / 32] >> (d % 32)) & 1u));
            sqlite3_result_int(ctx, in ? 1 : 0);
        },
        nullptr, nullptr, nullptr);
    if (rc != SQLITE_OK) return sql_error(mem, rc, path);
    sqlite3_set_authorizer(mem, filter_authorizer, nullptr);
    // Bounded evaluation: our LIKE, GLOB and instr() (linear, interruptible), a check of the
    // deadline every 1,000 virtual-machine steps, and a limit on every value's length.
    if (!RegisterFilterFunctions(mem, &s->impl_->deadline)) return sql_error(mem, sqlite3_errcode(mem), path);
    sqlite3_progress_handler(
        mem, 1000, [](void* d) { return static_cast<FilterDeadline*>(d)->Check() ? 1 : 0; }, &s->impl_->deadline);
    s->SetLimits(s->impl_->time_ms, s->impl_->max_bytes);
    *out = std::move(s);
    return Status::OK();
}

void MetadataSnapshot::SetLimits(int64_t time_ms, int64_t max_bytes) {
    std::lock_guard<std::mutex> g(impl_->mu);
    impl_->time_ms = std::max<int64_t>(1, time_ms);
    impl_->max_bytes = std::clamp<int64_t>(max_bytes, 1, INT32_MAX);
    sqlite3_limit(impl_->mem.db, SQLITE_LIMIT_LENGTH, int(impl_->max_bytes));
}

Status MetadataSnapshot::Filter(const std::string& where, std::vector<uint32_t>* bits, int64_t* count) const {
    Impl& im = *impl_;
    std::lock_guard<std::mutex> g(im.mu);
    auto it = im.by_where.find(where);
    if (it != im.by_where.end()) {
        im.lru.splice(im.lru.begin(), im.lru, it->second);
        if (it->second->count >= 0) {
            *bits = it->second->bits;
            *count = it->second->count;
            return Status::OK();
        }
    } else {
        Impl::Compiled c;
        c.where = where;
        std::string sql;
        std::vector<std::string> used;
        TMS_RETURN_IF_ERROR(CompileFilter(where, columns_, &sql, &c.params, &used));
        TMS_RETURN_IF_ERROR(im.Index(used));
        sql = "SELECT doc FROM docs WHERE (" + sql + ")";
        const char* tail = nullptr;
        if (sqlite3_prepare_v2(im.mem.db, sql.c_str(), int(sql.size()), &c.stmt.s, &tail) != SQLITE_OK || !c.stmt.s ||
            (tail && *tail)) {
            return Status::InvalidArgument(std::string("filter: ") + sqlite3_errmsg(im.mem.db));
        }
        im.lru.push_front(std::move(c));
        im.by_where[where] = im.lru.begin();
        if (im.lru.size() > size_t(kFilterCache)) {
            im.by_where.erase(im.lru.back().where);
            im.lru.pop_back();
        }
    }
    Impl::Compiled& c = im.lru.front();
    sqlite3_stmt* s = c.stmt.s;
    sqlite3_reset(s);
    sqlite3_clear_bindings(s);
    for (size_t p = 0; p < c.params.size(); ++p) {
        if (!bind_value(im.mem.db, s, int(p) + 1, c.params[p], "filter").ok()) {
            return Status::InvalidArgument(std::string("filter: ") + sqlite3_errmsg(im.mem.db));
        }
    }
    bits->assign(size_t((n_docs_ + 31) / 32), 0u);
    int64_t n = 0;
    int rc;
    im.deadline = FilterDeadline{std::chrono::steady_clock::now() + std::chrono::milliseconds(im.time_ms)};
    while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
        const int64_t d = sqlite3_column_int64(s, 0);
        if (d < 0 || d >= n_docs_) continue;
        uint32_t& w = (*bits)[size_t(d / 32)];
        const uint32_t m = 1u << (d % 32);
        n += (w & m) ? 0 : 1;
        w |= m;
    }
    const bool timed_out = im.deadline.passed;
    im.deadline = FilterDeadline{};
    if (rc != SQLITE_DONE) {
        const std::string msg = sqlite3_errmsg(im.mem.db);
        sqlite3_reset(s);
        if (timed_out) {
            return Status::InvalidArgument("filter: ran longer than " + std::to_string(im.time_ms) +
                                           " ms (the filter's time limit, --filter-time-ms)");
        }
        if (rc == SQLITE_TOOBIG) {
            return Status::InvalidArgument("filter: a value longer than " + std::to_string(im.max_bytes) +
                                           " bytes (the filter's memory limit, --filter-max-bytes)");
        }
        return Status::InvalidArgument("filter: " + msg);
    }
    sqlite3_reset(s);
    *count = n;
    c.bits = *bits;
    c.count = n;
    return Status::OK();
}

Status MetadataSnapshot::Lexical(const std::string& text, int k, const uint32_t* allowed,
                                 std::vector<std::pair<int64_t, float>>* hits) const {
    hits->clear();
    if (!has_text_) {
        return Status::NotSupported("bm25: this index has no text (index or add documents with a text field)");
    }
    const std::string q = FtsQuery(text);
    if (q.empty() || k <= 0) return Status::OK();
    Impl& im = *impl_;
    std::lock_guard<std::mutex> g(im.mu);
    // The authorizer admits filters only: lifted while this fixed statement is prepared and run
    // (FTS5 prepares its own reads of its tables as it runs; the query text is a bound value,
    // which FTS5's query language cannot turn into SQL).
    sqlite3_set_authorizer(im.mem.db, nullptr, nullptr);
    struct Restore {
        sqlite3* db;
        ~Restore() { sqlite3_set_authorizer(db, filter_authorizer, nullptr); }
    } restore{im.mem.db};
    if (!im.lexical.s) {
        TMS_RETURN_IF_ERROR(prepare(im.mem.db,
                                    "SELECT rowid, bm25(texts) FROM texts WHERE texts MATCH ?1 AND "
                                    "tms_allowed(rowid) ORDER BY rank, rowid LIMIT ?2",
                                    "bm25", &im.lexical));
    }
    sqlite3_stmt* s = im.lexical.s;
    sqlite3_reset(s);
    sqlite3_bind_text64(s, 1, q.data(), q.size(), SQLITE_TRANSIENT, SQLITE_UTF8);
    sqlite3_bind_int(s, 2, k);
    im.allow = allowed;
    int rc;
    while ((rc = sqlite3_step(s)) == SQLITE_ROW)
        hits->push_back({sqlite3_column_int64(s, 0), float(-sqlite3_column_double(s, 1))});
    im.allow = nullptr;
    const std::string msg = rc == SQLITE_DONE ? "" : sqlite3_errmsg(im.mem.db);
    sqlite3_reset(s);
    if (rc != SQLITE_DONE) return Status::InvalidArgument("bm25: " + msg);
    return Status::OK();
}

Status MetadataSnapshot::Rows(const std::vector<int64_t>& docs, const std::vector<std::string>& fields,
                              std::vector<std::string>* objects) const {
    // The columns asked for, as declared (names match ignoring case, as filters match them).
    std::vector<std::string> names;
    for (const std::string& f : fields) {
        auto it = std::find_if(columns_.begin(), columns_.end(),
                               [&](const MetaColumn& c) { return lower(c.name) == lower(f); });
        if (lower(f) == "id") {
            names.push_back("id");
        } else if (it == columns_.end()) {
            std::string known = "id";
            for (const MetaColumn& c : columns_) known += ", " + c.name;
            return Status::InvalidArgument("fields: unknown column '" + f + "' (columns: " + known + ")");
        } else {
            names.push_back(it->name);
        }
    }
    if (fields.empty()) {
        for (const MetaColumn& c : columns_) names.push_back(c.name);
    }
    objects->assign(docs.size(), "{}");
    if (names.empty()) return Status::OK();
    std::string sql = "SELECT ";
    for (size_t c = 0; c < names.size(); ++c) sql += (c ? ", " : "") + sql_name(names[c]);
    sql += " FROM docs WHERE doc = ?1";
    Impl& im = *impl_;
    std::lock_guard<std::mutex> g(im.mu);
    Stmt st;
    if (sqlite3_prepare_v2(im.mem.db, sql.c_str(), int(sql.size()), &st.s, nullptr) != SQLITE_OK || !st.s) {
        return Status::Internal(std::string("metadata: ") + sqlite3_errmsg(im.mem.db));
    }
    for (size_t i = 0; i < docs.size(); ++i) {
        if (docs[i] < 0 || docs[i] >= n_docs_) {
            return Status::InvalidArgument("metadata: document " + std::to_string(docs[i]) + " is not in the index");
        }
        sqlite3_reset(st.s);
        sqlite3_bind_int64(st.s, 1, docs[i]);
        nlohmann::json o = nlohmann::json::object();
        if (sqlite3_step(st.s) == SQLITE_ROW) {
            for (size_t c = 0; c < names.size(); ++c) {
                const int col = int(c);
                switch (sqlite3_column_type(st.s, col)) {
                    case SQLITE_INTEGER: o[names[c]] = sqlite3_column_int64(st.s, col); break;
                    case SQLITE_FLOAT: o[names[c]] = sqlite3_column_double(st.s, col); break;
                    case SQLITE_TEXT:
                        o[names[c]] = std::string(reinterpret_cast<const char*>(sqlite3_column_text(st.s, col)),
                                                  size_t(sqlite3_column_bytes(st.s, col)));
                        break;
                    default: o[names[c]] = nullptr;
                }
            }
        }
        (*objects)[i] = o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    return Status::OK();
}

}  // namespace tms::index
