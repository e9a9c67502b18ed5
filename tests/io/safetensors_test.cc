// Tests of the safetensors reader and writer: a writer -> reader round trip over several dtypes,
// an empty tensor, a scalar and metadata; and hand-written bad files, each of which must be a
// fanout::Error naming the file and the defect (never a crash or a read out of bounds).
#include "fanout/io/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "io_test_util.h"
#include "test_util.h"

namespace fanout::io {
namespace {

namespace fs = std::filesystem;
using ::fanout::testing::error_of;
using ::fanout::testing::le64;
using ::fanout::testing::safetensors_bytes;
using ::fanout::testing::write_file;
using ::testing::HasSubstr;

class SafetensorsTest : public fanout::testing::TempDirTest {
  protected:
    // Writes `bytes` to a file and returns the message of the Error that opening it raises; also
    // checks that the message names the file.
    std::string open_error(const std::string& bytes, const std::string& name = "bad.safetensors") {
        const std::string p = path(name);
        write_file(p, bytes);
        const std::string msg = error_of([&] { SafetensorsFile::open(p); });
        EXPECT_THAT(msg, HasSubstr(p)) << "the error must name the file";
        return msg;
    }
};

template <typename T>
std::vector<uint8_t> as_bytes(const std::vector<T>& v) {
    std::vector<uint8_t> out(v.size() * sizeof(T));
    std::memcpy(out.data(), v.data(), out.size());
    return out;
}

// ---------------------------------------------------------------------------------------------
// Round trip

TEST_F(SafetensorsTest, WriterReaderRoundTrip) {
    const auto f32 = fanout::testing::random_floats(6, 1);
    std::vector<uint16_t> bf16;
    for (float v : fanout::testing::random_floats(4, 2)) bf16.push_back(f32_to_bf16(v));
    std::vector<uint8_t> fp8;
    for (float v : fanout::testing::random_floats(15, 3, 400.0f)) fp8.push_back(f32_to_fp8e4m3(v));
    const std::vector<int64_t> i64 = {-5, 1LL << 40};
    const std::vector<double> f64 = {3.25};
    const std::vector<uint8_t> u8 = {1, 2, 255};
    const std::vector<uint8_t> flags = {1};

    struct Expected {
        TensorSpec spec;
        std::vector<uint8_t> bytes;
    };
    const std::vector<Expected> tensors = {
        {{"a.f32", DType::kF32, {2, 3}}, as_bytes(f32)},
        {{"b.bf16", DType::kBF16, {4}}, as_bytes(bf16)},
        {{"c.fp8", DType::kFP8E4M3, {3, 5}}, fp8},
        {{"d.empty", DType::kF32, {0, 7}}, {}},
        {{"e.i64", DType::kI64, {2}}, as_bytes(i64)},
        {{"f.scalar", DType::kF64, {}}, as_bytes(f64)},
        {{"g.u8", DType::kU8, {3}}, u8},
        {{"h.bool", DType::kBool, {1, 1}}, flags},
    };
    std::vector<TensorSpec> specs;
    for (const auto& t : tensors) specs.push_back(t.spec);
    const std::string p = path("model.safetensors");
    {
        SafetensorsWriter w(p, specs, {{"format", "pt"}, {"note", "round trip"}});
        for (const auto& t : tensors) {
            if (t.bytes.empty()) continue;  // a zero-byte tensor needs no write
            // Two calls for one tensor, to check partial writes add up.
            const size_t half = t.bytes.size() / 2;
            w.write(t.spec.name, t.bytes.data(), half);
            w.write(t.spec.name, t.bytes.data() + half, t.bytes.size() - half);
        }
        w.finish();
    }

    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.path(), p);
    EXPECT_EQ(f.metadata().size(), 2u);
    EXPECT_EQ(f.metadata().at("format"), "pt");
    EXPECT_EQ(f.metadata().at("note"), "round trip");
    std::vector<std::string> expected_names;
    for (const auto& t : tensors) expected_names.push_back(t.spec.name);
    EXPECT_EQ(f.names(), expected_names);  // sorted; the specs above are already in order
    for (const auto& t : tensors) {
        SCOPED_TRACE(t.spec.name);
        ASSERT_TRUE(f.has(t.spec.name));
        const TensorEntry& e = f.entry(t.spec.name);
        EXPECT_EQ(e.name, t.spec.name);
        EXPECT_EQ(e.dtype, t.spec.dtype);
        EXPECT_EQ(e.shape, t.spec.shape);
        EXPECT_EQ(e.nbytes, t.bytes.size());
        const Tensor view = f.tensor(t.spec.name);
        EXPECT_EQ(view.dtype(), t.spec.dtype);
        EXPECT_EQ(view.shape(), t.spec.shape);
        EXPECT_EQ(view.nbytes(), t.bytes.size());
        if (!t.bytes.empty()) {
            EXPECT_EQ(std::memcmp(view.data(), t.bytes.data(), t.bytes.size()), 0);
        }
    }
    EXPECT_FALSE(f.has("missing"));
}

TEST_F(SafetensorsTest, DataStartsEightByteAligned) {
    const std::string p = path("aligned.safetensors");
    SafetensorsWriter w(p, {{"x", DType::kF32, {1}}});
    const float one = 1.0f;
    w.write("x", &one, sizeof(one));
    w.finish();
    const std::string bytes = fanout::testing::read_file(p);
    uint64_t header_len = 0;
    for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
    EXPECT_EQ(header_len % 8, 0u);
    EXPECT_EQ(bytes.size(), 8 + header_len + 4);
    EXPECT_EQ(SafetensorsFile::open(p).entry("x").offset, 8 + header_len);
}

TEST_F(SafetensorsTest, ViewKeepsTheMappingAlive) {
    const std::string p = path("alive.safetensors");
    const std::vector<float> v = {1.0f, 2.0f, 3.0f};
    SafetensorsWriter w(p, {{"v", DType::kF32, {3}}});
    w.write("v", v.data(), 12);
    w.finish();
    Tensor t;
    {
        const SafetensorsFile f = SafetensorsFile::open(p);
        t = f.tensor("v");
    }
    EXPECT_EQ(t.data_as<float>()[2], 3.0f);
}

TEST_F(SafetensorsTest, EmptyHeaderObjectHasNoTensors) {
    const std::string p = path("empty.safetensors");
    write_file(p, safetensors_bytes("{}"));
    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_TRUE(f.names().empty());
    EXPECT_TRUE(f.metadata().empty());
}

TEST_F(SafetensorsTest, HandWrittenFileWithPaddedHeader) {
    // What other writers produce: header padded with spaces, metadata with non-string values
    // (ignored), data_offsets not starting at 0.
    const std::string header =
        R"({"__metadata__":{"format":"pt","n":3},"w":{"dtype":"I16","shape":[2],"data_offsets":[4,8]}}   )";
    const std::string data = std::string("\x00\x00\x00\x00\x01\x00\xff\xff", 8);
    const std::string p = path("hand.safetensors");
    write_file(p, safetensors_bytes(header, data));
    const SafetensorsFile f = SafetensorsFile::open(p);
    EXPECT_EQ(f.metadata().size(), 1u);
    const Tensor w = f.tensor("w");
    EXPECT_EQ(w.data_as<int16_t>()[0], 1);
    EXPECT_EQ(w.data_as<int16_t>()[1], -1);
}

TEST_F(SafetensorsTest, ParseInMemoryImage) {
    const std::string bytes = safetensors_bytes(R"({"x":{"dtype":"U8","shape":[3],"data_offsets":[0,3]}})", "abc");
    const SafetensorsFile f =
        SafetensorsFile::parse(nullptr, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "in-memory");
    EXPECT_EQ(f.path(), "in-memory");
    EXPECT_EQ(std::string(f.tensor("x").data_as<char>(), 3), "abc");
    const std::string msg = error_of([&] { f.entry("nope"); });
    EXPECT_THAT(msg, HasSubstr("in-memory"));
    EXPECT_THAT(msg, HasSubstr("'nope'"));
}

// ---------------------------------------------------------------------------------------------
// Writer misuse

TEST_F(SafetensorsTest, WriterRejectsMisuse) {
    const std::string p = path("w.safetensors");
    const std::vector<uint8_t> bytes(64, 7);
    {
        SafetensorsWriter w(p, {{"a", DType::kU8, {4}}, {"b", DType::kU8, {2}}});
        EXPECT_THAT(error_of([&] { w.write("c", bytes.data(), 2); }),
                    HasSubstr("'c' is not one of the file's tensors"));
        EXPECT_THAT(error_of([&] { w.write("a", bytes.data(), 5); }), HasSubstr("takes 4 bytes"));
        w.write("a", bytes.data(), 4);
        EXPECT_THAT(error_of([&] { w.finish(); }), HasSubstr("tensor 'b' got 0 of its 2 bytes"));
    }
    {
        SafetensorsWriter w(p, {{"a", DType::kU8, {1}}});
        w.write("a", bytes.data(), 1);
        EXPECT_THAT(error_of([&] { w.write("a", bytes.data(), 1); }), HasSubstr("takes 1 bytes, got 2"));
        w.finish();
        EXPECT_THAT(error_of([&] { w.write("a", bytes.data(), 1); }), HasSubstr("after finish()"));
    }
    {
        // Tensors may arrive in any order; the layout still puts wider dtypes first (aligned).
        SafetensorsWriter w(p, {{"u", DType::kU8, {3}}, {"f", DType::kF32, {2}}, {"e", DType::kF32, {0}}});
        const float f[2] = {1.5f, -2.0f};
        w.write("u", bytes.data(), 3);
        w.write("f", f, sizeof(f));
        w.finish();
        const auto r = SafetensorsFile::open(p);
        EXPECT_EQ(r.entry("f").offset % 4, 0u);
        EXPECT_EQ(r.tensor("f").data_as<float>()[1], -2.0f);
        EXPECT_EQ(r.entry("e").nbytes, 0u);
    }
    EXPECT_THAT(error_of([&] {
                    SafetensorsWriter(p, {{"a", DType::kU8, {1}}, {"a", DType::kU8, {1}}});
                }),
                HasSubstr("'a' listed twice"));
    EXPECT_THAT(error_of([&] { SafetensorsWriter(path("no/such/dir/x.safetensors"), {}); }),
                HasSubstr("cannot create"));
}

// ---------------------------------------------------------------------------------------------
// Bad files: each names the file and the defect.

TEST_F(SafetensorsTest, MissingFile) {
    const std::string p = path("absent.safetensors");
    const std::string msg = error_of([&] { SafetensorsFile::open(p); });
    EXPECT_THAT(msg, HasSubstr("cannot open"));
    EXPECT_THAT(msg, HasSubstr(p));
}

TEST_F(SafetensorsTest, DirectoryIsNotAFile) {
    const std::string msg = error_of([&] { SafetensorsFile::open(dir_); });
    EXPECT_THAT(msg, HasSubstr(dir_));
    EXPECT_THAT(msg, HasSubstr("not a regular file"));
}

TEST_F(SafetensorsTest, FifoIsRefusedWithoutBlocking) {
    const std::string p = path("model.safetensors");
    fanout::testing::make_fifo(p);
    const std::string msg = fanout::testing::error_of_without_blocking([&] { SafetensorsFile::open(p); }, p);
    EXPECT_THAT(msg, HasSubstr(p + " is not a regular file (a FIFO)"));
}

TEST_F(SafetensorsTest, DeviceIsNotAFile) {
    const std::string p = path("model.safetensors");
    fs::create_symlink("/dev/null", p);
    EXPECT_THAT(error_of([&] { SafetensorsFile::open(p); }),
                HasSubstr(p + " is not a regular file (a character device)"));
}

TEST_F(SafetensorsTest, FileShorterThanEightBytes) {
    EXPECT_THAT(open_error(""), HasSubstr("need at least 8"));
    const std::string msg = open_error(std::string("\x02\x00\x00\x00\x00", 5));
    EXPECT_THAT(msg, HasSubstr("5 bytes"));
    EXPECT_THAT(msg, HasSubstr("need at least 8"));
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
    const std::string msg = open_error(le64(1000) + "{}");
    EXPECT_THAT(msg, HasSubstr("header length 1000"));
    EXPECT_THAT(msg, HasSubstr("only 2 bytes follow"));
    // The largest possible length must not overflow the bounds check.
    EXPECT_THAT(open_error(le64(~uint64_t{0}) + "{}"), HasSubstr("header length"));
}

TEST_F(SafetensorsTest, HeaderLengthOverLimit) {
    const uint64_t too_big = (100u << 20) + 1;
    const std::string msg = open_error(le64(too_big) + "{}");
    EXPECT_THAT(msg, HasSubstr("header length " + std::to_string(too_big)));
    EXPECT_THAT(msg, HasSubstr("exceeds the 104857600-byte limit"));
}

TEST_F(SafetensorsTest, HeaderNotJson) {
    EXPECT_THAT(open_error(safetensors_bytes("{not json")), HasSubstr("header is not valid JSON"));
    EXPECT_THAT(open_error(safetensors_bytes("")), HasSubstr("header is not valid JSON"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"a": 1} trailing)")), HasSubstr("header is not valid JSON"));
    EXPECT_THAT(open_error(safetensors_bytes(std::string("{\"\xff\": 1}", 8))), HasSubstr("header is not valid JSON"));
}

TEST_F(SafetensorsTest, HeaderNotAnObject) {
    EXPECT_THAT(open_error(safetensors_bytes("[1, 2]")), HasSubstr("header must be a JSON object, found array"));
    EXPECT_THAT(open_error(safetensors_bytes("42")), HasSubstr("found number"));
    EXPECT_THAT(open_error(safetensors_bytes("null")), HasSubstr("found null"));
}

TEST_F(SafetensorsTest, EntryOrMetadataNotAnObject) {
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w": [1, 2]})")), HasSubstr("tensor 'w': entry must be an object"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"__metadata__": "x"})")), HasSubstr("__metadata__ must be an object"));
}

