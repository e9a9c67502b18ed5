// FANOUT_NCCL_CHECK: wraps an NCCL host call; a failure throws fanout::Error naming the statement
// and NCCL's message (the message is formatted in error.cc: fmt does not build under nvcc).
#pragma once

#include <nccl.h>

#include "fanout/core/api_error.h"

#define FANOUT_NCCL_CHECK(stmt)                                                                              \
    do {                                                                                                     \
        const ncclResult_t fanout_nccl_err_ = (stmt);                                                        \
        if (fanout_nccl_err_ != ncclSuccess) [[unlikely]]                                                    \
            ::fanout::throw_api_error(__FILE__, __LINE__, "NCCL", #stmt, static_cast<int>(fanout_nccl_err_), \
                                      ncclGetErrorString(fanout_nccl_err_));                                 \
    } while (0)
