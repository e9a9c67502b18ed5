// PrefixCache: KV blocks shared between requests by their token content.
//
// Every full block a sequence computes is entered in a radix tree whose edges are whole blocks of
// tokens (a node's path from the root is the exact token prefix its KV was computed from). A new
// request walks the tree with its prompt and reuses the longest chain of cached blocks, skipping
// their prefill. Blocks are reference-counted: a block in use by any sequence is never evicted;
// cached blocks nobody uses stay in the tree until the allocator runs dry, then the least recently
// used leaves are evicted first. Plain data, no tensors: the scheduler owns one and tests drive it
// directly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "fanout/kv/paged_kv_cache.h"

namespace fanout::kv {

// The hash of a block of tokens that follows the prefix hashed `parent` (kRootHash for the first
// block): a chain, so a hash names the exact token prefix a block's KV was computed from. The
// engines publish their cached blocks by it and the router hashes prompts the same way.
constexpr uint64_t kRootHash = 0x9e3779b97f4a7c15ull;
uint64_t block_hash(uint64_t parent, std::span<const int32_t> block_tokens);
// The chain hashes of the full blocks of `tokens`.
std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens, int64_t block_size);

class PrefixCache {
  public:
    PrefixCache(BlockAllocator& allocator, int64_t block_size);
    ~PrefixCache();

    // The longest cached prefix of `tokens`, at most `max_blocks` blocks: their ids, each with a
    // reference taken for the caller.
    std::vector<int32_t> acquire_prefix(std::span<const int32_t> tokens, int64_t max_blocks);
    // n fresh blocks (evicting unused cached blocks when the allocator is short), referenced once.
    // Throws Error when even eviction cannot find n blocks; can_allocate() says in advance.
    std::vector<int32_t> allocate(int64_t n);
    bool can_allocate(int64_t n) const { return allocator_.num_free() + num_evictable_ >= n; }
    // Records that blocks[i] holds tokens[i*bs, (i+1)*bs) for every full block, extending the tree.
    // Where that content is already cached under another id, blocks[i] is replaced by the cached
    // block (referenced for the caller) and the caller's copy is released.
    void insert(std::span<const int32_t> tokens, std::vector<int32_t>& blocks);
    // Drops the caller's references; blocks nobody references go back to the allocator unless the
    // tree holds them.
    void release(const std::vector<int32_t>& blocks);

    // Called (on the thread that changes the cache) with the chain hashes of blocks entered in and
    // evicted from the tree; nullptr: nobody listens.
    using Listener = std::function<void(const std::vector<uint64_t>& stored, const std::vector<uint64_t>& removed)>;
    void set_listener(Listener listener) { listener_ = std::move(listener); }
    // The chain hashes of every cached block.
    std::vector<uint64_t> cached_hashes() const;

    int64_t num_cached_blocks() const { return static_cast<int64_t>(nodes_.size()); }
    int64_t num_evictable() const { return num_evictable_; }
    int64_t block_size() const { return block_size_; }
    // Blocks in use or cached: the allocator's view of "not free".
    int64_t num_used_blocks() const { return allocator_.num_blocks() - allocator_.num_free(); }

  private:
    struct Node;
    Node* find_child(Node* parent, std::span<const int32_t> block_tokens) const;
    void evict(int64_t n);
    void unref(int32_t block);

    BlockAllocator& allocator_;
    int64_t block_size_;
    std::unique_ptr<Node> root_;
    std::unordered_map<int32_t, Node*> nodes_;  // cached block id -> its node
    std::vector<int32_t> refs_;                 // per block id
    int64_t num_evictable_ = 0;                 // cached blocks with no references
    uint64_t clock_ = 0;
    Listener listener_;
};

}  // namespace fanout::kv
