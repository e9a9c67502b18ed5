// throw_api_error: the fmt-free entry to fanout::Error for failed library calls, so CUDA
// translation units (where fmt's headers do not compile under nvcc) can raise errors too.
#pragma once

namespace fanout {

// A failed library call (CUDA, NCCL, ...): throws fanout::Error naming the library, the
// statement, the code and the library's message.
[[noreturn]] void throw_api_error(const char* file, int line, const char* library, const char* statement, int code,
                                  const char* message);

// A bad argument found in a CUDA translation unit: throws fanout::Error with `message`.
[[noreturn]] void throw_message(const char* file, int line, const char* message);

}  // namespace fanout
