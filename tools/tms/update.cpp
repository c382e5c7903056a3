// Copyright TileMaxSim authors. `tms add` and `tms delete`: one commit each, by external id.
#include "tools/tms/common.h"
#include "base/log.h"
#include "base/progress.h"

namespace tms::cli {

std::vector<Command> AddUpdate(CLI::App& app) {
    struct State {
        std::string upd_index, upd_docs, upd_doclens, upd_ids, upd_meta, upd_meta_types;
        bool upd_replace = false;
    };
    auto s = std::make_shared<State>();
    auto& upd_index = s->upd_index;
    auto& upd_docs = s->upd_docs;
    auto& upd_doclens = s->upd_doclens;
    auto& upd_ids = s->upd_ids;
    auto& upd_meta = s->upd_meta;
    auto& upd_meta_types = s->upd_meta_types;
    auto& upd_replace = s->upd_replace;
    auto* add = app.add_subcommand("add", "Add documents to an index (encoded with its centroids and codec)");
    add->add_option("--index", upd_index, "Index directory")->required();
    add->add_option("--docs", upd_docs, "Token embeddings .npy [n_tokens, dim]")->required();
    add->add_option("--doclens", upd_doclens, "Tokens per document .npy [n_docs]")->required();
    add->add_option("--doc-ids", upd_ids, "Ids of the new documents, one per line")->required();
    add->add_flag("--replace", upd_replace, "Replace documents whose id is already in the index");
    auto* upd_meta_opt = add->add_option("--metadata", upd_meta,
                                         std::string(kMetadataHelp) +
                                             "; new columns are added to the index's, and "
                                             "documents added without metadata get NULLs");
    add->add_option("--metadata-types", upd_meta_types, kMetadataTypesHelp)->needs(upd_meta_opt);
    auto* del = app.add_subcommand("delete", "Delete documents by id (tombstones; `tms compact` reclaims space)");
    del->add_option("--index", upd_index, "Index directory")->required();
    del->add_option("--doc-ids", upd_ids, "Ids to delete, one per line")->required();
    auto run = [s, add, del]() -> int {
        auto& upd_index = s->upd_index;
        auto& upd_docs = s->upd_docs;
        auto& upd_doclens = s->upd_doclens;
        auto& upd_ids = s->upd_ids;
        auto& upd_meta = s->upd_meta;
        auto& upd_meta_types = s->upd_meta_types;
        auto& upd_replace = s->upd_replace;
        const std::string cmd = add->parsed() ? "add" : "delete";
        const auto t0 = Clock::now();
        std::unique_ptr<tms::DocMetadata> metadata;  // read (and checked) before the index is opened
        tms::Status st = add->parsed() ? load_metadata(upd_meta, upd_meta_types, &metadata) : tms::Status::OK();
        std::unique_ptr<tms::IndexUpdater> u;
        if (st.ok()) st = tms::IndexUpdater::Open(upd_index, true, &u);
        const int64_t before_docs = st.ok() ? u->info().n_docs : 0, before_del = st.ok() ? u->info().n_deleted : 0;
        int64_t already_deleted = 0;
        if (st.ok() && add->parsed()) st = u->AddFromFiles(upd_docs, upd_doclens, upd_ids, upd_replace, metadata.get());
        if (st.ok() && del->parsed()) {
            std::vector<std::string> ids;
            st = tms::ReadLines(upd_ids, &ids);
            if (st.ok()) st = u->Delete(ids, &already_deleted);
            if (!st.ok() && st.message().rfind("doc-ids:", 0) == 0)
                st = tms::Status(st.code(), upd_ids + st.message().substr(7));
        }
        if (st.ok()) st = u->Commit();
        if (!st.ok()) return fail(cmd, st);
        const long long added = u->info().n_docs - before_docs, removed = u->info().n_deleted - before_del;
        std::string what = add->parsed() ? std::to_string(added) + " added" +
                                               (removed ? " (" + std::to_string(removed) + " replaced)" : "")
                                         : std::to_string(removed) + " deleted";
        if (already_deleted) what += ", " + std::to_string(already_deleted) + " already deleted (skipped)";
        tms::LogInfo("tms %s: %s in %.2f s; index has %lld live documents -> %s\n", cmd.c_str(), what.c_str(),
                     tms::SecondsSince(t0), (long long)(u->info().n_docs - u->info().n_deleted), upd_index.c_str());
        return 0;
    };
    return {{add, run}, {del, run}};
}

}  // namespace tms::cli
