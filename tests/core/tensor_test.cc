// Tests of fanout::Tensor: allocation, views and their lifetimes, reshape, slice_rows and
// check_tensor, including the errors each raises and what their messages name.
#include "fanout/core/tensor.h"
#include "test_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "fanout/core/error.h"

namespace fanout {
namespace {

using ::testing::HasSubstr;

using fanout::testing::error_of;

TEST(ShapeTest, StrAndNumel) {
    EXPECT_EQ(shape_str({}), "[]");
    EXPECT_EQ(shape_str({2, 3, 4}), "[2, 3, 4]");
    EXPECT_EQ(shape_numel({}), 1);
    EXPECT_EQ(shape_numel({2, 3, 4}), 24);
    EXPECT_EQ(shape_numel({5, 0, 7}), 0);
}

TEST(TensorTest, ZerosIsZeroFilledAlignedAndShaped) {
    Tensor t = Tensor::zeros({3, 5}, DType::kBF16);
    ASSERT_TRUE(t.defined());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.data()) % 64, 0u);
    EXPECT_EQ(t.dtype(), DType::kBF16);
    EXPECT_EQ(t.device(), Device::kCPU);
    EXPECT_EQ(t.ndim(), 2);
    EXPECT_EQ(t.numel(), 15);
    EXPECT_EQ(t.nbytes(), 30u);
    EXPECT_EQ(t.dim(0), 3);
    EXPECT_EQ(t.dim(1), 5);
    EXPECT_EQ(t.dim(-1), 5);
    EXPECT_EQ(t.dim(-2), 3);
    const uint16_t* p = t.data_as<uint16_t>();
    for (int64_t i = 0; i < t.numel(); ++i) EXPECT_EQ(p[i], 0) << i;
}

TEST(TensorTest, ZerosOfNoElementsAndScalars) {
    Tensor empty = Tensor::zeros({0, 4}, DType::kF32);
    EXPECT_TRUE(empty.defined());
    EXPECT_EQ(empty.numel(), 0);
    EXPECT_EQ(empty.nbytes(), 0u);
    Tensor scalar = Tensor::zeros({}, DType::kF64);
    EXPECT_EQ(scalar.ndim(), 0);
    EXPECT_EQ(scalar.numel(), 1);
    EXPECT_EQ(scalar.data_as<double>()[0], 0.0);
    EXPECT_FALSE(Tensor().defined()) << "a default Tensor has no memory";
}

TEST(TensorTest, ZerosRejectsNegativeExtent) {
    const std::string msg = error_of([] { Tensor::zeros({2, -3}, DType::kF32); });
    EXPECT_THAT(msg, HasSubstr("negative extent"));
    EXPECT_THAT(msg, HasSubstr("[2, -3]"));
}

TEST(TensorTest, DimOutOfRange) {
    Tensor t = Tensor::zeros({2, 3}, DType::kF32);
    for (int i : {2, -3, 100}) {
        const std::string msg = error_of([&] { t.dim(i); });
        EXPECT_THAT(msg, HasSubstr("dim(" + std::to_string(i) + ")"));
        EXPECT_THAT(msg, HasSubstr("[2, 3]"));
    }
}

TEST(TensorTest, ViewSharesMemoryAndKeepsOwnerAlive) {
    auto owner = std::make_shared<std::vector<float>>(6, 1.5f);
    std::weak_ptr<std::vector<float>> watch = owner;
    Tensor t = Tensor::view(owner->data(), DType::kF32, {2, 3}, Device::kCPU, owner);
    owner.reset();
    ASSERT_FALSE(watch.expired()) << "the view must keep its owner alive";
    EXPECT_EQ(t.data_as<float>()[5], 1.5f);
    Tensor copy = t;  // shallow
    EXPECT_EQ(copy.data(), t.data());
    t = Tensor();
    EXPECT_FALSE(watch.expired());
    copy = Tensor();
    EXPECT_TRUE(watch.expired());
}

TEST(TensorTest, CopiesAreShallow) {
    Tensor a = Tensor::zeros({4}, DType::kI32);
    Tensor b = a;
    b.data_as<int32_t>()[2] = 7;
    EXPECT_EQ(a.data_as<int32_t>()[2], 7);
}

TEST(TensorTest, ReshapeKeepsMemory) {
    Tensor t = Tensor::zeros({2, 6}, DType::kF32);
    Tensor r = t.reshape({3, 4});
    EXPECT_EQ(r.data(), t.data());
    EXPECT_EQ(r.shape(), (Shape{3, 4}));
    EXPECT_EQ(t.shape(), (Shape{2, 6})) << "the original keeps its shape";
    EXPECT_EQ(t.reshape({12}).ndim(), 1);
    EXPECT_EQ(t.reshape({1, 12, 1}).ndim(), 3);
    EXPECT_EQ(Tensor::zeros({1}, DType::kF32).reshape({}).ndim(), 0);
}

