// Tests of io::Checkpoint over model folders built in a temp dir: a single model.safetensors, a
// two-shard folder with model.safetensors.index.json, and the folder defects that must be an
// Error naming the folder, the index, the shard or the tensor.
#include "fanout/io/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "test_util.h"

namespace fanout::io {
namespace {

namespace fs = std::filesystem;
using ::fanout::testing::error_of;
using ::fanout::testing::write_file;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class CheckpointTest : public fanout::testing::TempDirTest {
  protected:
    // Writes a safetensors file of f32 tensors; tensor i holds the values base + i * 0.5, ...
    void write_shard(const std::string& file, const std::vector<TensorSpec>& specs, float base) {
        SafetensorsWriter w(path(file), specs, {{"format", "pt"}});
        for (const auto& s : specs) {
            std::vector<uint8_t> bytes(static_cast<size_t>(shape_numel(s.shape)) * dtype_size(s.dtype));
            if (s.dtype == DType::kF32) {
                auto* f = reinterpret_cast<float*>(bytes.data());
                for (size_t i = 0; i < bytes.size() / 4; ++i) f[i] = base + 0.5f * static_cast<float>(i);
            }
            if (!bytes.empty()) w.write(s.name, bytes.data(), bytes.size());
        }
        w.finish();
    }

    void write_index(const std::string& weight_map_json) {
        write_file(path("model.safetensors.index.json"),
                   R"({"metadata": {"total_size": 0}, "weight_map": )" + weight_map_json + "}");
    }

    // Two shards: a.w and a.b in the first, c.w in the second.
    void write_two_shards() {
        write_shard("model-00001-of-00002.safetensors", {{"a.w", DType::kF32, {2, 3}}, {"a.b", DType::kBF16, {3}}},
                    1.0f);
        write_shard("model-00002-of-00002.safetensors", {{"c.w", DType::kF32, {4}}}, 10.0f);
        write_index(R"({"a.w": "model-00001-of-00002.safetensors", "a.b": "model-00001-of-00002.safetensors",
                        "c.w": "model-00002-of-00002.safetensors"})");
    }
};

TEST_F(CheckpointTest, SingleFile) {
    write_shard("model.safetensors", {{"embed", DType::kF32, {4, 2}}, {"norm", DType::kF32, {2}}}, 3.0f);
    const Checkpoint ck = Checkpoint::open(dir_);
    EXPECT_EQ(ck.dir(), dir_);
    EXPECT_EQ(ck.num_shards(), 1);
    EXPECT_THAT(ck.names(), ElementsAre("embed", "norm"));
    EXPECT_TRUE(ck.has("embed"));
    EXPECT_FALSE(ck.has("lm_head"));
    EXPECT_EQ(ck.file_of("norm"), path("model.safetensors"));
    const Tensor e = ck.get("embed");
    EXPECT_EQ(e.shape(), (Shape{4, 2}));
    EXPECT_EQ(e.data_as<float>()[0], 3.0f);
    EXPECT_EQ(e.data_as<float>()[7], 6.5f);
    EXPECT_EQ(ck.entry("norm").nbytes, 8u);
    EXPECT_TRUE(ck.get_optional("norm").has_value());
    EXPECT_FALSE(ck.get_optional("lm_head").has_value());
}

TEST_F(CheckpointTest, ShardedWithIndex) {
    write_two_shards();
    std::vector<std::string> opened;
    const Checkpoint ck = Checkpoint::open(dir_, [&](int index, int count, const std::string& file) {
        EXPECT_EQ(count, 2);
        opened.push_back(std::to_string(index) + ":" + fs::path(file).filename().string());
    });
    EXPECT_EQ(ck.num_shards(), 2);
    EXPECT_TRUE(opened.empty()) << "shards open lazily";
    EXPECT_THAT(ck.names(), ElementsAre("a.b", "a.w", "c.w"));
    EXPECT_EQ(ck.file_of("c.w"), path("model-00002-of-00002.safetensors"));

    const Tensor c = ck.get("c.w");
    EXPECT_EQ(c.data_as<float>()[0], 10.0f);
    EXPECT_EQ(c.data_as<float>()[3], 11.5f);
    EXPECT_THAT(opened, ElementsAre("1:model-00002-of-00002.safetensors"));
    EXPECT_EQ(ck.get("a.w").data_as<float>()[5], 3.5f);
    EXPECT_EQ(ck.get("a.b").dtype(), DType::kBF16);
    ck.open_all();
    EXPECT_THAT(opened, ElementsAre("1:model-00002-of-00002.safetensors", "0:model-00001-of-00002.safetensors"))
        << "each shard is opened once";
}

// Both layouts in one folder: HF would read model.safetensors, fanout used to read the index;
// which was meant is not known, so the folder is refused, naming both.
TEST_F(CheckpointTest, BothLayoutsInOneFolderAreRefused) {
    write_two_shards();
    write_shard("model.safetensors", {{"stale", DType::kF32, {1}}}, 0.0f);
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
                HasSubstr("holds both model.safetensors and model.safetensors.index.json"));
}

