// fanout::Error and the checks that raise it.
//
// A broken precondition (bad shape, bad checkpoint, bad config value, bad token id) throws
// fanout::Error with the file and line of the check and a message that names the thing that is
// wrong with the expected and found values. Library code never calls exit() or abort().
#pragma once

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>
#include <string>

#include "fanout/core/api_error.h"

namespace fanout {

class Error : public std::runtime_error {
public:
    explicit Error(const std::string& what) : std::runtime_error(what) {}
};

[[noreturn]] void throw_error(const char* file, int line, const std::string& message);

}  // namespace fanout

// FANOUT_CHECK(hidden % 128 == 0, "hidden={} must be a multiple of 128", hidden);
#define FANOUT_CHECK(cond, ...)                                                  \
    do {                                                                         \
        if (!(cond)) [[unlikely]] {                                              \
            ::fanout::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__)); \
        }                                                                        \
    } while (0)

#define FANOUT_FAIL(...) ::fanout::throw_error(__FILE__, __LINE__, ::fmt::format(__VA_ARGS__))
