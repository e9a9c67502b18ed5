// Where the HF-oracle fixtures are (tests/fixtures/oracle, made by scripts/make_oracle_fixtures.py
// on the GPU machine): shared by the CPU and GPU model tests.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace fanout::testing {

// The committed fixtures, or FANOUT_ORACLE_DIR (scripts/gpu_check.sh points it at fixtures
// freshly made by transformers on the GPU machine).
inline std::filesystem::path oracle_dir() {
    if (const char* d = std::getenv("FANOUT_ORACLE_DIR"); d && *d) return d;
    return std::filesystem::path(FANOUT_SOURCE_DIR) / "tests/fixtures/oracle";
}

inline std::vector<std::string> fixture_names() {
    std::vector<std::string> names;
    for (const auto& e : std::filesystem::directory_iterator(oracle_dir()))
        if (std::filesystem::exists(e.path() / "oracle.json")) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
}

}  // namespace fanout::testing
