// Copyright TileMaxSim authors. Updating an index in place: add, replace, delete, compact.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tilemaxsim/metadata.h"
#include "tilemaxsim/status.h"
#include "tilemaxsim/types.h"

namespace tms {

/// Adds and deletes documents with stable external ids. New documents are encoded against the
/// index's existing centroids and codec. One writer at a time: Open fails with a clear message
/// while another process holds the index. Nothing is visible to searchers until Commit, which
/// applies every change in one atomic batch; a Searcher opened before sees the old state,
/// one opened after sees the new one, never a mix.
class IndexUpdater {
public:
    static Status Open(const std::string& path, bool progress, std::unique_ptr<IndexUpdater>* out);
    ~IndexUpdater();

    /// Add documents (same input rules as IndexBuilder::Build; ids are required). An id that
    /// is already in the index is an error unless `replace`, which deletes the old document.
    /// `metadata`: the new documents' attributes (new columns are added to the index's). In an
    /// index with metadata, documents added without get a row of NULLs; an index without gets
    /// its metadata at the first add that brings some (NULLs for the documents it held).
    Status Add(const EmbeddingView& tokens, const std::vector<int64_t>& doclens,
               const std::vector<std::string>& doc_ids, bool replace, const DocMetadata* metadata = nullptr);
    /// Add from files (docs .npy, doclens .npy, ids one per line).
    Status AddFromFiles(const std::string& docs_npy, const std::string& doclens_npy, const std::string& doc_ids_txt,
                        bool replace, const DocMetadata* metadata = nullptr);
    /// Tombstone documents by external id. An id deleted before is skipped (counted in
    /// *already_deleted when given); an id the index never held is an error. Deleted documents
    /// vanish from every search path at once; Compact reclaims their space.
    Status Delete(const std::vector<std::string>& doc_ids, int64_t* already_deleted = nullptr);
    /// Apply the pending changes atomically and durably.
    Status Commit();
    /// The index as it will be after Commit.
    const IndexInfo& info() const;

private:
    IndexUpdater();
    struct Impl;
    std::unique_ptr<Impl> impl_;
};

/// Rewrite an index without its deleted documents (internal ids are renumbered; external ids
/// stay, and each document's metadata follows it). The old index is replaced only when the new
/// one is complete.
Status CompactIndex(const std::string& path, bool progress = true);

}  // namespace tms