TEST_F(CheckpointTest, IndexNamesMissingShard) {
    write_shard("model-00001-of-00002.safetensors", {{"a.w", DType::kF32, {2}}}, 1.0f);
    write_index(R"({"a.w": "model-00001-of-00002.safetensors", "c.w": "model-00002-of-00002.safetensors"})");
    const std::string msg = error_of([&] { Checkpoint::open(dir_); });
    EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
    EXPECT_THAT(msg, HasSubstr("model-00002-of-00002.safetensors"));
    EXPECT_THAT(msg, HasSubstr("does not exist"));
}

TEST_F(CheckpointTest, WeightMapPathsOutsideTheFolderAreRejected) {
    write_shard("model-00001-of-00001.safetensors", {{"a.w", DType::kF32, {2}}}, 1.0f);
    for (const std::string bad :
         {"../model-00001-of-00001.safetensors", "sub/model.safetensors", "/etc/passwd", "..", ".", ""}) {
        SCOPED_TRACE(bad);
        write_index(R"({"a.w": ")" + bad + R"("})");
        const std::string msg = error_of([&] { Checkpoint::open(dir_); });
        EXPECT_THAT(msg, HasSubstr("model.safetensors.index.json"));
        EXPECT_THAT(msg, HasSubstr("weight_map['a.w'] = '" + bad + "'"));
        EXPECT_THAT(msg, HasSubstr("not a plain file name"));
    }
}

TEST_F(CheckpointTest, BadIndexFiles) {
    write_file(path("model.safetensors.index.json"), "{ not json");
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }), HasSubstr("not valid JSON"));
    write_file(path("model.safetensors.index.json"), R"({"metadata": {}})");
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }), HasSubstr("missing object field 'weight_map'"));
    write_file(path("model.safetensors.index.json"), R"({"weight_map": ["a"]})");
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }), HasSubstr("'weight_map'"));
    write_index(R"({"a.w": 3})");
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }), HasSubstr("weight_map['a.w'] must be a file name string"));
}

TEST_F(CheckpointTest, IndexPointsAtShardWithoutTheTensor) {
    write_two_shards();
    write_index(R"({"a.w": "model-00001-of-00002.safetensors", "c.w": "model-00001-of-00002.safetensors"})");
    const Checkpoint ck = Checkpoint::open(dir_);
    const std::string msg = error_of([&] { ck.get("c.w"); });
    EXPECT_THAT(msg, HasSubstr("model-00001-of-00002.safetensors"));
    EXPECT_THAT(msg, HasSubstr("'c.w'"));
}

TEST_F(CheckpointTest, CorruptShardIsReportedWhenOpened) {
    write_two_shards();
    write_file(path("model-00002-of-00002.safetensors"), "short");
    const Checkpoint ck = Checkpoint::open(dir_);
    EXPECT_NO_THROW(ck.get("a.w"));
    const std::string msg = error_of([&] { ck.get("c.w"); });
    EXPECT_THAT(msg, HasSubstr(path("model-00002-of-00002.safetensors")));
    EXPECT_THAT(msg, HasSubstr("need at least 8"));
    EXPECT_THROW(ck.open_all(), Error);
}

TEST_F(CheckpointTest, MissingTensorNamesTensorAndFolder) {
    write_two_shards();
    const Checkpoint ck = Checkpoint::open(dir_);
    for (auto lookup : {+[](const Checkpoint& c) { c.get("model.layers.0.mlp.gate.weight"); },
                        +[](const Checkpoint& c) { c.entry("model.layers.0.mlp.gate.weight"); },
                        +[](const Checkpoint& c) { c.file_of("model.layers.0.mlp.gate.weight"); },
                        +[](const Checkpoint& c) { c.get("model.layers.0.mlp.gate.weight", {DType::kF32}, {1}); }}) {
        const std::string msg = error_of([&] { lookup(ck); });
        EXPECT_THAT(msg, HasSubstr("'model.layers.0.mlp.gate.weight'"));
        EXPECT_THAT(msg, HasSubstr(dir_));
    }
}

