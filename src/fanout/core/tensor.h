// Tensor: a typed, shaped, contiguous row-major view of memory on one device.
//
// A Tensor either views memory someone else owns (a memory-mapped checkpoint, a KV-cache pool)
// or owns an allocation through a shared_ptr, so copies are cheap and never deep. It has no
// strides: every op here works on contiguous rows, and a slice along the first dimension is
// still contiguous. Kernel launchers never see a Tensor; they take raw pointers and sizes.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "fanout/core/dtype.h"
#include "fanout/core/error.h"

namespace fanout {

enum class Device { kCPU, kCUDA };

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);
int64_t shape_numel(const Shape& shape);

class Tensor {
  public:
    Tensor() = default;

    // A new zero-filled CPU allocation (64-byte aligned).
    static Tensor zeros(Shape shape, DType dtype);
    // A view of memory owned elsewhere; `owner` (optional) keeps it alive.
    static Tensor view(void* data, DType dtype, Shape shape, Device device = Device::kCPU,
                       std::shared_ptr<void> owner = {});

    bool defined() const { return data_ != nullptr || numel() == 0; }
    void* data() const { return data_; }
    template <typename T>
    T* data_as() const {
        return static_cast<T*>(data_);
    }
    DType dtype() const { return dtype_; }
    Device device() const { return device_; }
    const Shape& shape() const { return shape_; }
    int ndim() const { return static_cast<int>(shape_.size()); }
    int64_t dim(int i) const;  // negative i counts from the end
    int64_t numel() const { return shape_numel(shape_); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }

    // Same memory, another shape with the same element count.
    Tensor reshape(Shape shape) const;
    // Rows [begin, end) along the first dimension.
    Tensor slice_rows(int64_t begin, int64_t end) const;
    // A new tensor of the given rows (along the first dimension), in that order.
    Tensor gather_rows(std::span<const int32_t> rows) const;

  private:
    void* data_ = nullptr;
    DType dtype_ = DType::kF32;
    Device device_ = Device::kCPU;
    Shape shape_;
    std::shared_ptr<void> owner_;
};

// Checks that t has the given dtype and shape; -1 in `shape` matches any extent.
void check_tensor(const Tensor& t, const char* name, DType dtype, std::initializer_list<int64_t> shape);

}  // namespace fanout