TEST(TensorTest, ReshapeRejectsOtherElementCount) {
    Tensor t = Tensor::zeros({2, 6}, DType::kF32);
    const std::string msg = error_of([&] { t.reshape({5, 2}); });
    EXPECT_THAT(msg, HasSubstr("[2, 6]"));
    EXPECT_THAT(msg, HasSubstr("[5, 2]"));
    EXPECT_THAT(msg, HasSubstr("element counts differ"));
    EXPECT_THROW(t.reshape({}), Error);
    EXPECT_THROW(t.reshape({0}), Error);
}

// Regression (was a bug): Tensor::reshape checks only the product of the extents, so two negative
// extents whose product matches are accepted. Enable once reshape rejects negative extents.
TEST(TensorTest, ReshapeRejectsNegativeExtents) {
    Tensor t = Tensor::zeros({2, 3}, DType::kF32);
    EXPECT_THROW(t.reshape({-2, -3}), Error);
    Tensor empty = Tensor::zeros({0, 3}, DType::kF32);
    EXPECT_THROW(empty.reshape({0, -1}), Error);
}

TEST(TensorTest, SliceRowsViewsContiguousRows) {
    Tensor t = Tensor::zeros({5, 3}, DType::kI32);
    for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = static_cast<int32_t>(i);
    Tensor s = t.slice_rows(1, 4);
    EXPECT_EQ(s.shape(), (Shape{3, 3}));
    EXPECT_EQ(s.data_as<int32_t>(), t.data_as<int32_t>() + 3);
    EXPECT_EQ(s.data_as<int32_t>()[0], 3);
    EXPECT_EQ(s.data_as<int32_t>()[8], 11);
    EXPECT_EQ(t.slice_rows(0, 5).data(), t.data());
    EXPECT_EQ(t.slice_rows(2, 2).numel(), 0);
    EXPECT_EQ(t.slice_rows(5, 5).shape(), (Shape{0, 3}));
    // Rows of a 1-d tensor are single elements; of a 3-d tensor, whole matrices.
    Tensor v = Tensor::zeros({8}, DType::kBF16);
    EXPECT_EQ(v.slice_rows(3, 5).data_as<uint16_t>(), v.data_as<uint16_t>() + 3);
    Tensor cube = Tensor::zeros({4, 2, 3}, DType::kF32);
    EXPECT_EQ(cube.slice_rows(2, 3).data_as<float>(), cube.data_as<float>() + 12);
    EXPECT_EQ(cube.slice_rows(2, 3).shape(), (Shape{1, 2, 3}));
}

TEST(TensorTest, SliceRowsOfEmptyTensor) {
    Tensor t = Tensor::zeros({0, 4}, DType::kF32);
    EXPECT_EQ(t.slice_rows(0, 0).numel(), 0);
    EXPECT_THROW(t.slice_rows(0, 1), Error);
}

TEST(TensorTest, SliceRowsOutOfRange) {
    Tensor t = Tensor::zeros({4, 2}, DType::kF32);
    struct Case {
        int64_t begin, end;
    };
    for (const Case c : {Case{-1, 2}, Case{3, 2}, Case{0, 5}, Case{5, 5}, Case{4, 7}}) {
        const std::string msg = error_of([&] { t.slice_rows(c.begin, c.end); });
        EXPECT_THAT(msg, HasSubstr(fmt::format("slice_rows({}, {})", c.begin, c.end)));
        EXPECT_THAT(msg, HasSubstr("[4, 2]"));
    }
    Tensor scalar = Tensor::zeros({}, DType::kF32);
    EXPECT_THROW(scalar.slice_rows(0, 0), Error);
}

TEST(TensorTest, CheckTensorAcceptsMatchesAndWildcards) {
    Tensor t = Tensor::zeros({2, 3}, DType::kBF16);
    EXPECT_NO_THROW(check_tensor(t, "x", DType::kBF16, {2, 3}));
    EXPECT_NO_THROW(check_tensor(t, "x", DType::kBF16, {-1, 3}));
    EXPECT_NO_THROW(check_tensor(t, "x", DType::kBF16, {-1, -1}));
}

TEST(TensorTest, CheckTensorNamesTensorAndExpectedAndFound) {
    Tensor t = Tensor::zeros({2, 3}, DType::kBF16);
    std::string msg = error_of([&] { check_tensor(t, "weight", DType::kF32, {2, 3}); });
    EXPECT_THAT(msg, HasSubstr("weight"));
    EXPECT_THAT(msg, HasSubstr("BF16"));
    EXPECT_THAT(msg, HasSubstr("F32"));

    msg = error_of([&] { check_tensor(t, "weight", DType::kBF16, {3, 2}); });
    EXPECT_THAT(msg, HasSubstr("weight"));
    EXPECT_THAT(msg, HasSubstr("[2, 3]"));
    EXPECT_THAT(msg, HasSubstr("[3, 2]"));

    EXPECT_THROW(check_tensor(t, "w", DType::kBF16, {2}), Error);        // fewer dims
    EXPECT_THROW(check_tensor(t, "w", DType::kBF16, {2, 3, 1}), Error);  // more dims
    EXPECT_THROW(check_tensor(t, "w", DType::kBF16, {-1, 4}), Error);    // wildcard does not hide a mismatch
}

}  // namespace
}  // namespace fanout