TEST_F(CheckpointTest, CheckedGetAcceptsAllowedDtypesAndExactShape) {
    write_two_shards();
    const Checkpoint ck = Checkpoint::open(dir_);
    EXPECT_EQ(ck.get("a.w", {DType::kF32}, {2, 3}).numel(), 6);
    EXPECT_EQ(ck.get("a.b", {DType::kF32, DType::kBF16}, {3}).dtype(), DType::kBF16);
}

TEST_F(CheckpointTest, CheckedGetWrongDtype) {
    write_two_shards();
    const Checkpoint ck = Checkpoint::open(dir_);
    const std::string msg = error_of([&] { ck.get("a.b", {DType::kF32, DType::kFP8E4M3}, {3}); });
    EXPECT_THAT(msg, HasSubstr("model-00001-of-00002.safetensors"));
    EXPECT_THAT(msg, HasSubstr("tensor 'a.b' has dtype BF16, expected one of F32, F8_E4M3"));
}

TEST_F(CheckpointTest, CheckedGetWrongShape) {
    write_two_shards();
    const Checkpoint ck = Checkpoint::open(dir_);
    std::string msg = error_of([&] { ck.get("a.w", {DType::kF32}, {3, 2}); });
    EXPECT_THAT(msg, HasSubstr("model-00001-of-00002.safetensors"));
    EXPECT_THAT(msg, HasSubstr("tensor 'a.w' has shape [2, 3], expected [3, 2]"));
    msg = error_of([&] { ck.get("a.w", {DType::kF32}, {6}); });
    EXPECT_THAT(msg, HasSubstr("has shape [2, 3], expected [6]"));
}

TEST_F(CheckpointTest, FifoIndexOrShardIsRefusedWithoutBlocking) {
    const std::string index = path("model.safetensors.index.json");
    fanout::testing::make_fifo(index);
    std::string msg = fanout::testing::error_of_without_blocking([&] { Checkpoint::open(dir_); }, index);
    EXPECT_THAT(msg, HasSubstr(index + " is not a regular file (a FIFO)"));
    fs::remove(index);

    write_two_shards();
    const std::string shard = path("model-00002-of-00002.safetensors");
    fs::remove(shard);
    fanout::testing::make_fifo(shard);
    const Checkpoint ck = Checkpoint::open(dir_);
    msg = fanout::testing::error_of_without_blocking([&] { ck.get("c.w"); }, shard);
    EXPECT_THAT(msg, HasSubstr(shard + " is not a regular file (a FIFO)"));
}

TEST_F(CheckpointTest, FolderInPlaceOfTheFileIsRefused) {
    fs::create_directories(path("model.safetensors"));
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
                HasSubstr(path("model.safetensors") + " is not a regular file (a folder)"));
    fs::remove_all(path("model.safetensors"));
    fs::create_directories(path("model.safetensors.index.json"));
    EXPECT_THAT(error_of([&] { Checkpoint::open(dir_); }),
                HasSubstr(path("model.safetensors.index.json") + " is not a regular file (a folder)"));
}

TEST_F(CheckpointTest, FolderWithoutSafetensors) {
    write_file(path("config.json"), "{}");
    write_file(path("pytorch_model.bin"), "not ours");
    const std::string msg = error_of([&] { Checkpoint::open(dir_); });
    EXPECT_THAT(msg, HasSubstr(dir_));
    EXPECT_THAT(msg, HasSubstr("neither model.safetensors nor model.safetensors.index.json"));
}

TEST_F(CheckpointTest, FolderThatDoesNotExist) {
    const std::string missing = path("no_such_model");
    std::string msg = error_of([&] { Checkpoint::open(missing); });
    EXPECT_THAT(msg, HasSubstr(missing));
    EXPECT_THAT(msg, HasSubstr("does not exist"));
    write_file(path("file"), "x");
    msg = error_of([&] { Checkpoint::open(path("file")); });
    EXPECT_THAT(msg, HasSubstr("not a folder"));
}

}  // namespace
}  // namespace fanout::io
