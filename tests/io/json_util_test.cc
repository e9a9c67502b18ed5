// Tests of the input-file helpers in io/json_util.h: read_text_file reads a regular file whole, and
// refuses a FIFO (without blocking on it), a folder and a device with an Error naming the path.
#include "fanout/io/json_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

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

}  // namespace
}  // namespace fanout::io
