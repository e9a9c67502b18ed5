// Helpers shared by the tests: random data (never zeros), relative error, temp folders.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "fanout/core/error.h"
#include "fanout/core/tensor.h"

namespace fanout::testing {

// Uniform in [-scale, scale) from a fixed seed.
inline std::vector<float> random_floats(size_t n, uint64_t seed, float scale = 1.0f) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> v(n);
    for (auto& x : v) x = dist(rng);
    return v;
}

inline Tensor random_tensor(Shape shape, uint64_t seed, float scale = 1.0f) {
    Tensor t = Tensor::zeros(shape, DType::kF32);
    const auto v = random_floats(static_cast<size_t>(t.numel()), seed, scale);
    std::copy(v.begin(), v.end(), t.data_as<float>());
    return t;
}

// Fills a tensor with NaN so unwritten outputs show.
inline void poison(Tensor& t) {
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = std::nanf("");
}

// ||a - b|| / ||b||, and NaN anywhere gives infinity.
inline double rel_error(const float* a, const float* b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        den += double(b[i]) * b[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
}

inline double max_abs_diff(const float* a, const float* b, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; ++i) {
        if (!std::isfinite(a[i]) || !std::isfinite(b[i])) return INFINITY;
        m = std::max(m, std::fabs(double(a[i]) - b[i]));
    }
    return m;
}

// A fresh, empty folder under the build tree's temp area.
inline std::string temp_dir(const std::string& name) {
    const auto dir =
        std::filesystem::temp_directory_path() / ("fanout_test_" + name + "_" + std::to_string(::getpid()));
    std::filesystem::remove_all(dir);
    std::filesystem::create_directories(dir);
    return dir.string();
}

// A fixture with a fresh folder per test (dir_), removed afterwards; path(name) is a file in it.
class TempDirTest : public ::testing::Test {
  protected:
    void SetUp() override { dir_ = temp_dir(::testing::UnitTest::GetInstance()->current_test_info()->name()); }
    void TearDown() override { std::filesystem::remove_all(dir_); }
    std::string path(const std::string& name) const { return (std::filesystem::path(dir_) / name).string(); }

    std::string dir_;
};

// The message of the fanout::Error that fn throws; fails the test if it throws nothing or
// something else.
template <typename Fn>
std::string error_of(Fn&& fn) {
    try {
        fn();
    } catch (const Error& e) {
        return e.what();
    } catch (const std::exception& e) {
        ADD_FAILURE() << "expected fanout::Error, got another exception: " << e.what();
        return "";
    }
    ADD_FAILURE() << "expected fanout::Error, nothing was thrown";
    return "";
}

// K distinct experts of E per token, skewed toward the low ids (weights 1 / (e + 1)^skew), so a
// few experts get far more than their share (and overflow a masked layout's cap).
inline std::vector<int32_t> skewed_routing(int T, int K, int E, uint32_t seed, double skew) {
    std::vector<double> weights;
    for (int e = 0; e < E; ++e) weights.push_back(1.0 / std::pow(e + 1.0, skew));
    std::mt19937 rng(seed);
    std::discrete_distribution<int> pick(weights.begin(), weights.end());
    std::vector<int32_t> idx;
    for (int t = 0; t < T; ++t) {
        const size_t first = idx.size();
        while (idx.size() < first + size_t(K)) {
            const int e = pick(rng);
            if (std::find(idx.begin() + first, idx.end(), e) == idx.end()) idx.push_back(e);
        }
    }
    return idx;
}

}  // namespace fanout::testing
