// Shared by the CUDA tests (label gpu): REQUIRE_GPU() skips a test, reported as skipped, on a
// machine without a GPU; DeviceBuffer is a test's device memory (an ops::DeviceArray with
// synchronous copies and poisoning).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/device_array.h"

namespace fanout::testing {

inline bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
    if (!::fanout::testing::have_gpu()) GTEST_SKIP() << "no CUDA device"

// fn(device) with each visible device current, the last first and device 0 last (which stays
// current): what CUDA keeps per device must then be set for each, not only for the first device a
// launch met, as when one process drives several GPUs (comm/local_gpus.h).
template <typename Fn>
void on_every_device_zero_last(Fn&& fn) {
    int devices = 0;
    FANOUT_CUDA_CHECK(cudaGetDeviceCount(&devices));
    for (int d = devices - 1; d >= 0; --d) {
        FANOUT_CUDA_CHECK(cudaSetDevice(d));
        fn(d);
    }
}

template <typename T>
struct DeviceBuffer : ops::DeviceArray<T> {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : ops::DeviceArray<T>(count), ptr(this->get()), n(count) {}
    explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) { upload(v.data()); }
    DeviceBuffer(const DeviceBuffer&) = delete;
    DeviceBuffer& operator=(const DeviceBuffer&) = delete;
    void upload(const T* src) { FANOUT_CUDA_CHECK(cudaMemcpy(ptr, src, n * sizeof(T), cudaMemcpyHostToDevice)); }
    void upload(const std::vector<T>& src) {
        ASSERT_EQ(src.size(), n);
        upload(src.data());
    }
    void download(T* dst) const { FANOUT_CUDA_CHECK(cudaMemcpy(dst, ptr, n * sizeof(T), cudaMemcpyDeviceToHost)); }
    std::vector<T> download() const {
        std::vector<T> h(n);
        download(h.data());
        return h;
    }
    void poison() { FANOUT_CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T))); }  // 0xff..: NaN in f32 and bf16
};

}  // namespace fanout::testing
