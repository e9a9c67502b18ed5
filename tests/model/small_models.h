// What the CPU model's parallel tests share (ep_model_test, microbatch_test, tp_model_test): the
// tiny preset at a 1,000-token vocabulary written once per test suite as a bf16 and an FP8
// checkpoint, and the comparisons they make.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "fanout/model/synthetic.h"
#include "test_util.h"

namespace fanout::model::testing {

constexpr int64_t kMaxTokens = 64;  // tokens per rank the tests' EP fabrics carry

inline io::ModelConfig small_config() {
    io::ModelConfig c = preset_config("tiny");
    c.vocab_size = 1000;
    return c;
}

// Parameterized by "bf16" or "fp8": dir() is that checkpoint, written once for the suite.
class SmallModels : public ::testing::TestWithParam<std::string> {
  protected:
    static void SetUpTestSuite() {
        dir_ = new std::string(fanout::testing::temp_dir("small_models"));
        write_synthetic_model(*dir_ + "/bf16", small_config(), {});
        io::ModelConfig fp8 = small_config();
        fp8.fp8 = io::Fp8QuantConfig{};
        write_synthetic_model(*dir_ + "/fp8", fp8, {});
    }
    static void TearDownTestSuite() {
        std::filesystem::remove_all(*dir_);
        delete dir_;
        dir_ = nullptr;
    }
    std::string dir() const { return *dir_ + "/" + GetParam(); }
    static inline std::string* dir_ = nullptr;
};

// max |a − b| over two tensors of the same shape (a huge value when the shapes differ).
inline double max_diff(const Tensor& a, const Tensor& b) {
    EXPECT_EQ(a.shape(), b.shape());
    if (a.shape() != b.shape()) return 1e9;
    return fanout::testing::max_abs_diff(a.data_as<float>(), b.data_as<float>(), static_cast<size_t>(a.numel()));
}

// n token ids in the small vocabulary, different for each seed.
inline std::vector<int32_t> ids(int n, int seed) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back((seed * 131 + i * 37 + 5) % 997);
    return v;
}

}  // namespace fanout::model::testing
