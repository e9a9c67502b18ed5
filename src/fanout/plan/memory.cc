#include "fanout/plan/memory.h"

#include "fanout/core/error.h"
#include "fanout/ops/fp8_constants.h"
#include "fanout/plan/v3_shape.h"

namespace fanout::plan {

// DeepSeek-V3's widths; FP8 weights take a byte each plus 4 bytes per 128×128 scale block (kFp8),
// BF16 ones two bytes.
using namespace v3;

double kv_entry_bytes(DType kv_dtype) {
    FANOUT_CHECK(kv_dtype == DType::kBF16 || kv_dtype == DType::kFP8E4M3,
                 "plan: the KV cache's entries are bf16 or fp8, not {}", dtype_name(kv_dtype));
    return double(ops::latent_entry_bytes(int64_t(kKvLora), int64_t(kRope), kv_dtype));
}

double kv_bytes_per_token(DType kv_dtype) { return (kMoeLayers + kDenseLayers) * kv_entry_bytes(kv_dtype); }

MemoryPlan plan_memory(int ep, int tp, int requests_per_gpu, int kv_len, DType kv_dtype) {
    FANOUT_CHECK(ep >= 1 && 256 % ep == 0, "plan: EP {} must divide the 256 experts", ep);
    FANOUT_CHECK(tp >= 1 && tp <= 128 && 128 % tp == 0, "plan: TP {} must divide the 128 heads", tp);
    FANOUT_CHECK(requests_per_gpu >= 0 && kv_len >= 0, "plan: negative batch {} or KV length {}", requests_per_gpu,
                 kv_len);
    const double heads = kHeads / tp;
    // Attention per layer: q_a and kv_a replicated, q_b, kv_b, o_proj by heads (FP8), norms bf16.
    const double attn = kFp8 * (kQLora * kHidden + (kKvLora + kRope) * kHidden) +
                        kFp8 * heads * ((kNope + kRope) * kQLora + (kNope + kV) * kKvLora + kV * kHidden) +
                        2 * (2 * kHidden + kQLora + kKvLora);
    const double expert = kFp8 * 3 * kMoeInter * kHidden;
    const double moe = (kExperts / ep) * expert + expert /* shared */ + 2 * kExperts * kHidden /* router */;
    const double dense = kFp8 * 3 * kDenseInter * kHidden / tp;
    const double embed_head = 2 * 2 * kVocab * kHidden / tp;
    const double mtp_extra = 2 * 2 * kHidden * kHidden /* eh_proj */;
    MemoryPlan p{};
    p.weights = (kMoeLayers + kDenseLayers + kMtpLayers) * attn + (kMoeLayers + kMtpLayers) * moe +
                kDenseLayers * dense + embed_head + kMtpLayers * mtp_extra;
    p.kv_per_request = kv_len * kv_bytes_per_token(kv_dtype);
    p.kv = static_cast<double>(requests_per_gpu) * tp * p.kv_per_request;
    p.reserve = kReserveBytes;
    return p;
}

int max_requests_per_gpu(const Hardware& hw, int ep, int tp, int kv_len, DType kv_dtype) {
    const MemoryPlan empty = plan_memory(ep, tp, 0, kv_len, kv_dtype);
    const double free = hw.hbm_bytes - empty.total();
    if (free <= 0) return 0;
    if (kv_len == 0) return 1 << 20;
    return static_cast<int>(free / (tp * empty.kv_per_request));
}

MemoryPlan plan_memory_instance(int ep, int tp, double batch, int kv_len, DType kv_dtype) {
    FANOUT_CHECK(batch >= 0, "plan: negative batch {}", batch);
    MemoryPlan p = plan_memory(ep, tp, 0, kv_len, kv_dtype);
    p.kv = batch * p.kv_per_request;
    return p;
}

int max_batch_per_instance(const Hardware& hw, int ep, int tp, int kv_len, DType kv_dtype) {
    const MemoryPlan empty = plan_memory(ep, tp, 0, kv_len, kv_dtype);
    const double free = hw.hbm_bytes - empty.total();
    if (free <= 0) return 0;
    if (kv_len == 0) return 1 << 20;
    return static_cast<int>(free / empty.kv_per_request);
}

}  // namespace fanout::plan
