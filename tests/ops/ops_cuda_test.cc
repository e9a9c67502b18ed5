// CUDA kernels against the CPU reference ops: random odd-shaped inputs, poisoned outputs.
// Labelled `gpu`; without a GPU each test reports itself skipped.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include "fanout/core/cuda_check.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/rms_norm.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

bool have_gpu() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess && n > 0;
}

#define REQUIRE_GPU() \
    if (!have_gpu()) GTEST_SKIP() << "no CUDA device"

template <typename T>
struct DeviceBuffer {
    T* ptr = nullptr;
    size_t n = 0;
    explicit DeviceBuffer(size_t count) : n(count) { FANOUT_CUDA_CHECK(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T))); }
    ~DeviceBuffer() { cudaFree(ptr); }
    void upload(const T* src) { FANOUT_CUDA_CHECK(cudaMemcpy(ptr, src, n * sizeof(T), cudaMemcpyHostToDevice)); }
    void download(T* dst) const { FANOUT_CUDA_CHECK(cudaMemcpy(dst, ptr, n * sizeof(T), cudaMemcpyDeviceToHost)); }
    void poison() { FANOUT_CUDA_CHECK(cudaMemset(ptr, 0xff, n * sizeof(T))); }
};

TEST(RmsNormCuda, MatchesCpuReference) {
    REQUIRE_GPU();
    for (auto [M, D] : {std::pair{1, 1}, {3, 7168}, {37, 1537}, {129, 576}}) {
        Tensor x = fanout::testing::random_tensor({M, D}, 41, 4.0f), w = fanout::testing::random_tensor({D}, 42);
        Tensor ref = Tensor::zeros({M, D}, DType::kF32), got = Tensor::zeros({M, D}, DType::kF32);
        rms_norm(x, w, 1e-6f, ref, Stream{});
        DeviceBuffer<float> dx(M * D), dw(D), dout(M * D);
        dx.upload(x.data_as<float>());
        dw.upload(w.data_as<float>());
        dout.poison();
        launch_rms_norm(dx.ptr, dw.ptr, 1e-6f, dout.ptr, M, D, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        dout.download(got.data_as<float>());
        EXPECT_LT(fanout::testing::rel_error(got.data_as<float>(), ref.data_as<float>(), size_t(M * D)), 1e-6)
            << M << "x" << D;
    }
}

TEST(ActQuantCuda, MatchesCpuReferenceBitForBit) {
    REQUIRE_GPU();
    for (auto [M, K] : {std::pair{1, 1}, {5, 7168}, {33, 300}, {128, 129}}) {
        Tensor x = fanout::testing::random_tensor({M, K}, 43, 10.0f);
        const int64_t nb = ceil_div(K, kFp8Block);
        Tensor q = Tensor::zeros({M, K}, DType::kFP8E4M3), s = Tensor::zeros({M, nb}, DType::kF32);
        act_quant(x, q, s, Stream{});
        DeviceBuffer<float> dx(M * K), ds(M * nb);
        DeviceBuffer<uint8_t> dq(M * K);
        dx.upload(x.data_as<float>());
        dq.poison();
        ds.poison();
        launch_act_quant(dx.ptr, dq.ptr, ds.ptr, M, K, nullptr);
        FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
        std::vector<uint8_t> gq(M * K);
        std::vector<float> gs(M * nb);
        dq.download(gq.data());
        ds.download(gs.data());
        for (int64_t i = 0; i < M * nb; ++i) ASSERT_EQ(gs[i], s.data_as<float>()[i]) << "scale " << i;
        int64_t mismatches = 0;
        for (int64_t i = 0; i < M * K; ++i) mismatches += gq[i] != q.data_as<uint8_t>()[i];
        EXPECT_EQ(mismatches, 0) << M << "x" << K;
    }
}

TEST(GemmFp8Cuda, MatchesCpuReference) {
    REQUIRE_GPU();
    ThreadPool pool(0);
    for (auto [N, K] : {std::pair{128, 128}, {130, 200}, {576, 7168}, {2112, 512}}) {
        for (int M : {1, 7, 64, 129, 1000}) {
            const int64_t nbk = ceil_div(K, 128), nbn = ceil_div(N, 128);
            std::vector<uint8_t> x(size_t(M) * K), w(size_t(N) * K);
            const auto xf = fanout::testing::random_floats(x.size(), 51 + M, 400.0f);
            const auto wf = fanout::testing::random_floats(w.size(), 52 + N, 400.0f);
            for (size_t i = 0; i < x.size(); ++i) x[i] = f32_to_fp8e4m3(xf[i]);
            for (size_t i = 0; i < w.size(); ++i) w[i] = f32_to_fp8e4m3(wf[i]);
            auto sx = fanout::testing::random_floats(size_t(M * nbk), 53, 0.01f);
            auto sw = fanout::testing::random_floats(size_t(nbn * nbk), 54, 0.01f);
            std::vector<float> ref(size_t(M) * N);
            gemm_fp8_cpu(x.data(), sx.data(), w.data(), sw.data(), ref.data(), M, N, K, Stream{&pool});
            DeviceBuffer<uint8_t> dx(x.size()), dw(w.size());
            DeviceBuffer<float> dsx(sx.size()), dsw(sw.size());
            DeviceBuffer<uint16_t> dy(ref.size());
            dx.upload(x.data());
            dw.upload(w.data());
            dsx.upload(sx.data());
            dsw.upload(sw.data());
            dy.poison();
            launch_gemm_fp8(dx.ptr, dsx.ptr, dw.ptr, dsw.ptr, dy.ptr, M, N, K, nullptr);
            FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
            std::vector<uint16_t> got(ref.size());
            dy.download(got.data());
            std::vector<float> gotf(got.size());
            double worst = 0, scale = 0;
            for (size_t i = 0; i < got.size(); ++i) {
                gotf[i] = bf16_to_f32(got[i]);
                scale = std::max(scale, double(std::fabs(ref[i])));
            }
            for (size_t i = 0; i < got.size(); ++i)
                worst = std::max(worst, std::fabs(double(gotf[i]) - ref[i]) - std::fabs(ref[i]) / 128.0);
            EXPECT_LT(fanout::testing::rel_error(gotf.data(), ref.data(), ref.size()), 5e-3) << M << "x" << N << "x" << K;
            EXPECT_LE(worst, 1e-5 * scale) << M << "x" << N << "x" << K << ": beyond bf16 rounding";
        }
    }
}

}  // namespace
}  // namespace fanout::ops
