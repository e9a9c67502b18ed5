#include "fanout/io/checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "fanout/io/json_util.h"

namespace fanout::io {
namespace fs = std::filesystem;

Checkpoint Checkpoint::open(const std::string& dir, Progress progress) {
    Checkpoint ck;
    ck.dir_ = dir;
    ck.progress_ = std::move(progress);
    FANOUT_CHECK(fs::is_directory(dir), "model folder '{}' does not exist or is not a folder", dir);
    const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
    const fs::path single_path = fs::path(dir) / "model.safetensors";
    // HF loads model.safetensors when both are there and never reads the index; which one was
    // meant is not ours to guess (a folder written twice, sharded then not, holds both).
    FANOUT_CHECK(!(fs::exists(index_path) && fs::exists(single_path)),
                 "model folder '{}' holds both model.safetensors and model.safetensors.index.json (two "
                 "checkpoints?): remove the one not meant",
                 dir);
    if (fs::exists(index_path)) {
        const nlohmann::json index = parse_json(read_text_file(index_path.string()), index_path.string());
        FANOUT_CHECK(index.is_object() && index.contains("weight_map") && index["weight_map"].is_object(),
                     "{}: missing object field 'weight_map'", index_path.string());
        std::map<std::string, int> file_index;
        for (const auto& [name, file] : index["weight_map"].items()) {
            FANOUT_CHECK(file.is_string(), "{}: weight_map['{}'] must be a file name string", index_path.string(),
                         name);
            const std::string f = file.get<std::string>();
            FANOUT_CHECK(!f.empty() && f.find('/') == std::string::npos && f != "." && f != "..",
                         "{}: weight_map['{}'] = '{}' is not a plain file name in the model folder",
                         index_path.string(), name, f);
            auto [it, inserted] = file_index.emplace(f, static_cast<int>(ck.shard_files_.size()));
            if (inserted) ck.shard_files_.push_back((fs::path(dir) / f).string());
            ck.shard_of_[name] = it->second;
        }
        for (const auto& f : ck.shard_files_)
            FANOUT_CHECK(fs::exists(f), "{}: shard '{}' named in the index does not exist", index_path.string(), f);
        ck.shards_.resize(ck.shard_files_.size());
    } else {
        FANOUT_CHECK(fs::exists(single_path),
                     "model folder '{}' has neither model.safetensors nor "
                     "model.safetensors.index.json",
                     dir);
        ck.shard_files_.push_back(single_path.string());
        ck.shards_.resize(1);
        for (const auto& name : ck.shard(0).names()) ck.shard_of_[name] = 0;
    }
    return ck;
}

const SafetensorsFile& Checkpoint::shard(int index) const {
    if (!shards_[index]) {
        if (progress_) progress_(index, num_shards(), shard_files_[index]);
        shards_[index] = std::make_unique<SafetensorsFile>(SafetensorsFile::open(shard_files_[index]));
    }
    return *shards_[index];
}

void Checkpoint::open_all() const {
    for (int i = 0; i < num_shards(); ++i) shard(i);
}

Checkpoint::FileRange Checkpoint::locate(const void* p, size_t nbytes) const {
    for (int i = 0; i < num_shards(); ++i) {
        FileRange r{i, 0};
        if (shards_[i] && shards_[i]->offset_of(p, nbytes, &r.offset)) return r;
    }
    FANOUT_FAIL("checkpoint '{}': {} bytes at {} are not in any of its mapped shards", dir_, nbytes, p);
}

std::string Checkpoint::file_of(const std::string& name) const {
    const auto it = shard_of_.find(name);
    FANOUT_CHECK(it != shard_of_.end(), "checkpoint '{}' has no tensor '{}'", dir_, name);
    return shard_files_[it->second];
}

const TensorEntry& Checkpoint::entry(const std::string& name) const {
    const auto it = shard_of_.find(name);
    FANOUT_CHECK(it != shard_of_.end(), "checkpoint '{}' has no tensor '{}'", dir_, name);
    const SafetensorsFile& f = shard(it->second);
    FANOUT_CHECK(f.has(name), "{}: the index says this shard holds '{}' but it does not", f.path(), name);
    return f.entry(name);
}

Tensor Checkpoint::get(const std::string& name) const {
    entry(name);
    return shard(shard_of_.at(name)).tensor(name);
}

Tensor Checkpoint::get(const std::string& name, std::initializer_list<DType> dtypes, const Shape& shape) const {
    Tensor t = get(name);
    bool dtype_ok = false;
    std::vector<std::string_view> allowed;
    for (DType d : dtypes) {
        dtype_ok |= t.dtype() == d;
        allowed.push_back(dtype_name(d));
    }
    FANOUT_CHECK(dtype_ok, "{}: tensor '{}' has dtype {}, expected one of {}", file_of(name), name,
                 dtype_name(t.dtype()), fmt::join(allowed, ", "));
    FANOUT_CHECK(t.shape() == shape, "{}: tensor '{}' has shape {}, expected {}", file_of(name), name,
                 shape_str(t.shape()), shape_str(shape));
    return t;
}

std::optional<Tensor> Checkpoint::get_optional(const std::string& name) const {
    if (!has(name)) return std::nullopt;
    return get(name);
}

std::vector<std::string> Checkpoint::names() const {
    std::vector<std::string> out;
    for (const auto& [name, idx] : shard_of_) out.push_back(name);
    return out;
}

}  // namespace fanout::io
