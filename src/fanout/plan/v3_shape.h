// DeepSeek-V3's widths as the deployment planner uses them (REFERENCE.md §2, the HF config of
// deepseek-ai/DeepSeek-V3). Plain constants: the planner models this one architecture.
#pragma once

namespace fanout::plan::v3 {

constexpr double kHidden = 7168, kVocab = 129280;
constexpr double kHeads = 128, kQLora = 1536, kKvLora = 512, kRope = 64, kNope = 128, kV = 128;
constexpr double kMoeInter = 2048, kDenseInter = 18432, kExperts = 256, kTopK = 8;
constexpr int kMoeLayers = 58, kDenseLayers = 3, kMtpLayers = 1;
// An FP8 weight byte plus its share of one f32 scale per 128×128 block.
constexpr double kFp8 = 1.0 + 4.0 / (128 * 128);
// Dispatch payload per token copy: FP8 hidden + one f32 scale per 128 (REFERENCE.md §1 kernels);
// combine payload: BF16 hidden (DESIGN.md §3, EP dispatch/combine API).
constexpr double kDispatchBytesPerCopy = kHidden + 4 * kHidden / 128;
constexpr double kCombineBytesPerCopy = 2 * kHidden;

}  // namespace fanout::plan::v3
