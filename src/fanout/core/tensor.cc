#include "fanout/core/tensor.h"

#include <cstdlib>
#include <cstring>

namespace fanout {

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t shape_numel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
}

Tensor Tensor::zeros(Shape shape, DType dtype) {
    for (int64_t d : shape) FANOUT_CHECK(d >= 0, "Tensor::zeros: negative extent in shape {}", shape_str(shape));
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    const size_t rounded = (bytes + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
    FANOUT_CHECK(p != nullptr, "Tensor::zeros: out of memory allocating {} bytes for shape {}", bytes,
                 shape_str(shape));
    std::memset(p, 0, rounded == 0 ? 64 : rounded);
    Tensor t;
    t.data_ = p;
    t.dtype_ = dtype;
    t.shape_ = std::move(shape);
    t.owner_ = std::shared_ptr<void>(p, std::free);
    return t;
}

Tensor Tensor::view(void* data, DType dtype, Shape shape, Device device, std::shared_ptr<void> owner) {
    Tensor t;
    t.data_ = data;
    t.dtype_ = dtype;
    t.device_ = device;
    t.shape_ = std::move(shape);
    t.owner_ = std::move(owner);
    return t;
}

int64_t Tensor::dim(int i) const {
    const int n = ndim();
    const int j = i < 0 ? i + n : i;
    FANOUT_CHECK(j >= 0 && j < n, "Tensor::dim({}) out of range for shape {}", i, shape_str(shape_));
    return shape_[j];
}

Tensor Tensor::reshape(Shape shape) const {
    for (int64_t d : shape)
        FANOUT_CHECK(d >= 0, "reshape {} -> {}: negative extent", shape_str(shape_), shape_str(shape));
    FANOUT_CHECK(shape_numel(shape) == numel(), "reshape {} -> {}: element counts differ", shape_str(shape_),
                 shape_str(shape));
    Tensor t = *this;
    t.shape_ = std::move(shape);
    return t;
}

Tensor Tensor::slice_rows(int64_t begin, int64_t end) const {
    FANOUT_CHECK(ndim() >= 1 && 0 <= begin && begin <= end && end <= shape_[0],
                 "slice_rows({}, {}) out of range for shape {}", begin, end, shape_str(shape_));
    Tensor t = *this;
    const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
    t.data_ = static_cast<char*>(data_) + static_cast<size_t>(begin) * row_bytes;
    t.shape_[0] = end - begin;
    return t;
}

Tensor Tensor::gather_rows(std::span<const int32_t> rows) const {
    FANOUT_CHECK(ndim() >= 1, "gather_rows of a scalar");
    Shape shape = shape_;
    shape[0] = static_cast<int64_t>(rows.size());
    Tensor t = zeros(shape, dtype_);
    const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
    for (size_t i = 0; i < rows.size(); ++i) {
        FANOUT_CHECK(rows[i] >= 0 && rows[i] < shape_[0], "gather_rows: row {} out of range for shape {}", rows[i],
                     shape_str(shape_));
        std::memcpy(static_cast<char*>(t.data_) + i * row_bytes,
                    static_cast<const char*>(data_) + static_cast<size_t>(rows[i]) * row_bytes, row_bytes);
    }
    return t;
}

void check_tensor(const Tensor& t, const char* name, DType dtype, std::initializer_list<int64_t> shape) {
    FANOUT_CHECK(t.dtype() == dtype, "{}: dtype {} but expected {}", name, dtype_name(t.dtype()), dtype_name(dtype));
    bool ok = t.ndim() == static_cast<int>(shape.size());
    int i = 0;
    for (int64_t d : shape) {
        if (ok && d >= 0 && t.shape()[i] != d) ok = false;
        ++i;
    }
    FANOUT_CHECK(ok, "{}: shape {} but expected {} (-1 = any)", name, shape_str(t.shape()), shape_str(Shape(shape)));
}

}  // namespace fanout
