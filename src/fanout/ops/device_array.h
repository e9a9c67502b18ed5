// The one owner of device memory: DeviceArray<T>, n elements allocated with cudaMalloc and freed
// on destruction (or a view of memory owned elsewhere: a weight in the weight arena). The model's
// buffers, the benchmarks' and the tests' (through thin helpers) are all DeviceArrays.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <utility>

#include "fanout/core/cuda_check.h"
#include "fanout/core/error.h"

namespace fanout::ops {

template <typename T>
class DeviceArray {
  public:
    DeviceArray() = default;
    explicit DeviceArray(size_t n) : n_(n) { FANOUT_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T))); }
    // A copy of n host elements, complete on return, so that work on any stream may read it (an
    // upload on the legacy stream is not ordered before a non-blocking stream's kernels).
    DeviceArray(const T* host, size_t n) : DeviceArray(n) {
        upload(host, n);
        FANOUT_CUDA_CHECK(cudaStreamSynchronize(nullptr));
    }
    // `n` elements at `p` owned elsewhere (a weight in the weight arena): never freed here.
    static DeviceArray view(T* p, size_t n) {
        DeviceArray a;
        a.p_ = p;
        a.n_ = n;
        a.owned_ = false;
        return a;
    }
    ~DeviceArray() {
        if (p_ && owned_) cudaFree(p_);
    }
    DeviceArray(DeviceArray&& o) noexcept
        : p_(std::exchange(o.p_, nullptr)), n_(o.n_), owned_(std::exchange(o.owned_, true)) {}
    DeviceArray& operator=(DeviceArray&& o) noexcept {
        std::swap(p_, o.p_);
        std::swap(n_, o.n_);
        std::swap(owned_, o.owned_);
        return *this;
    }
    T* get() const { return p_; }
    size_t size() const { return n_; }
    // Enqueued on `s`: ordered before what `s` runs next, not before other streams' work.
    void upload(const T* host, size_t n, cudaStream_t s = nullptr) {
        FANOUT_CHECK(n <= n_, "device upload of {} elements into {}", n, n_);
        FANOUT_CUDA_CHECK(cudaMemcpyAsync(p_, host, n * sizeof(T), cudaMemcpyHostToDevice, s));
    }

  private:
    T* p_ = nullptr;
    size_t n_ = 0;
    bool owned_ = true;
};

}  // namespace fanout::ops
