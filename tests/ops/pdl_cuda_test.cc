// The small kernels launched as programmatic dependents (ops/pdl.cuh) wait for the kernel before
// them. Each one runs behind a kernel that lets it start at once, spins, and only then writes its
// input (pdl_probe.h): a kernel that read its input before pdl_enter() would compute from zeros
// and its outputs would differ from a plain run's. The first test shows that the probe does start
// its dependents early, so that the others can fail; with the waits removed from the norm, the
// router and fill, their tests failed (PERF.md, 2026-12-03). Labelled `gpu`; skipped without a GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <utility>
#include <vector>

#include "cuda_test_util.h"
#include "fanout/core/cuda_check.h"
#include "fanout/core/dtype.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/ops/fp8_quant.h"
#include "fanout/ops/gemm.h"
#include "fanout/ops/grouped_gemm_cuda.h"
#include "fanout/ops/model_glue_cuda.h"
#include "fanout/ops/moe_router_cuda.h"
#include "fanout/ops/rms_norm.h"
#include "pdl_probe.h"
#include "test_util.h"

namespace fanout::ops {
namespace {

using fanout::testing::DeviceBuffer;

constexpr int kSpinUs = 300;  // long enough for any dependent to have launched and run

struct Stream {
    cudaStream_t s = nullptr;
    Stream() { FANOUT_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)); }
    ~Stream() { cudaStreamDestroy(s); }
};

// An output buffer as raw bytes: read back, and poisoned before each run.
struct Output {
    void* ptr;
    size_t bytes;
};

std::vector<uint8_t> read(const std::vector<Output>& outs) {
    std::vector<uint8_t> all;
    for (const Output& o : outs) {
        std::vector<uint8_t> b(o.bytes);
        FANOUT_CUDA_CHECK(cudaMemcpy(b.data(), o.ptr, o.bytes, cudaMemcpyDeviceToHost));
        all.insert(all.end(), b.begin(), b.end());
    }
    return all;
}

void poison(const std::vector<Output>& outs) {
    for (const Output& o : outs) FANOUT_CUDA_CHECK(cudaMemset(o.ptr, 0xff, o.bytes));
}

// `run` launches the kernel under test, reading `input`. First a plain run, `input` copied in
// before; then `input` zeroed and filled by a late copy from `staging` right before the launch.
// Both runs must write the same bytes.
void expect_waits_for_input(const char* what, void* input, const void* staging, size_t bytes,
                            const std::vector<Output>& outs, const std::function<void(cudaStream_t)>& run) {
    fanout::testing::warm_up_probe();
    Stream st;
    poison(outs);
    FANOUT_CUDA_CHECK(cudaMemcpy(input, staging, bytes, cudaMemcpyDeviceToDevice));
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());  // the stream does not wait for the legacy one
    run(st.s);
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(st.s));
    const std::vector<uint8_t> ref = read(outs);
    poison(outs);
    FANOUT_CUDA_CHECK(cudaMemset(input, 0, bytes));
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    fanout::testing::launch_late_copy(staging, input, bytes, kSpinUs, st.s);
    run(st.s);
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_TRUE(read(outs) == ref) << what << " read its input before the previous kernel had written it";
}

std::vector<uint16_t> random_bf16_bits(size_t n, uint32_t seed, float scale) {
    std::vector<uint16_t> out;
    for (float v : fanout::testing::random_floats(n, seed, scale)) out.push_back(f32_to_bf16(v));
    return out;
}

