// FANOUT_CUBLAS_CHECK: wraps a cuBLASLt call; a failure throws fanout::Error naming the statement,
// the status and cuBLASLt's message. fmt-free.
#pragma once

#include <cublasLt.h>

#include "fanout/core/api_error.h"

#define FANOUT_CUBLAS_CHECK(stmt)                                                                          \
    do {                                                                                                   \
        const cublasStatus_t fanout_st_ = (stmt);                                                          \
        if (fanout_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                                              \
            ::fanout::throw_api_error(__FILE__, __LINE__, "cuBLASLt", #stmt, static_cast<int>(fanout_st_), \
                                      cublasLtGetStatusString(fanout_st_));                                \
    } while (0)
