// MLA prefill attention, MHA form, on the GPU: see mha_prefill_cuda.h for the math and the contract.
// This file holds the generic kernel and the dispatch; the wgmma kernel is mha_prefill_sm90.cu.
//
// * mha_generic_kernel: a warp per (token, head), f32 throughout; any widths and alignments.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "fanout/core/cuda_check.h"
#include "fanout/core/search.cuh"
#include "fanout/ops/bf16_bits.cuh"
#include "fanout/ops/device_context.h"
#include "fanout/ops/mha_prefill_cuda.h"

namespace fanout::ops {
namespace {

constexpr float kLog2e = 1.4426950408889634f;

// ======================================================================================
// Generic kernel
// ======================================================================================
constexpr int kGenWarps = 4;
constexpr int kGenThreads = 32 * kGenWarps;
constexpr int kGenMaxQk = 1024;  // nope + rope
constexpr int kGenMaxV = 256;
constexpr int kGenVPerLane = kGenMaxV / 32;

// grid (⌈T / kGenWarps⌉, H); warp w owns token blockIdx.x · kGenWarps + w of head blockIdx.y. Keys in
// chunks of 32: a lane scores one key, then every lane accumulates its output columns
// (lane + 32k) over the chunk's keys.
__global__ void __launch_bounds__(kGenThreads) mha_generic_kernel(const MhaPrefillParams p, float scale_log2) {
    __shared__ float s_q[kGenWarps][kGenMaxQk];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, h = blockIdx.y;
    const int t = blockIdx.x * kGenWarps + warp;
    if (t >= p.num_tokens) return;  // warp-uniform; the kernel has no block-wide barrier
    // The token's request: its queries from q0 (q_len of them), its keys from k0 (kv_len).
    int q0 = 0, q_len = p.num_tokens, k0 = 0, kv_len = p.ctx_len;
    if (p.query_start != nullptr) {
        const int lo = segment_of(p.query_start, p.num_requests, t);
        q0 = p.query_start[lo], q_len = p.query_start[lo + 1] - q0;
        k0 = p.kv_start[lo], kv_len = p.kv_start[lo + 1] - k0;
        // Malformed offsets (a request past the tensors, fewer keys than queries): nothing read or written.
        if (q0 < 0 || k0 < 0 || q0 + q_len > p.num_tokens || k0 + kv_len > p.ctx_len || kv_len < q_len) return;
    }
    const int nope = p.nope, qk = p.nope + p.rope, V = p.v_dim;
    float* q = s_q[warp];
    const uint16_t* q_row = p.q + int64_t(t) * p.q_stride_t + int64_t(h) * p.q_stride_h;
    for (int d = lane; d < qk; d += 32) q[d] = bf16_bits_to_float(q_row[d]);
    __syncwarp();

    const int visible = kv_len - q_len + (t - q0) + 1;
    float acc[kGenVPerLane];
#pragma unroll
    for (int k = 0; k < kGenVPerLane; ++k) acc[k] = 0.0f;
    float m = -INFINITY, l_part = 0.0f;
    for (int j0 = 0; j0 < visible; j0 += 32) {
        const int j = j0 + lane;
        float sc = -INFINITY;
        if (j < visible) {
            const uint16_t* kn = p.k_nope + int64_t(k0 + j) * p.k_stride_t + int64_t(h) * p.k_stride_h;
            const uint16_t* kp = p.k_pe + int64_t(k0 + j) * p.k_pe_stride_t;
            float dot = 0.0f;
            for (int d = 0; d < nope; ++d) dot = fmaf(q[d], bf16_bits_to_float(kn[d]), dot);
            for (int d = nope; d < qk; ++d) dot = fmaf(q[d], bf16_bits_to_float(kp[d - nope]), dot);
            sc = dot * scale_log2;
        }
        float mx = sc;
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
        const float m_new = fmaxf(m, mx);  // finite: key j0 is visible
        const float corr = exp2f(m - m_new);
        m = m_new;
        const float pj = j < visible ? exp2f(sc - m) : 0.0f;
        l_part = l_part * corr + pj;
        const int n = min(32, visible - j0);
#pragma unroll
        for (int k = 0; k < kGenVPerLane; ++k) acc[k] *= corr;
        for (int jj = 0; jj < n; ++jj) {
            const float w = __shfl_sync(0xffffffffu, pj, jj);
            const uint16_t* v_row = p.v + int64_t(k0 + j0 + jj) * p.v_stride_t + int64_t(h) * p.v_stride_h;
#pragma unroll
            for (int k = 0; k < kGenVPerLane; ++k)
                if (lane + 32 * k < V) acc[k] = fmaf(w, bf16_bits_to_float(v_row[lane + 32 * k]), acc[k]);
        }
    }
    float l = l_part;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) l += __shfl_xor_sync(0xffffffffu, l, off);
    const float inv = 1.0f / l;  // l ≥ 1: the maximum's own term
    uint16_t* dst = p.out + int64_t(t) * p.out_stride_t + int64_t(h) * p.out_stride_h;
#pragma unroll
    for (int k = 0; k < kGenVPerLane; ++k)
        if (lane + 32 * k < V) dst[lane + 32 * k] = float_to_bf16_bits(acc[k] * inv);
}

// ======================================================================================
// Host
// ======================================================================================
void check_params(const MhaPrefillParams& p) {
    const std::string dims = " (num_tokens=" + std::to_string(p.num_tokens) + " ctx_len=" + std::to_string(p.ctx_len) +
                             " num_heads=" + std::to_string(p.num_heads) + " nope=" + std::to_string(p.nope) +
                             " rope=" + std::to_string(p.rope) + " v_dim=" + std::to_string(p.v_dim) +
                             " scale=" + std::to_string(p.scale) + ")";
    FANOUT_DEVICE_REQUIRE(p.num_tokens >= 0 && p.ctx_len >= p.num_tokens,
                          "mha prefill: needs 0 <= num_tokens <= ctx_len" + dims);
    FANOUT_DEVICE_REQUIRE(p.num_heads >= 1 && p.num_heads <= 65535,
                          "mha prefill: needs 1 <= num_heads <= 65535" + dims);
    FANOUT_DEVICE_REQUIRE(p.nope >= 1 && p.rope >= 1 && p.nope + p.rope <= kGenMaxQk,
                          "mha prefill: needs nope >= 1, rope >= 1 and nope + rope <= 1024" + dims);
    FANOUT_DEVICE_REQUIRE(p.v_dim >= 1 && p.v_dim <= kGenMaxV, "mha prefill: needs 1 <= v_dim <= 256" + dims);
    FANOUT_DEVICE_REQUIRE(std::isfinite(p.scale) && p.scale > 0.0f, "mha prefill: scale must be finite and > 0" + dims);
    FANOUT_DEVICE_REQUIRE(p.num_tokens == 0 || (p.q && p.k_nope && p.k_pe && p.v && p.out),
                          "mha prefill: a null device pointer among q, k_nope, k_pe, v, out" + dims);
    const std::string reqs = " (num_requests=" + std::to_string(p.num_requests) +
                             " max_query_len=" + std::to_string(p.max_query_len) +
                             " num_tokens=" + std::to_string(p.num_tokens) + ")";
    FANOUT_DEVICE_REQUIRE(p.num_requests >= 1, "mha prefill: needs num_requests >= 1" + reqs);
    FANOUT_DEVICE_REQUIRE((p.query_start == nullptr) == (p.kv_start == nullptr),
                          "mha prefill: query_start and kv_start come together" + reqs);
    FANOUT_DEVICE_REQUIRE(p.num_requests == 1 || p.query_start != nullptr,
                          "mha prefill: several requests need query_start and kv_start" + reqs);
    FANOUT_DEVICE_REQUIRE(
        p.query_start == nullptr || p.num_tokens == 0 || (p.max_query_len >= 1 && p.max_query_len <= p.num_tokens),
        "mha prefill: with query_start, max_query_len must be in 1..num_tokens" + reqs);
}

bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// The wgmma kernel's widths, TMA's 16-byte-aligned bases and strides, 4-byte output stores.
bool fast_path_fits(const MhaPrefillParams& p) {
    const bool dims = p.nope == 128 && p.rope == 64 && p.v_dim == 128;
    const bool pointers =
        aligned16(p.q) && aligned16(p.k_nope) && aligned16(p.k_pe) && aligned16(p.v) && aligned16(p.out);
    const bool strides = (p.q_stride_t | p.q_stride_h | p.k_stride_t | p.k_stride_h | p.k_pe_stride_t | p.v_stride_t |
                          p.v_stride_h | p.out_stride_t | p.out_stride_h) %
                             8 ==
                         0;
    return dims && pointers && strides;
}

}  // namespace