TEST_F(SafetensorsTest, EntryMissingDtype) {
    const std::string msg = open_error(safetensors_bytes(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("'dtype'"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w":{"dtype":5,"shape":[1],"data_offsets":[0,4]}})", "abcd")),
                HasSubstr("'dtype'"));
}

TEST_F(SafetensorsTest, EntryMissingShape) {
    const std::string msg = open_error(safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("'shape'"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":4,"data_offsets":[0,4]}})", "abcd")),
                HasSubstr("'shape'"));
}

TEST_F(SafetensorsTest, EntryMissingDataOffsets) {
    const std::string msg = open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("'data_offsets'"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4,8]}})", "abcd")),
                HasSubstr("'data_offsets' must be an array of two integers"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,"4"]}})", "abcd")),
                HasSubstr("data_offsets must be non-negative integers"));
    EXPECT_THAT(open_error(safetensors_bytes(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", "abcd")),
                HasSubstr("data_offsets must be non-negative integers, found [-4,0]"));
}

TEST_F(SafetensorsTest, UnknownDtype) {
    const std::string msg =
        open_error(safetensors_bytes(R"({"w":{"dtype":"F8_E5M2","shape":[4],"data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("unknown dtype 'F8_E5M2'"));
}

TEST_F(SafetensorsTest, NegativeOrNonIntegerShape) {
    std::string msg =
        open_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2,-2],"data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("shape entries must be non-negative integers, found -2"));
    msg = open_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2.5],"data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("found 2.5"));
    msg = open_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[[2]],"data_offsets":[0,4]}})", "abcd"));
    EXPECT_THAT(msg, HasSubstr("found [2]"));
}

