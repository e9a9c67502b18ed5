// Kernels for pdl_cuda_test.cc that make a missing programmatic wait visible (pdl_probe.cu).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

namespace fanout::testing {

// Copies `bytes` from src to dst after spinning about `spin_us` microseconds; it calls pdl_enter()
// first, so a kernel launched after it with launch_pdl may start at once and run while it spins.
// A dependent that reads dst before its own pdl_enter() sees dst's old bytes; one that writes src
// before it changes what this kernel copies.
void launch_late_copy(const void* src, void* dst, size_t bytes, int spin_us, cudaStream_t stream);

// The control: launched with launch_pdl but without pdl_enter(), it copies src to dst at once —
// behind a late copy into src it copies src's old bytes.
void launch_racy_copy(const void* src, void* dst, size_t bytes, cudaStream_t stream);

// Launches both kernels once with nothing to do and waits: under lazy module loading a kernel's
// first launch loads it, and that launch did not overlap the kernel before it (the first of three
// repeats of TheProbeStartsItsDependentsEarly failed until the tests warmed up).
void warm_up_probe();

}  // namespace fanout::testing