TEST(PdlCuda, TheProbeStartsItsDependentsEarly) {
    REQUIRE_GPU();
    // The control kernel has no wait: behind the late copy it copies the input's old bytes. Were
    // it to see the new ones, the probe would not overlap the kernels, and no test below could fail.
    const size_t n = 4096;
    std::vector<uint8_t> pattern(n);
    for (size_t i = 0; i < n; ++i) pattern[i] = static_cast<uint8_t>(1 + i % 251);
    fanout::testing::warm_up_probe();
    DeviceBuffer<uint8_t> staging(pattern), input(n), out(n);
    FANOUT_CUDA_CHECK(cudaMemset(input.ptr, 0, n));
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());  // the stream does not wait for the legacy one
    Stream st;
    fanout::testing::launch_late_copy(staging.ptr, input.ptr, n, kSpinUs, st.s);
    fanout::testing::launch_racy_copy(input.ptr, out.ptr, n, st.s);
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_EQ(out.download(), std::vector<uint8_t>(n, 0))
        << "the dependent ran after the late copy: programmatic launches did not overlap";
    EXPECT_EQ(input.download(), pattern);
}

TEST(PdlCuda, NormsAndQuantizationWaitForTheirRows) {
    REQUIRE_GPU();
    const int M = 7, D = 1000;
    const auto x = random_bf16_bits(size_t(M) * D, 3, 2.0f);
    const auto w = fanout::testing::random_floats(size_t(D), 4, 1.0f);
    const int nb = (D + kFp8Block - 1) / kFp8Block;
    DeviceBuffer<uint16_t> staging(x), in(x.size()), y(x.size());
    DeviceBuffer<float> dw(w), scales(size_t(M) * nb);
    DeviceBuffer<uint8_t> q(x.size());
    expect_waits_for_input("rms_norm_quant_bf16", in.ptr, staging.ptr, x.size() * 2,
                           {{y.ptr, y.n * 2}, {q.ptr, q.n}, {scales.ptr, scales.n * 4}}, [&](cudaStream_t s) {
                               launch_rms_norm_quant_bf16(in.ptr, D, nullptr, dw.ptr, 1e-6f, y.ptr, D, q.ptr,
                                                          scales.ptr, ScaleOrder::kRowMajor, M, D, s);
                           });
    expect_waits_for_input(
        "act_quant_bf16", in.ptr, staging.ptr, x.size() * 2, {{q.ptr, q.n}, {scales.ptr, scales.n * 4}},
        [&](cudaStream_t s) { launch_act_quant_bf16(in.ptr, q.ptr, scales.ptr, ScaleOrder::kRowMajor, M, D, s); });
}

TEST(PdlCuda, TheRouterAndItsGemvWaitForTheirInputs) {
    REQUIRE_GPU();
    const int T = 5, E = 256, D = 512;
    const RouterParams p{E, 8, 8, 4, true, 2.5f};
    const auto logits = fanout::testing::random_floats(size_t(T) * E, 5, 4.0f);
    DeviceBuffer<float> staging(logits), in(logits.size()), weight(size_t(T) * 8);
    DeviceBuffer<int32_t> idx(size_t(T) * 8);
    expect_waits_for_input("moe_route", in.ptr, staging.ptr, logits.size() * 4,
                           {{idx.ptr, idx.n * 4}, {weight.ptr, weight.n * 4}},
                           [&](cudaStream_t s) { launch_moe_route(in.ptr, nullptr, p, T, idx.ptr, weight.ptr, s); });
    const auto x = random_bf16_bits(size_t(T) * D, 6, 1.0f), wr = random_bf16_bits(size_t(E) * D, 7, 0.1f);
    DeviceBuffer<uint16_t> x_staging(x), x_in(x.size()), w(wr);
    DeviceBuffer<float> y(size_t(T) * E);
    expect_waits_for_input("gemv_bf16_f32", x_in.ptr, x_staging.ptr, x.size() * 2, {{y.ptr, y.n * 4}},
                           [&](cudaStream_t s) { launch_gemv_bf16_f32(x_in.ptr, w.ptr, y.ptr, T, E, D, s); });
}

