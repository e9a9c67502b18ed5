// FANOUT_CUDA_CHECK: wraps a CUDA runtime call; a failure throws fanout::Error naming the
// statement and CUDA's message, and clears the runtime's last error first, so that a failure the
// caller recovers from (out of memory at a graph's instantiation, say) is reported once, by the
// call that failed, and not again by the next launch's FANOUT_CUDA_CHECK_LAUNCH (cudaGetLastError).
// A sticky error (a fault in a kernel) stays: every later call reports it. Include only from .cu files and CUDA-aware
// tests.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "fanout/core/api_error.h"

// NOTE: the message is formatted in error.cc, not here: fmt's compile-time format checks do not
// build under nvcc.
#define FANOUT_CUDA_CHECK(stmt)                                                                         \
    do {                                                                                                \
        const cudaError_t fanout_err_ = (stmt);                                                         \
        if (fanout_err_ != cudaSuccess) [[unlikely]] {                                                  \
            (void)cudaGetLastError(); /* reported here: not again by the next launch check */           \
            ::fanout::throw_api_error(__FILE__, __LINE__, "CUDA", #stmt, static_cast<int>(fanout_err_), \
                                      cudaGetErrorString(fanout_err_));                                 \
        }                                                                                               \
    } while (0)

// After a kernel launch: launch-configuration errors surface here.
#define FANOUT_CUDA_CHECK_LAUNCH(name) FANOUT_CUDA_CHECK(cudaGetLastError())

// An argument check in a CUDA translation unit: throws fanout::Error with the message (a
// std::string or C string) when the condition is false.
#define FANOUT_DEVICE_REQUIRE(cond, message)                                           \
    do {                                                                               \
        if (!(cond)) [[unlikely]]                                                      \
            ::fanout::throw_message(__FILE__, __LINE__, std::string(message).c_str()); \
    } while (0)
