// Tests of the input helpers in io/json_util.h: read_text_file reads a regular file whole, and
// refuses a FIFO (without blocking on it), a folder and a device with an Error naming the path;
// parse_msgpack_bounded decodes a peer's message within a nesting bound.
#include "fanout/io/json_util.h"

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
using ::testing::HasSubstr;

class ReadTextFileTest : public fanout::testing::TempDirTest {};

TEST_F(ReadTextFileTest, ReadsARegularFileWhole) {
    std::string bytes(200000, 'x');
    bytes[7] = '\0';  // bytes, not a C string
    fanout::testing::write_file(path("config.json"), bytes);
    EXPECT_EQ(read_text_file(path("config.json")), bytes);
    fanout::testing::write_file(path("empty.json"), "");
    EXPECT_EQ(read_text_file(path("empty.json")), "");
    fs::create_symlink(path("config.json"), path("link.json"));
    EXPECT_EQ(read_text_file(path("link.json")), bytes) << "symlinks are followed";
}

TEST_F(ReadTextFileTest, MissingFile) {
    const std::string msg = error_of([&] { read_text_file(path("absent.json")); });
    EXPECT_THAT(msg, HasSubstr("cannot read " + path("absent.json")));
}

TEST_F(ReadTextFileTest, FifoIsRefusedWithoutBlocking) {
    fanout::testing::make_fifo(path("tokenizer.json"));
    const std::string msg = fanout::testing::error_of_without_blocking([&] { read_text_file(path("tokenizer.json")); },
                                                                       path("tokenizer.json"));
    EXPECT_THAT(msg, HasSubstr(path("tokenizer.json") + " is not a regular file (a FIFO)"));
}

TEST_F(ReadTextFileTest, FolderAndDeviceAreRefused) {
    fs::create_directories(path("config.json"));
    EXPECT_THAT(error_of([&] { read_text_file(path("config.json")); }),
                HasSubstr(path("config.json") + " is not a regular file (a folder)"));
    // /dev/zero would read forever: refused from its stat alone, like /dev/null here.
    fs::create_symlink("/dev/null", path("null.json"));
    EXPECT_THAT(error_of([&] { read_text_file(path("null.json")); }),
                HasSubstr(path("null.json") + " is not a regular file (a character device)"));
}

// parse_msgpack_bounded: a peer's MessagePack decoded like the JSON it carries, and a message nested
// past the bound refused by name before nlohmann's recursive reader can overflow the stack.
TEST(ParseMsgpackBounded, DecodesWhatItCarries) {
    const nlohmann::json j = {{"step", 7}, {"requests", {{{"id", 1}, {"prompt", {1, 2, 3}}}}}, {"stop", true}};
    EXPECT_EQ(parse_msgpack_bounded(nlohmann::json::to_msgpack(j), "a step message"), j);
}

TEST(ParseMsgpackBounded, DeepNestingIsAnErrorNotACrash) {
    // 200,000 one-element arrays (fixarray 0x91) around a nil: a 200 KB message whose recursive
    // decode would overflow the stack.
    std::vector<uint8_t> deep(200000, 0x91);
    deep.push_back(0xc0);
    const std::string msg = error_of([&] { parse_msgpack_bounded(deep, "rank 1's step report"); });
    EXPECT_THAT(msg, HasSubstr("rank 1's step report: a message nested deeper than 64 levels"));
    std::vector<uint8_t> ok(64, 0x91);  // 64 levels fit
    ok.push_back(0xc0);
    EXPECT_NO_THROW(parse_msgpack_bounded(ok, "ok"));
}

TEST(ParseMsgpackBounded, MalformedIsAnErrorNamingTheMessage) {
    const std::vector<uint8_t> truncated = {0x82, 0xa1, 'a'};  // a map of 2 that ends after its first key
    const std::string msg = error_of([&] { parse_msgpack_bounded(truncated, "rank 0's step message"); });
    EXPECT_THAT(msg, HasSubstr("rank 0's step message: malformed message (3 bytes)"));
}

}  // namespace
}  // namespace fanout::io