TEST_F(SafetensorsTest, ShapeTooLarge) {
    // The element count must not wrap around 2^64 and then match a small byte count.
    const std::string msg =
        open_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,1],"data_offsets":[0,0]}})"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("too large"));
}

TEST_F(SafetensorsTest, DataOffsetsPastTheEndOfATruncatedFile) {
    const std::string p = path("truncated.safetensors");
    const std::vector<float> v(16, 0.5f);
    {
        SafetensorsWriter w(p, {{"first", DType::kF32, {8}}, {"second", DType::kF32, {8}}});
        w.write("first", v.data(), 32);
        w.write("second", v.data(), 32);
        w.finish();
    }
    ASSERT_NO_THROW(SafetensorsFile::open(p));
    fs::resize_file(p, fs::file_size(p) - 5);
    const std::string msg = error_of([&] { SafetensorsFile::open(p); });
    EXPECT_THAT(msg, HasSubstr(p));
    EXPECT_THAT(msg, HasSubstr("tensor 'second'"));
    EXPECT_THAT(msg, HasSubstr("data_offsets [32, 64] out of range for 59 data bytes"));
    EXPECT_THAT(msg, HasSubstr("truncated"));
}

TEST_F(SafetensorsTest, ByteCountDoesNotMatchDtypeAndShape) {
    const std::string msg = open_error(
        safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})", std::string(16, 'x')));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("12 bytes in data_offsets but dtype F32 and shape [2, 2] need 16"));
}

