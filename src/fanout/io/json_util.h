// Helpers for validating JSON inputs (safetensors headers, config.json) and opening input files.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "fanout/core/error.h"

namespace fanout::io {

// A short description of a JSON value for an error message: scalars as written, arrays and
// objects by kind and size. Never recurses, so a value nested 100k deep cannot overflow the stack.
inline std::string describe_json(const nlohmann::json& v) {
    // Values of a few nodes are shown as written; walking them is bounded by the node count.
    constexpr size_t kMaxNodes = 32;
    std::vector<const nlohmann::json*> stack = {&v};
    size_t nodes = 0;
    while (!stack.empty() && nodes <= kMaxNodes) {
        const nlohmann::json* n = stack.back();
        stack.pop_back();
        ++nodes;
        if (n->is_structured())
            for (const auto& child : *n) {
                if (stack.size() + nodes > kMaxNodes) break;
                stack.push_back(&child);
            }
    }
    if (nodes > kMaxNodes || !stack.empty()) {
        if (v.is_array()) return "an array of " + std::to_string(v.size()) + " elements";
        return "an object of " + std::to_string(v.size()) + " fields";
    }
    std::string s = v.dump();
    if (s.size() > 80) s = s.substr(0, 77) + "...";
    return s;
}

// An optional boolean field of object j: `fallback` when absent or null, an Error naming `where`
// and the key when it holds another type.
inline bool optional_bool(const nlohmann::json& j, const char* key, bool fallback, const std::string& where) {
    if (!j.is_object() || !j.contains(key) || j.at(key).is_null()) return fallback;
    const nlohmann::json& v = j.at(key);
    FANOUT_CHECK(v.is_boolean(), "{}: field '{}' must be true or false, found {}", where, key, describe_json(v));
    return v.get<bool>();
}

// Parses JSON text; malformed text is an Error "<label>: not valid JSON: <why>".
inline nlohmann::json parse_json(std::string_view text, const std::string& label) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
        FANOUT_FAIL("{}: not valid JSON: {}", label, e.what());
    }
}

// Parses untrusted JSON text with bounds, before anything walks it: nesting deeper than max_depth
// is refused during the parse (so no recursive walk — dump, a renderer — can overflow the stack
// later), and so is a raw NUL byte (nlohmann's parser stops at one and would ignore the rest).
// Errors: "<label>: ..." naming the problem (no prefix when label is empty).
inline nlohmann::json parse_json_bounded(std::string_view text, const std::string& label, int max_depth = 64) {
    const std::string where = label.empty() ? "" : label + ": ";
    const size_t nul = text.find('\0');
    FANOUT_CHECK(nul == std::string_view::npos, "{}not valid JSON: a NUL byte at offset {}", where, nul);
    struct TooDeep {};
    try {
        return nlohmann::json::parse(text, [max_depth](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
            if (depth >= max_depth) throw TooDeep{};  // depth counts from 0: max_depth containers fit
            return true;
        });
    } catch (const TooDeep&) {
        FANOUT_FAIL("{}JSON nested deeper than {} levels", where, max_depth);
    } catch (const nlohmann::json::exception& e) {
        FANOUT_FAIL("{}not valid JSON: {}", where, e.what());
    }
}

// Parses untrusted MessagePack (a peer's message) with the same nesting bound as
// parse_json_bounded: nlohmann's reader recurses once per level, so a first pass that only counts
// depth stops a deeply nested message before it can overflow the stack. Errors: "<label>: ..."
// naming the problem.
inline nlohmann::json parse_msgpack_bounded(const std::vector<uint8_t>& bytes, const std::string& label,
                                            int max_depth = 64) {
    struct Depth {  // a SAX handler that builds nothing: it stops (returns false) past max_depth
        int max, depth = 0;
        bool too_deep = false;
        bool open() {
            too_deep = ++depth > max;
            return !too_deep;
        }
        bool close() { return --depth, true; }
        bool null() { return true; }
        bool boolean(bool) { return true; }
        bool number_integer(nlohmann::json::number_integer_t) { return true; }
        bool number_unsigned(nlohmann::json::number_unsigned_t) { return true; }
        bool number_float(nlohmann::json::number_float_t, const std::string&) { return true; }
        bool string(std::string&) { return true; }
        bool binary(nlohmann::json::binary_t&) { return true; }
        bool start_object(std::size_t) { return open(); }
        bool key(std::string&) { return true; }
        bool end_object() { return close(); }
        bool start_array(std::size_t) { return open(); }
        bool end_array() { return close(); }
        bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) { return false; }
    } depth{max_depth};
    nlohmann::json::sax_parse(bytes, &depth, nlohmann::json::input_format_t::msgpack);
    FANOUT_CHECK(!depth.too_deep, "{}: a message nested deeper than {} levels ({} bytes)", label, max_depth,
                 bytes.size());
    try {
        return nlohmann::json::from_msgpack(bytes);
    } catch (const nlohmann::json::exception& e) {
        FANOUT_FAIL("{}: malformed message ({} bytes): {}", label, bytes.size(), e.what());
    }
}

// What a file that is not a regular one is, for an error message.
inline const char* file_kind(mode_t mode) {
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

// Opens an input file read-only and returns its descriptor; `verb` words the Error when it cannot
// ("cannot <verb> <path>: <why>"). The path is stat()ed first, symlinks followed, and anything but
// a regular file is an Error "<path> is not a regular file (a FIFO)": opening a FIFO blocks until
// some writer comes, and a device or a folder reads forever or not at all. NOTE: O_NONBLOCK and the
// fstat() after the open close the race where the path is swapped for a FIFO between the two.
inline int open_regular_file(const std::string& path, std::string_view verb = "open") {
    struct stat st {};
    FANOUT_CHECK(::stat(path.c_str(), &st) == 0, "cannot {} {}: {}", verb, path, std::strerror(errno));
    FANOUT_CHECK(S_ISREG(st.st_mode), "{} is not a regular file ({})", path, file_kind(st.st_mode));
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    FANOUT_CHECK(fd >= 0, "cannot {} {}: {}", verb, path, std::strerror(errno));
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        ::close(fd);
        FANOUT_FAIL("{} is not a regular file ({})", path, file_kind(st.st_mode));
    }
    return fd;
}

// A whole file as bytes; an unreadable one, or one that is not a regular file, is an Error naming it.
inline std::string read_text_file(const std::string& path) {
    const int fd = open_regular_file(path, "read");
    std::string text;
    char buf[1 << 16];
    for (;;) {
        const ssize_t n = ::read(fd, buf, sizeof(buf));
        if (n > 0) {
            text.append(buf, static_cast<size_t>(n));
        } else if (n == 0) {
            break;
        } else if (errno != EINTR) {
            const int err = errno;
            ::close(fd);
            FANOUT_FAIL("cannot read {}: {}", path, std::strerror(err));
        }
    }
    ::close(fd);
    return text;
}

}  // namespace fanout::io
