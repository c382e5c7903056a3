// Copyright TileMaxSim authors. `tms compact`: rewrite an index without its deleted documents.
#include "tools/tms/common.h"
#include "base/log.h"
#include "base/progress.h"

namespace tms::cli {

Command AddCompact(CLI::App& app) {
    struct State {
        std::string upd_index;
    };
    auto s = std::make_shared<State>();
    auto& upd_index = s->upd_index;
    auto* compact = app.add_subcommand("compact", "Rewrite an index without its deleted documents");
    compact->add_option("--index", upd_index, "Index directory")->required();
    auto run = [s]() -> int {
        auto& upd_index = s->upd_index;
        const auto t0 = Clock::now();
        tms::Status st = tms::CompactIndex(upd_index, true);
        if (!st.ok()) return fail("compact", st);
        tms::LogInfo("tms compact: %s rewritten in %.2f s\n", upd_index.c_str(), tms::SecondsSince(t0));
        return 0;
    };
    return {compact, run};
}

}  // namespace tms::cli
