// Helpers for the io tests: raw file bytes, hand-made safetensors images, FIFOs, and catching the
// message of a fanout::Error.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <fstream>
#include <future>
#include <string>

#include "fanout/core/error.h"
#include "test_util.h"

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

// Makes a FIFO (named pipe) at `path`, with no writer: opening it for reading blocks.
inline void make_fifo(const std::string& path) { ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path; }

// error_of(fn) where fn must refuse the FIFO at `fifo` without blocking on it: should fn still be
// running after 10 s (an open() waiting for a writer), the test fails, and the FIFO is opened for
// writing to release it.
template <typename Fn>
std::string error_of_without_blocking(Fn&& fn, const std::string& fifo) {
    auto result = std::async(std::launch::async, [&] { return error_of(fn); });
    if (result.wait_for(std::chrono::seconds(10)) == std::future_status::timeout) {
        ADD_FAILURE() << "blocked on the FIFO " << fifo;
        const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
        if (fd >= 0) ::close(fd);
    }
    return result.get();
}

}  // namespace fanout::testing