const char* mha_prefill_kernel_name(MhaPrefillKernel k) {
    switch (k) {
        case MhaPrefillKernel::kWgmma:
            return "wgmma";
        case MhaPrefillKernel::kGeneric:
            return "generic";
    }
    return "?";
}

MhaPrefillKernel mha_prefill_kernel_for(const MhaPrefillParams& p) {
    return fast_path_fits(p) ? MhaPrefillKernel::kWgmma : MhaPrefillKernel::kGeneric;
}

void check_mha_prefill(const MhaPrefillParams& p, MhaPrefillKernel kernel) {
    check_params(p);
    FANOUT_DEVICE_REQUIRE(kernel == MhaPrefillKernel::kGeneric || fast_path_fits(p),
                          std::string("mha prefill: the ") + mha_prefill_kernel_name(kernel) +
                              " kernel needs nope 128, rope 64, v_dim 128, 16-byte-aligned pointers and strides "
                              "that are multiples of 8 elements (nope=" +
                              std::to_string(p.nope) + " rope=" + std::to_string(p.rope) +
                              " v_dim=" + std::to_string(p.v_dim) + ")");
    // The wgmma kernel's item counter runs past the last item by up to one take per CTA: 2^30 leaves room.
    FANOUT_DEVICE_REQUIRE(
        kernel != MhaPrefillKernel::kWgmma ||
            int64_t(p.num_heads) * p.num_requests * (((p.query_start ? p.max_query_len : p.num_tokens) + 127) / 128) <=
                (int64_t{1} << 30),
        "mha prefill: heads × requests × ⌈query tokens / 128⌉ must stay within 2^30 (num_tokens=" +
            std::to_string(p.num_tokens) + " num_heads=" + std::to_string(p.num_heads) +
            " num_requests=" + std::to_string(p.num_requests) + ")");
}

void launch_mha_prefill(DeviceContext& ctx, const MhaPrefillParams& p) {
    launch_mha_prefill(ctx, p, mha_prefill_kernel_for(p));  // which checks p first
}

void launch_mha_prefill(DeviceContext& ctx, const MhaPrefillParams& p, MhaPrefillKernel kernel) {
    check_mha_prefill(p, kernel);
    if (p.num_tokens == 0) return;
    switch (kernel) {
        case MhaPrefillKernel::kWgmma:
            detail::launch_mha_prefill_wgmma(ctx, p);
            return;
        case MhaPrefillKernel::kGeneric: {
            const unsigned blocks = unsigned((p.num_tokens + kGenWarps - 1) / kGenWarps);
            mha_generic_kernel<<<dim3(blocks, unsigned(p.num_heads)), kGenThreads, 0, ctx.stream()>>>(p,
                                                                                                      p.scale * kLog2e);
            FANOUT_CUDA_CHECK_LAUNCH("mha_generic_kernel");
            return;
        }
    }
}

}  // namespace fanout::ops
