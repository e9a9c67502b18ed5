// The GPU runner's weights as a plan, and the streaming reader that carries it out.
//
// plan_weights() lays out every array the GPU runner reads — fused and per-head weights, experts
// stacked for the grouped GEMM (deepseek_v3_cuda.h) — in one arena, and lists what fills each:
// byte ranges of checkpoint tensors, copied as they are or converted to bf16 on the way, or bytes
// prepared on the host. FP8 weights go as they are, with their weight_scale_inv, wherever their
// 128×128 blocks line up with the GPU layout (DeepSeek-V3's all do: q_a|kv_a, gate|up and the
// experts stack at multiples of 128 rows). kv_b's per-head k_b / v_b are dequantized to bf16 on the
// host (the absorbed form runs them in bf16), and a fused weight whose blocks straddle (the tiny
// model's 96-row q_a) is dequantized and re-quantized there. Planning reads nothing but those
// host-side pieces.
//
// stream_weights() then reads every checkpoint range once with pread — several reader threads
// over the ranges in file order, each with two staging buffers so one is read while the other is
// copied — checks the values load_weights deferred (NaN / Inf, fp8 scales) in the staging buffer,
// converts what needs converting there, and hands the buffer to a WeightTarget: the device (weight
// _upload.h: pinned staging, cudaMemcpyAsync) or host memory (the CPU tests of the plan). Nothing
// holds a host copy of the model, and the mapping's pages are never touched.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <vector>

#include "fanout/io/model_config.h"
#include "fanout/model/weights.h"

namespace fanout::model {

// One weight as the GPU runs it, [batch, N, K]: FP8 e4m3 with f32 scales per 128×128 block
// [batch, ceil(N/128), ceil(K/128)], or bf16. Arrays are indices into WeightPlan::arrays (-1: none).
struct MatrixPlan {
    bool fp8 = false;
    int64_t batch = 1, N = 0, K = 0;
    int q = -1, scale = -1, bf16 = -1;
};

// A decoder layer's arrays, as DeviceLayer (cuda_layer.h) holds them.
struct LayerPlan {
    int input_norm = -1, post_norm = -1, q_a_norm = -1, kv_a_norm = -1;  // f32
    MatrixPlan qkv_a, q_b, k_b, v_b, kv_b, o;
    bool moe = false, has_mlp = false;
    MatrixPlan gate_up, down;           // the dense MLP, or the shared expert
    int router = -1, router_bias = -1;  // bf16 [E, D], f32 [E]
    MatrixPlan experts_gate_up, experts_down;
};

// The MTP layer's arrays (DeviceMtp): its norms, eh_proj, decoder layer, and its embedding and
// head — the model's own arrays when the checkpoint has none of its own.
struct MtpPlan {
    int enorm = -1, hnorm = -1, head_norm = -1;  // f32 [D]
    MatrixPlan eh_proj;                          // [D, 2D]
    LayerPlan layer;
    int embed = -1, head = -1;  // bf16 [vocab, D]
};

struct WeightPlan {
    static constexpr size_t kAlign = 256;  // every array's offset in the arena
    struct Fill {
        size_t at = 0;                                     // byte offset in the array
        const void* src = nullptr;                         // a whole checkpoint tensor (in the mapping)
        size_t nbytes = 0;                                 // source bytes
        DType convert = DType::kU8;                        // kU8: as they are; kBF16/kF16/kF32: to bf16
        std::shared_ptr<const std::vector<uint8_t>> host;  // or bytes prepared on the host
    };
    struct Array {
        size_t offset = 0, bytes = 0;
        std::vector<Fill> fills;
    };
    std::vector<Array> arrays;
    size_t arena_bytes = 0;
    int embed = -1, lm_head = -1, final_norm = -1;  // bf16 [vocab, D], bf16 [vocab, D], f32 [D]
    std::vector<LayerPlan> layers;                  // the decoder layers
    std::optional<MtpPlan> mtp;                     // the MTP layer, when asked for
    double host_bytes = 0;                          // bytes prepared on the host
    double stream_bytes = 0;                        // checkpoint bytes the fills read
    std::set<const void*> host_sources;             // checkpoint tensors the host preparation read
};

// Whether the routed experts run FP8 on the GPU: the checkpoint is FP8 (quantization_config) and
// the grouped kernels take the experts' shapes. plan_weights() holds a checkpoint to it, so the
// step buffers can be sized from the config alone.
bool experts_run_fp8(const io::ModelConfig& c);

// with_mtp: the MTP layer too (the model must have one) — for MTP speculative decoding; without it
// the layer's tensors are not read.
WeightPlan plan_weights(const io::ModelConfig& c, const ModelWeights& w, bool with_mtp = false);

// Where stream_weights() puts the arena's bytes. Reader r's calls come from its own thread.
class WeightTarget {
  public:
    static constexpr size_t kStagingBytes = size_t{32} << 20;
    virtual ~WeightTarget() = default;
    virtual void begin_reader(int /*reader*/) {}
    // A staging buffer of kStagingBytes; reused once wait() returns for it.
    virtual uint8_t* staging(int reader, int slot) = 0;
    virtual void wait(int reader, int slot) = 0;
    // Copies n bytes of staging(reader, slot) to the arena at `arena_at` (may be asynchronous).
    virtual void copy(int reader, int slot, size_t arena_at, size_t n) = 0;
    // Every copy of this reader is done.
    virtual void finish(int reader) = 0;
    // Host bytes to the arena, synchronously (the planned host pieces; from the calling thread).
    virtual void write(size_t arena_at, const uint8_t* host, size_t n) = 0;
};

// What streaming did, for the start-up breakdown.
struct StreamStats {
    double seconds = 0;     // wall time
    double bytes = 0;       // checkpoint bytes read
    double host_bytes = 0;  // bytes prepared on the host (straddling blocks, transposes)
    int readers = 0;
    int64_t tensors = 0;           // checkpoint tensor ranges read
    double read_seconds = 0;       // pread, summed over readers
    double check_seconds = 0;      // value checks and conversions in the staging buffers, summed
    double copy_wait_seconds = 0;  // waiting for a staging buffer's copy, summed
};

// The reader threads stream_weights() uses by default: one per core, 2..8.
int default_weight_readers();

// Fills the arena `target` holds as `plan` says, checking the values `w.unchecked` lists of every
// tensor the plan reads: those it streams in the staging buffers, those the host preparation read
// over the mapping; tensors the plan does not hold (the MTP layer, unless asked for) are not read at
// all. An Error names the tensor, file and element. Reader r sweeps the r-th of `readers`
// equal slices of the ranges in file order through its own file descriptors (readahead stays
// sequential), asking the kernel for its next chunk while it copies the current one. `readers`
// <= 0: default_weight_readers(). `progress` is called from this thread.
void stream_weights(const WeightPlan& plan, const ModelWeights& w, WeightTarget& target, int readers = 0,
                    const LoadProgress& progress = {}, StreamStats* stats = nullptr);

}  // namespace fanout::model
