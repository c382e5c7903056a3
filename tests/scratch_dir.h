// Copyright TileMaxSim authors. The tests' scratch directories: one place names, empties and
// removes them, so that test runs do not pile indexes up in the temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <system_error>
#include <vector>

namespace tms::testing {

/// Every directory ScratchDir made in this test process. They are removed when the program's tests
/// end with none failed; after a failure, or with TMS_KEEP_TEST_DIRS set, they stay to be looked at.
class ScratchDirs : public ::testing::Environment {
public:
    void Add(const std::filesystem::path& p) {
        std::lock_guard<std::mutex> lock(mu_);
        dirs_.push_back(p);
    }
    void TearDown() override {
        if (!::testing::UnitTest::GetInstance()->Passed() || std::getenv("TMS_KEEP_TEST_DIRS")) return;
        std::lock_guard<std::mutex> lock(mu_);
        for (const auto& p : dirs_) {
            std::error_code ec;
            std::filesystem::remove_all(p, ec);
        }
        dirs_.clear();
    }

private:
    std::mutex mu_;
    std::vector<std::filesystem::path> dirs_;
};

/// Registered with gtest before main runs (gtest owns it); one instance per program.
inline ScratchDirs* const kScratchDirs =
    static_cast<ScratchDirs*>(::testing::AddGlobalTestEnvironment(new ScratchDirs));

/// TempDir()/NAME_PID, empty (removed first, then created); removed at the end as above.
inline std::filesystem::path ScratchDir(const std::string& name) {
    const std::filesystem::path p =
        std::filesystem::path(::testing::TempDir()) / (name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(p);
    std::filesystem::create_directories(p);
    kScratchDirs->Add(p);
    return p;
}

}  // namespace tms::testing
