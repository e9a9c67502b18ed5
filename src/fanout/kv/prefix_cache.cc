#include "fanout/kv/prefix_cache.h"

#include <algorithm>
#include <functional>

#include "fanout/core/error.h"

namespace fanout::kv {

struct PrefixCache::Node {
    std::vector<int32_t> tokens;  // this block's tokens (empty for the root)
    uint64_t chain = kRootHash;   // block_hash of the path to here
    int32_t block = -1;
    Node* parent = nullptr;
    uint64_t last_used = 0;
    std::unordered_multimap<uint64_t, std::unique_ptr<Node>> children;  // by hash of the child's tokens
};

namespace {

uint64_t hash_tokens(std::span<const int32_t> t) {
    uint64_t h = 1469598103934665603ull;
    for (int32_t v : t) h = (h ^ static_cast<uint32_t>(v)) * 1099511628211ull;
    return h;
}

}  // namespace

uint64_t block_hash(uint64_t parent, std::span<const int32_t> block_tokens) {
    // FNV-1a over the parent hash's bytes and the tokens', then a final avalanche (splitmix64).
    uint64_t h = 1469598103934665603ull;
    const auto mix = [&](uint64_t v, int bytes) {
        for (int i = 0; i < bytes; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    };
    mix(parent, 8);
    for (int32_t t : block_tokens) mix(static_cast<uint32_t>(t), 4);
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 31);
}

std::vector<uint64_t> block_hashes(std::span<const int32_t> tokens, int64_t block_size) {
    std::vector<uint64_t> out;
    uint64_t h = kRootHash;
    for (size_t at = 0; block_size > 0 && at + static_cast<size_t>(block_size) <= tokens.size();
         at += static_cast<size_t>(block_size))
        out.push_back(h = block_hash(h, tokens.subspan(at, static_cast<size_t>(block_size))));
    return out;
}

std::vector<uint64_t> PrefixCache::cached_hashes() const {
    std::vector<uint64_t> out;
    out.reserve(nodes_.size());
    for (const auto& [block, node] : nodes_) out.push_back(node->chain);
    return out;
}

PrefixCache::PrefixCache(BlockAllocator& allocator, int64_t block_size)
    : allocator_(allocator),
      block_size_(block_size),
      root_(std::make_unique<Node>()),
      refs_(static_cast<size_t>(allocator.num_blocks()), 0) {
    FANOUT_CHECK(block_size > 0, "prefix cache: block_size {} must be positive", block_size);
}

PrefixCache::~PrefixCache() = default;

PrefixCache::Node* PrefixCache::find_child(Node* parent, std::span<const int32_t> block_tokens) const {
    const auto range = parent->children.equal_range(hash_tokens(block_tokens));
    for (auto it = range.first; it != range.second; ++it)
        if (std::equal(it->second->tokens.begin(), it->second->tokens.end(), block_tokens.begin(), block_tokens.end()))
            return it->second.get();
    return nullptr;
}

std::vector<int32_t> PrefixCache::acquire_prefix(std::span<const int32_t> tokens, int64_t max_blocks) {
    std::vector<int32_t> out;
    Node* node = root_.get();
    const int64_t full = std::min<int64_t>(max_blocks, static_cast<int64_t>(tokens.size()) / block_size_);
    ++clock_;
    for (int64_t b = 0; b < full; ++b) {
        Node* child = find_child(node, tokens.subspan(b * block_size_, block_size_));
        if (!child) break;
        if (refs_[child->block]++ == 0) --num_evictable_;
        child->last_used = clock_;
        out.push_back(child->block);
        node = child;
    }
    return out;
}

void PrefixCache::evict(int64_t n) {
    // Least recently used leaves with no references first; evicting a leaf may expose its parent.
    std::vector<uint64_t> removed;
    while (n > 0) {
        Node* victim = nullptr;
        for (const auto& [block, node] : nodes_)
            if (refs_[block] == 0 && node->children.empty() && (!victim || node->last_used < victim->last_used))
                victim = node;
        if (!victim) break;
        const int32_t block = victim->block;
        removed.push_back(victim->chain);
        Node* parent = victim->parent;
        const auto range = parent->children.equal_range(hash_tokens(victim->tokens));
        for (auto it = range.first; it != range.second; ++it)
            if (it->second.get() == victim) {
                parent->children.erase(it);
                break;
            }
        nodes_.erase(block);
        --num_evictable_;
        allocator_.release({block});
        --n;
    }
    if (listener_ && !removed.empty()) listener_({}, removed);
}

std::vector<int32_t> PrefixCache::allocate(int64_t n) {
    if (allocator_.num_free() < n) evict(n - allocator_.num_free());
    std::vector<int32_t> blocks = allocator_.allocate(n);  // throws, naming the shortfall
    for (int32_t b : blocks) refs_[b] = 1;
    return blocks;
}

void PrefixCache::insert(std::span<const int32_t> tokens, std::vector<int32_t>& blocks) {
    const int64_t full =
        std::min<int64_t>(static_cast<int64_t>(blocks.size()), static_cast<int64_t>(tokens.size()) / block_size_);
    Node* node = root_.get();
    ++clock_;
    std::vector<uint64_t> stored;
    for (int64_t b = 0; b < full; ++b) {
        const auto block_tokens = tokens.subspan(b * block_size_, block_size_);
        Node* child = find_child(node, block_tokens);
        if (!child) {
            if (nodes_.count(blocks[b])) break;  // this block is cached under another path: stop here
            auto n = std::make_unique<Node>();
            n->tokens.assign(block_tokens.begin(), block_tokens.end());
            n->chain = block_hash(node->chain, block_tokens);
            stored.push_back(n->chain);
            n->block = blocks[b];
            n->parent = node;
            child = n.get();
            node->children.emplace(hash_tokens(block_tokens), std::move(n));
            nodes_[blocks[b]] = child;
            if (refs_[blocks[b]] == 0) ++num_evictable_;
        }
        if (child->block != blocks[b]) {
            // The same content is cached under another block (computed twice): the sequence adopts
            // the cached one and gives its copy back, so it holds every ancestor of its blocks and
            // an unreferenced node never has a referenced child (what makes eviction complete).
            if (refs_[child->block]++ == 0) --num_evictable_;
            unref(blocks[b]);
            blocks[b] = child->block;
        }
        child->last_used = clock_;
        node = child;
    }
    if (listener_ && !stored.empty()) listener_(stored, {});
}

void PrefixCache::unref(int32_t block) {
    FANOUT_CHECK(block >= 0 && block < static_cast<int32_t>(refs_.size()) && refs_[block] > 0,
                 "prefix cache: releasing block {} that holds no reference", block);
    if (--refs_[block] > 0) return;
    if (nodes_.count(block))
        ++num_evictable_;
    else
        allocator_.release({block});
}

void PrefixCache::release(const std::vector<int32_t>& blocks) {
    for (int32_t b : blocks) unref(b);
}

}  // namespace fanout::kv
