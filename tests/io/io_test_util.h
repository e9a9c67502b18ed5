// Helpers for the io tests: raw file bytes, hand-made safetensors images, and catching the
// message of a fanout::Error.
#pragma once

#include "test_util.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "fanout/core/error.h"

namespace fanout::testing {

inline void write_file(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << "cannot write " << path;
}

inline std::string read_file(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// The 8-byte little-endian header length of a safetensors file.
inline std::string le64(uint64_t v) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
    return s;
}

// A safetensors image: length prefix, the header text as given, then the data bytes.
inline std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
    return le64(header.size()) + header + data;
}

}  // namespace fanout::testing
