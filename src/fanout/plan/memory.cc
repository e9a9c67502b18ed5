#include "fanout/plan/memory.h"

#include "fanout/core/error.h"

namespace fanout::plan {
namespace {

// DeepSeek-V3 (REFERENCE.md §2), parameters; FP8 weights take a byte each plus 4 bytes per
// 128×128 scale block (~0.02%), BF16 ones two bytes.
constexpr double kHidden = 7168, kVocab = 129280, kHeads = 128, kQLora = 1536, kKvLora = 512, kRope = 64, kNope = 128,
                 kV = 128, kMoeInter = 2048, kDenseInter = 18432, kExperts = 256;
constexpr int kMoeLayers = 58, kDenseLayers = 3, kMtpLayers = 1;
constexpr double kFp8 = 1.0 + 4.0 / (128 * 128);

}  // namespace

MemoryPlan plan_memory(int ep, int tp, int requests_per_gpu, int kv_len) {
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
    p.kv_per_request = kv_len * kKvBytesPerToken;
    p.kv = static_cast<double>(requests_per_gpu) * tp * p.kv_per_request;
    p.reserve = kReserveBytes;
    return p;
}

int max_requests_per_gpu(const Hardware& hw, int ep, int tp, int kv_len) {
    const MemoryPlan empty = plan_memory(ep, tp, 0, kv_len);
    const double free = hw.hbm_bytes - empty.total();
    if (free <= 0) return 0;
    if (kv_len == 0) return 1 << 20;
    return static_cast<int>(free / (tp * empty.kv_per_request));
}

MemoryPlan plan_memory_instance(int ep, int tp, double batch, int kv_len) {
    FANOUT_CHECK(batch >= 0, "plan: negative batch {}", batch);
    MemoryPlan p = plan_memory(ep, tp, 0, kv_len);
    p.kv = batch * p.kv_per_request;
    return p;
}

int max_batch_per_instance(const Hardware& hw, int ep, int tp, int kv_len) {
    const MemoryPlan empty = plan_memory(ep, tp, 0, kv_len);
    const double free = hw.hbm_bytes - empty.total();
    if (free <= 0) return 0;
    if (kv_len == 0) return 1 << 20;
    return static_cast<int>(free / empty.kv_per_request);
}

}  // namespace fanout::plan
