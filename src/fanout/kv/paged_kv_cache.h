// The paged latent KV cache: per layer, a pool of blocks of `block_size` tokens, each token an
// entry of `entry_dim` values (kv_lora_rank normalized latent + qk_rope_head_dim roped key), stored
// in f32, bf16, or FP8 (e4m3 latent with a scale per 128 values, bf16 rope: ops/fp8_constants.h's
// MlaFp8Layout, whose entries take 57% of bf16's bytes at V3's widths).
//
// Storage is [num_layers, num_blocks, block_size, entry_bytes]; a sequence owns a list of block ids
// (its block table), the same ids in every layer. The allocator is plain data: no tensors, no
// device code, so schedulers can be unit-tested against it.
#pragma once

#include <cstdint>
#include <vector>

#include "fanout/core/tensor.h"

namespace fanout::kv {

constexpr int64_t kDefaultBlockSize = 64;

class BlockAllocator {
  public:
    explicit BlockAllocator(int64_t num_blocks);
    int64_t num_blocks() const { return num_blocks_; }
    int64_t num_free() const { return static_cast<int64_t>(free_.size()); }
    // n new block ids; throws Error (naming the shortfall) when fewer than n are free.
    std::vector<int32_t> allocate(int64_t n);
    void release(const std::vector<int32_t>& blocks);

  private:
    int64_t num_blocks_;
    std::vector<int32_t> free_;
    std::vector<bool> in_use_;
};

struct KvCacheConfig {
    int64_t num_layers = 0;  // 0: blocks only, the entries live elsewhere (the GPU runner's device cache)
    int64_t entry_dim = 0;
    int64_t block_size = kDefaultBlockSize;
    int64_t num_blocks = 0;
    DType dtype = DType::kF32;  // kF32, kBF16 or kFP8E4M3 (the FP8 entry)
    int64_t kv_lora = 0;        // the latent's width within entry_dim (the FP8 entry scales it per 128)
    // Bytes of one token's entry in one layer (ops::latent_entry_bytes); throws, naming the
    // widths, for a dtype or FP8 widths the cache cannot store.
    int64_t entry_bytes() const;
    bool operator==(const KvCacheConfig&) const = default;
};

// A sequence's blocks and how many tokens they hold.
struct SequenceBlocks {
    std::vector<int32_t> blocks;
    int64_t num_tokens = 0;
};

class PagedKvCache {
  public:
    explicit PagedKvCache(const KvCacheConfig& config);
    const KvCacheConfig& config() const { return config_; }
    BlockAllocator& allocator() { return allocator_; }

    // Grows seq's block list to hold `num_tokens` tokens (allocating as needed).
    void reserve(SequenceBlocks& seq, int64_t num_tokens);
    void release(SequenceBlocks& seq);
    // The flat slot of token `pos` of seq: block * block_size + pos % block_size.
    int32_t slot(const SequenceBlocks& seq, int64_t pos) const;

    // Layer `layer`'s pool: [num_blocks, block_size] entries of config().entry_bytes() bytes.
    void* layer_data(int64_t layer) const;

  private:
    KvCacheConfig config_;
    Tensor storage_;
    BlockAllocator allocator_;
};

}  // namespace fanout::kv