TEST(PdlCuda, ActivationRopeAndEmbedWaitForTheirInputs) {
    REQUIRE_GPU();
    // silu·mul·quant over the masked layout: 3 experts of up to 4 rows, counts 4, 1 and 0.
    const int E = 3, max_m = 4, I = 384;
    const auto gu = random_bf16_bits(size_t(E) * max_m * 2 * I, 8, 2.0f);
    DeviceBuffer<uint16_t> gu_staging(gu), gu_in(gu.size());
    DeviceBuffer<int32_t> counts(std::vector<int32_t>{4, 1, 0});
    DeviceBuffer<uint8_t> q(size_t(E) * max_m * I);
    DeviceBuffer<float> scales(size_t(E) * max_m * (I / kFp8Block));
    expect_waits_for_input("silu_mul_quant_masked", gu_in.ptr, gu_staging.ptr, gu.size() * 2,
                           {{q.ptr, q.n}, {scales.ptr, scales.n * 4}}, [&](cudaStream_t s) {
                               launch_silu_mul_quant_masked(gu_in.ptr, counts.ptr, E, max_m, I, q.ptr, scales.ptr,
                                                            ScaleOrder::kRowMajor, s);
                           });
    // q's rope part: 3 tokens of 4 heads, nope 16, rope 8.
    const int T = 3, H = 4, nope = 16, rope = 8;
    const auto qv = random_bf16_bits(size_t(T) * H * (nope + rope), 9, 1.0f);
    DeviceBuffer<uint16_t> q_staging(qv), q_in(qv.size()), q_pe(size_t(T) * H * rope);
    DeviceBuffer<int32_t> pos(std::vector<int32_t>{0, 17, 4095});
    DeviceBuffer<float> inv_freq(std::vector<float>{1.0f, 0.1f, 0.01f, 0.001f});
    expect_waits_for_input(
        "mla_q_rope", q_in.ptr, q_staging.ptr, qv.size() * 2, {{q_pe.ptr, q_pe.n * 2}}, [&](cudaStream_t s) {
            launch_mla_q_rope(q_in.ptr, T, H, nope, pos.ptr, {inv_freq.ptr, rope, 1.0f}, q_pe.ptr, s);
        });
    // embed: the token ids are the input.
    const int V = 50, D = 72;
    DeviceBuffer<uint16_t> table(random_bf16_bits(size_t(V) * D, 10, 1.0f)), rows(size_t(4) * D);
    DeviceBuffer<int32_t> ids_staging(std::vector<int32_t>{7, 49, 3, 21}), ids(4);
    expect_waits_for_input("embed_bf16", ids.ptr, ids_staging.ptr, 4 * 4, {{rows.ptr, rows.n * 2}},
                           [&](cudaStream_t s) { launch_embed_bf16(table.ptr, ids.ptr, 4, D, rows.ptr, s); });
}

// The other direction: a dependent must not write what the kernel before it still reads. The
// late copy reads `buf` after its spin; a fill launched behind it that wrote before its wait would
// land in the copy.
TEST(PdlCuda, AFillWaitsForTheKernelThatReadsItsBuffer) {
    REQUIRE_GPU();
    const int n = 1000;
    std::vector<int32_t> old(n);
    for (int i = 0; i < n; ++i) old[i] = i;
    DeviceBuffer<int32_t> buf(old), snapshot(n);
    fanout::testing::warm_up_probe();
    launch_fill_i32(snapshot.ptr, n, 0, nullptr);  // the fill's first launch loads it (pdl_probe.h)
    FANOUT_CUDA_CHECK(cudaDeviceSynchronize());
    Stream st;
    fanout::testing::launch_late_copy(buf.ptr, snapshot.ptr, size_t(n) * 4, kSpinUs, st.s);
    launch_fill_i32(buf.ptr, n, -5, st.s);
    FANOUT_CUDA_CHECK(cudaStreamSynchronize(st.s));
    EXPECT_EQ(snapshot.download(), old);
    EXPECT_EQ(buf.download(), std::vector<int32_t>(n, -5));
}

}  // namespace
}  // namespace fanout::ops
