// MLA prefill attention in MHA form on the GPU: causal flash attention of a request's chunk of
// query tokens over K/V that the caller has expanded from the latent cache (kv_b applied to c_kv).
// `mha_prefill_cpu` (mla_attention.h) is the reference.
//
// For query token i ∈ [0, T) (position ctx_len − T + i) and head h:
//   score(j) = scale · (q[i, h, :nope] · k_nope[j, h] + q[i, h, nope:] · k_pe[j])   (keys j ≤ ctx_len − T + i),
//   out[i, h, :] = Σ_j softmax(score)(j) · v[j, h]                                  (v_dim values, bf16).
// k_pe is shared by all heads (MLA's decoupled rope key). The keys are a cached prefix of
// ctx_len − T positions followed by the chunk itself.
//
// Two kernels, picked by launch_mha_prefill:
//  * wgmma (mha_prefill_sm90.cu, FlashAttention-3 style: TMA, a producer warpgroup, two consumer
//    warpgroups, P·V from registers) for DeepSeek-V3's widths — nope 128, rope 64, v 128 — with
//    16-byte-aligned pointers and strides that are multiples of 8 elements;
//  * a plain f32 kernel for any other widths (nope + rope ≤ 1024, v_dim ≤ 256, any alignment).
//
// Several requests' chunks go in one launch through query_start / kv_start (below).
//
// Graph-safe: the grid depends only on host values (tokens or max_query_len, requests, heads). No
// host synchronization. Not done here: the kv_b expansion of the latent cache.
//
// Fmt-free on purpose: included from .cu files.
#pragma once

#include <cstdint>

namespace fanout::ops {

struct MhaPrefillParams {
    int num_tokens = 0;  // T query tokens (of all requests)
    int ctx_len = 0;     // keys (≥ T; of all requests); one request: query i sits at position ctx_len − T + i
    int num_heads = 0;   // H (≤ 65535)
    int nope = 0, rope = 0, v_dim = 0;
    float scale = 1.0f;  // softmax scale, > 0 (YaRN mscale included)

    // Device pointers, bf16 bits, element strides; the innermost dimension is contiguous.
    const uint16_t* q = nullptr;  // [T][H][nope + rope], rope part roped
    int64_t q_stride_t = 0, q_stride_h = 0;
    const uint16_t* k_nope = nullptr;  // [ctx_len][H][nope]
    int64_t k_stride_t = 0, k_stride_h = 0;
    const uint16_t* k_pe = nullptr;  // [ctx_len][rope], shared by the heads, roped
    int64_t k_pe_stride_t = 0;
    const uint16_t* v = nullptr;  // [ctx_len][H][v_dim]
    int64_t v_stride_t = 0, v_stride_h = 0;
    uint16_t* out = nullptr;  // [T][H][v_dim]
    int64_t out_stride_t = 0, out_stride_h = 0;

    // Several requests in one launch (optional; both arrays or neither): device int32 arrays of
    // num_requests + 1 offsets — request r's queries are rows [query_start[r], query_start[r + 1])
    // of q and out, its keys rows [kv_start[r], kv_start[r + 1]) of k_nope, k_pe and v; the last
    // entries equal num_tokens and ctx_len, each request has at least as many keys as queries, and
    // its query i (counted from query_start[r]) sits at position (its keys − its queries) + i.
    // max_query_len (≥ the longest request's queries) sizes the grid. Without the arrays: one
    // request, num_tokens queries over ctx_len keys.
    int num_requests = 1;
    int max_query_len = 0;
    const int32_t* query_start = nullptr;
    const int32_t* kv_start = nullptr;
};

enum class MhaPrefillKernel { kWgmma, kGeneric };
const char* mha_prefill_kernel_name(MhaPrefillKernel k);

// Which kernel launch_mha_prefill runs for these params (tests and benchmarks report it).
MhaPrefillKernel mha_prefill_kernel_for(const MhaPrefillParams& p);

class DeviceContext;

// What launch_mha_prefill checks before anything reaches the GPU: throws fanout::Error naming the
// values when `kernel` cannot run these params (counts, widths, alignment, null pointers, request
// offsets).
void check_mha_prefill(const MhaPrefillParams& p, MhaPrefillKernel kernel);

// Runs the attention on ctx's stream (the wgmma kernel takes its work counters too; launches on
// one context follow each other, as its stream orders them). Throws fanout::Error naming the
// values on a broken precondition (counts, widths, null pointers).
void launch_mha_prefill(DeviceContext& ctx, const MhaPrefillParams& p);

// The same through the named kernel (tests compare them); throws when that kernel cannot take
// these params (the wgmma kernel: widths and alignment).
void launch_mha_prefill(DeviceContext& ctx, const MhaPrefillParams& p, MhaPrefillKernel kernel);

namespace detail {
// The wgmma kernel's launch (mha_prefill_sm90.cu); the params are checked by the caller.
void launch_mha_prefill_wgmma(DeviceContext& ctx, const MhaPrefillParams& p);
}  // namespace detail

}  // namespace fanout::ops