TEST_F(SafetensorsTest, BeginAfterEnd) {
    const std::string msg =
        open_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[4],"data_offsets":[8,4]}})", std::string(8, 'x')));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("data_offsets [8, 4]"));
}

// The format's rule: no two tensors share bytes (an overlap would alias two weights). Empty tensors
// take no bytes, so they may sit anywhere.
TEST_F(SafetensorsTest, OverlappingDataOffsets) {
    const std::string msg = open_error(safetensors_bytes(
        R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
        std::string(24, 'x')));
    EXPECT_THAT(msg, HasSubstr("tensors 'a' and 'b' overlap: data_offsets [0, 16] and [8, 24]"));
    const std::string same = open_error(safetensors_bytes(
        R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"b":{"dtype":"U8","shape":[8],"data_offsets":[0,8]}})",
        std::string(8, 'x')));
    EXPECT_THAT(same, HasSubstr("overlap"));
    const std::string p = path("ok.safetensors");
    write_file(
        p,
        safetensors_bytes(
            R"({"a":{"dtype":"U8","shape":[8],"data_offsets":[0,8]},"e":{"dtype":"U8","shape":[0],"data_offsets":[4,4]},"b":{"dtype":"U8","shape":[8],"data_offsets":[8,16]}})",
            std::string(16, 'x')));
    EXPECT_EQ(SafetensorsFile::open(p).entry("b").nbytes, 8u);
}

TEST_F(SafetensorsTest, OffsetsNearUint64MaxDoNotWrap) {
    const std::string msg = open_error(
        safetensors_bytes(R"({"w":{"dtype":"U8","shape":[2],"data_offsets":[18446744073709551615,1]}})", "ab"));
    EXPECT_THAT(msg, HasSubstr("tensor 'w'"));
    EXPECT_THAT(msg, HasSubstr("data_offsets"));
}

// Regression (was a bug): the shape / data_offsets error messages print the offending JSON with
// json::dump(), which recurses once per nesting level; a shape entry nested ~100k deep (a 200 KB
// header, far under the 100 MB limit) overflows the stack (SIGSEGV) instead of raising an Error.
// Enable once the value is printed with a depth or length bound.
TEST_F(SafetensorsTest, DeeplyNestedShapeIsAnErrorNotACrash) {
    constexpr int kDepth = 200000;
    const std::string header = R"({"w":{"dtype":"U8","shape":[)" + std::string(kDepth, '[') + std::string(kDepth, ']') +
                               R"(],"data_offsets":[0,0]}})";
    EXPECT_THAT(open_error(safetensors_bytes(header)), HasSubstr("tensor 'w'"));
}

}  // namespace
}  // namespace fanout::io
