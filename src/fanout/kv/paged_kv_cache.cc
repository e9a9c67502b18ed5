#include "fanout/kv/paged_kv_cache.h"

#include <algorithm>

#include "fanout/ops/fp8_constants.h"

namespace fanout::kv {

BlockAllocator::BlockAllocator(int64_t num_blocks) : num_blocks_(num_blocks), in_use_(num_blocks, false) {
    FANOUT_CHECK(num_blocks >= 0 && num_blocks < (int64_t{1} << 31), "kv cache: {} blocks is out of range", num_blocks);
    free_.reserve(static_cast<size_t>(num_blocks));
    for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(static_cast<int32_t>(b));  // hand out 0 first
}

std::vector<int32_t> BlockAllocator::allocate(int64_t n) {
    FANOUT_CHECK(n >= 0 && n <= num_free(), "kv cache: need {} blocks but only {} of {} are free", n, num_free(),
                 num_blocks_);
    std::vector<int32_t> out(free_.end() - n, free_.end());
    std::reverse(out.begin(), out.end());
    free_.resize(free_.size() - static_cast<size_t>(n));
    for (int32_t b : out) in_use_[b] = true;
    return out;
}

void BlockAllocator::release(const std::vector<int32_t>& blocks) {
    for (int32_t b : blocks) {
        FANOUT_CHECK(b >= 0 && b < num_blocks_ && in_use_[b], "kv cache: releasing block {} that is not in use", b);
        in_use_[b] = false;
        free_.push_back(b);
    }
}

int64_t KvCacheConfig::entry_bytes() const {
    const int64_t bytes = ops::latent_entry_bytes(kv_lora, entry_dim - kv_lora, dtype);
    FANOUT_CHECK(bytes > 0,
                 "kv cache: cannot store dtype {} at entry_dim {} (kv_lora {}): the cache stores f32, bf16, or FP8 "
                 "with kv_lora a multiple of 4 and an even rope width",
                 dtype_name(dtype), entry_dim, kv_lora);
    return bytes;
}

namespace {

// The config's block count, checked before anything is allocated for it.
int64_t checked_blocks(const KvCacheConfig& config) {
    FANOUT_CHECK(config.num_layers >= 0 && config.entry_dim > 0 && config.block_size > 0 && config.kv_lora >= 0 &&
                     config.kv_lora < config.entry_dim,
                 "kv cache: layers={} entry_dim={} kv_lora={} block_size={} must be positive (layers and kv_lora may "
                 "be 0; kv_lora < entry_dim)",
                 config.num_layers, config.entry_dim, config.kv_lora, config.block_size);
    // A position's slot (block · block_size + offset) is an int32 in the step's metadata.
    FANOUT_CHECK(config.num_blocks <= (int64_t{1} << 31) / config.block_size,
                 "kv cache: {} blocks of {} positions pass the 2^31 cache slots a step can address", config.num_blocks,
                 config.block_size);
    return config.num_blocks;
}

}  // namespace

PagedKvCache::PagedKvCache(const KvCacheConfig& config) : config_(config), allocator_(checked_blocks(config)) {
    storage_ =
        Tensor::zeros({config.num_layers, config.num_blocks, config.block_size, config.entry_bytes()}, DType::kU8);
}

void PagedKvCache::reserve(SequenceBlocks& seq, int64_t num_tokens) {
    const int64_t need = (num_tokens + config_.block_size - 1) / config_.block_size;
    const int64_t have = static_cast<int64_t>(seq.blocks.size());
    if (need > have) {
        const auto more = allocator_.allocate(need - have);
        seq.blocks.insert(seq.blocks.end(), more.begin(), more.end());
    }
}

void PagedKvCache::release(SequenceBlocks& seq) {
    allocator_.release(seq.blocks);
    seq.blocks.clear();
    seq.num_tokens = 0;
}

int32_t PagedKvCache::slot(const SequenceBlocks& seq, int64_t pos) const {
    const int64_t b = pos / config_.block_size;
    FANOUT_CHECK(pos >= 0 && b < static_cast<int64_t>(seq.blocks.size()),
                 "kv cache: position {} beyond the sequence's {} blocks", pos, seq.blocks.size());
    return static_cast<int32_t>(seq.blocks[b] * config_.block_size + pos % config_.block_size);
}

void* PagedKvCache::layer_data(int64_t layer) const {
    FANOUT_CHECK(layer >= 0 && layer < config_.num_layers, "kv cache: layer {} of {}", layer, config_.num_layers);
    const size_t per_layer = static_cast<size_t>(config_.num_blocks * config_.block_size * config_.entry_bytes());
    return static_cast<char*>(storage_.data()) + static_cast<size_t>(layer) * per_layer;
}

}  // namespace fanout::kv
