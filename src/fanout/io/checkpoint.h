// Checkpoint: the tensors of an HF-format model folder, single-file or sharded.
//
// A folder holds `model.safetensors`, or `model.safetensors.index.json` whose "weight_map" names
// the shard that holds each tensor. Shards are memory-mapped when first used. Every lookup of a
// missing tensor, or one with the wrong dtype or shape, is an Error naming the tensor, the file
// and the expected and found values.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fanout/io/safetensors.h"

namespace fanout::io {

class Checkpoint {
  public:
    // Called as shards are opened: (index, count, shard path).
    using Progress = std::function<void(int, int, const std::string&)>;

    static Checkpoint open(const std::string& dir, Progress progress = {});

    const std::string& dir() const { return dir_; }
    bool has(const std::string& name) const { return shard_of_.count(name) != 0; }
    const TensorEntry& entry(const std::string& name) const;
    Tensor get(const std::string& name) const;
    // get() plus checks: one of the allowed dtypes and exactly this shape.
    Tensor get(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape) const;
    std::optional<Tensor> get_optional(const std::string& name) const;
    std::vector<std::string> names() const;
    std::string file_of(const std::string& name) const;
    int num_shards() const { return static_cast<int>(shard_files_.size()); }
    const std::string& shard_path(int index) const { return shard_files_.at(static_cast<size_t>(index)); }
    // Where `nbytes` bytes at `p` — inside a tensor get() returned — lie on disk, so a loader can
    // read them with pread instead of through the mapping.
    struct FileRange {
        int shard = 0;
        size_t offset = 0;
    };
    FileRange locate(const void* p, size_t nbytes) const;
    // Opens (maps and validates) every shard now, reporting progress.
    void open_all() const;

  private:
    const SafetensorsFile& shard(int index) const;

    std::string dir_;
    std::vector<std::string> shard_files_;
    std::map<std::string, int> shard_of_;
    mutable std::vector<std::unique_ptr<SafetensorsFile>> shards_;
    Progress progress_;
};

}  // namespace fanout::io
