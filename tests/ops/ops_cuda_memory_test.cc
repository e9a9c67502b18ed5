// Device-memory failures of the ops layer's own objects, in a binary of its own that ctest runs
// with nothing beside it (RUN_SERIAL): the test fills the GPU, which would fail any other test
// running on it at the same time, and reads the device's free memory, which another process's
// allocations would move.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <string>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/ops/device_context.h"
#include "fanout/ops/gemm.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

size_t free_now() {
    size_t free = 0, total = 0;
    FANOUT_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return free;
}

// The GPU filled but for about `left` bytes (cudaMalloc's 2 MiB pages) for as long as it lives.
struct GpuFilledBut {
    explicit GpuFilledBut(size_t left) {
        if (const size_t free = free_now(); free > left) FANOUT_CUDA_CHECK(cudaMalloc(&filler, free - left));
        free_after_fill = free_now();
    }
    ~GpuFilledBut() { cudaFree(filler); }
    GpuFilledBut(const GpuFilledBut&) = delete;
    GpuFilledBut& operator=(const GpuFilledBut&) = delete;
    void* filler = nullptr;
    size_t free_after_fill = 0;
};

// A constructor whose later allocation fails frees the earlier ones (no destructor runs for a
// constructor that throws). The error names the allocation that failed, so each case is known to
// have reached the one it means; the free memory afterwards is what it was before, within 4 MiB
// (an H100 showed 2 MiB more: the driver's own pages move), far under the leak each case would
// show.
TEST(DeviceMemory, AConstructorThatFailsPartWayFreesWhatItMade) {
    REQUIRE_GPU();
    {
        // 1 GiB left: a workspace's 256 MiB of partials fit, its 4 GiB of counters do not.
        GpuFilledBut gpu(1024 * kMiB);
        ASSERT_GE(gpu.free_after_fill, 1020 * kMiB);
        const std::string msg = fanout::testing::error_of([] { GemmWorkspace ws(256 * kMiB, 1 << 30); });
        EXPECT_NE(msg.find("&counters"), std::string::npos) << msg;
        EXPECT_NE(msg.find("out of memory"), std::string::npos) << msg;
        EXPECT_GE(free_now() + 4 * kMiB, gpu.free_after_fill);
    }
    {
        // A context (members first: its GEMM workspace, 32 MiB of partials and a 2 MiB page of
        // counters), then its 32 MiB cuBLASLt workspace fit in what is left; its 16 MiB FP8 scale
        // scratch does not (10 MiB left, up to 14 with the fill's rounding).
        const size_t members = GemmWorkspace::kDefaultPartialBytes + 2 * kMiB;
        const size_t left = members + DeviceContext::kBlasWorkspaceBytes + 10 * kMiB;
        GpuFilledBut gpu(left);
        ASSERT_GE(gpu.free_after_fill, left - 2 * kMiB);
        ASSERT_LT(gpu.free_after_fill, left + 4 * kMiB);
        const std::string msg = fanout::testing::error_of([] { DeviceContext ctx(ContextScratch::kGemms); });
        EXPECT_NE(msg.find("fp8_scale_scratch_"), std::string::npos) << msg;
        EXPECT_GE(free_now() + 4 * kMiB, gpu.free_after_fill);
    }
    // And the GPU is usable after both.
    GemmWorkspace ws;
    DeviceContext ctx(ContextScratch::kGemms);
}

}  // namespace
}  // namespace fanout::ops
