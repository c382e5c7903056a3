// Copyright TileMaxSim authors. Document metadata: a JSONL file resolved against documents
// "0".."n-1" (in order, or by id), and the same bytes as a filter expression.
#include "index/ingest/metadata_jsonl.h"
#include "index/metadata/metadata.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    const std::string path = tms::fuzz::AsFile(data, size, "meta.jsonl");
    tms::DocMetadata md;
    if (tms::LoadMetadataJsonl(path, &md).ok()) {
        std::vector<std::string> ids;
        for (size_t i = 0; i < md.objects.size(); ++i) ids.push_back(std::to_string(i));
        tms::index::MetaRows rows;
        (void)tms::index::ResolveMetadata(md, ids, {{"year", tms::MetaType::kInteger}}, &rows);
    }
    std::string sql;
    std::vector<tms::index::FilterParam> params;
    (void)tms::index::CompileFilter(std::string(reinterpret_cast<const char*>(data), size),
                                    {{"year", tms::MetaType::kInteger}, {"lang", tms::MetaType::kText}}, &sql, &params);
    return 0;
}
