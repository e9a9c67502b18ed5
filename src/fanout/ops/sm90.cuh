// Hopper (sm_90a) building blocks for the tensor-core kernels: mbarriers, TMA tile loads,
// wgmma shared-memory descriptors, the FP8 wgmma and the bf16 ones, as thin inline-PTX wrappers.
// Include only from .cu files compiled for sm_90a.
//
// Shared-memory tiles are K-major rows of 128 bytes (128 e4m3 values = one 128-wide K block) in
// TMA's 128-byte swizzle; each tile starts on a 1024-byte boundary, so a wgmma descriptor can
// step along K inside the swizzle atom by advancing its start address 32 bytes per k32 step.
#pragma once

#include <cuda.h>

#include <cstdint>

namespace fanout::ops::sm90 {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Hides a value's origin from the compiler, so it keeps it in a register instead of rebuilding it
// (rematerializing) inside a hot loop.
__device__ __forceinline__ void opaque(uint32_t& v) { asm volatile("" : "+r"(v)); }
__device__ __forceinline__ void opaque(int& v) { asm volatile("" : "+r"(v)); }

// ---- mbarrier ----
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes the initialised barriers visible to the async proxy (TMA) before first use.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
}
// The barrier as a shared-memory address (hot loops keep these as 32-bit values instead of
// converting a generic pointer each time) or as a pointer.
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) { mbar_arrive(smem_addr(bar)); }
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done = 0;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) { mbar_wait(smem_addr(bar), parity); }

// ---- clusters ----
__device__ __forceinline__ uint32_t cluster_rank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
// All threads of all CTAs of the cluster (release/acquire: shared-memory writes before it are
// visible to the peers after it).
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;" ::: "memory");
}
// Arrives on the mbarrier at `bar`'s offset in CTA `rank` of the cluster.
__device__ __forceinline__ void mbar_arrive_cluster(uint32_t bar, uint32_t rank) {
    uint32_t remote;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(bar), "r"(rank));
    asm volatile("mbarrier.arrive.shared::cluster.b64 _, [%0];" ::"r"(remote) : "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t* bar, uint32_t rank) {
    mbar_arrive_cluster(smem_addr(bar), rank);
}
// The int at `addr`'s offset in CTA `rank`'s shared memory (written before a cluster_sync).
__device__ __forceinline__ int ld_shared_cluster(uint32_t addr, uint32_t rank) {
    uint32_t remote;
    int v;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(addr), "r"(rank));
    asm volatile("ld.shared::cluster.s32 %0, [%1];" : "=r"(v) : "r"(remote) : "memory");
    return v;
}

// ---- TMA: a 2-D box of `tmap` at (inner coordinate c0, row c1) into shared memory, completing on bar ----
__device__ __forceinline__ void tma_load_2d(void* dst, const CUtensorMap* tmap, uint64_t* bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1)
        : "memory");
}
// The same box delivered to the shared memory of every CTA in `cta_mask` of the cluster (same
// offset, completing on each CTA's barrier at `bar`'s offset).
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const CUtensorMap* tmap, uint64_t* bar, int c0, int c1,
                                                      uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
        : "memory");
}
// A 3-D box (c0 innermost) of `tmap` into shared memory, completing on bar.
__device__ __forceinline__ void tma_load_3d(void* dst, const CUtensorMap* tmap, uint64_t* bar, int c0, int c1, int c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::
            "r"(smem_addr(dst)),
        "l"(reinterpret_cast<uint64_t>(tmap)), "r"(smem_addr(bar)), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}
// A 2-D box from shared memory to `tmap` at (c0, c1) (rows/columns past the tensor are not
// written), in the calling thread's bulk group.
__device__ __forceinline__ void tma_store_2d(const CUtensorMap* tmap, const void* src, int c0, int c1) {
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                     reinterpret_cast<uint64_t>(tmap)),
                 "r"(smem_addr(src)), "r"(c0), "r"(c1)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
// The thread's bulk stores but its newest `kPending` groups have finished reading shared memory
// (theirs may be overwritten).
template <int kPending = 0>
__device__ __forceinline__ void bulk_wait_read() {
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(kPending) : "memory");
}
// The thread's bulk stores are complete.
__device__ __forceinline__ void bulk_wait() { asm volatile("cp.async.bulk.wait_group 0;" ::: "memory"); }
// Orders this thread's shared-memory stores before later async-proxy (TMA, wgmma) reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void tma_prefetch_descriptor(const CUtensorMap* tmap) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tmap)) : "memory");
}

// ---- warpgroup register budget (needs a register cap at entry: __launch_bounds__(threads, 1)) ----
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegs));
}

// ---- programmatic dependent launch ----
// Waits until the grids this one depends on have completed and their writes are visible (a no-op
// when the launch carried no programmatic dependency).
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
// Lets the next grid in the stream start launching (its own wait still orders its reads).
__device__ __forceinline__ void grid_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" :::); }

// Named barrier among `threads` threads (ids 1..15; 0 is __syncthreads).
__device__ __forceinline__ void named_barrier(int id, int threads) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// ---- wgmma ----
// Descriptor of a K-major tile of 128-byte rows in 128-byte swizzle: 8-row core groups 1024 bytes
// apart (stride byte offset), leading byte offset unused by this layout.
// In two words: the low one carries the start address (and the unused leading offset), the high
// one only constants (the 1024-byte stride between 8-row groups, 128-byte swizzle), so a loop can
// step the low word by plain 32-bit adds.
__device__ __forceinline__ uint32_t desc_k_major_sw128_lo(uint32_t smem_address) {
    return ((smem_address & 0x3FFFF) >> 4) | (1u << 16);
}
constexpr uint32_t kDescKMajorSw128Hi = (1024 >> 4) | (1u << 30);
__device__ __forceinline__ uint64_t desc_from_lo(uint32_t lo, uint32_t hi = kDescKMajorSw128Hi) {
    return (uint64_t{hi} << 32) | lo;
}
__device__ __forceinline__ uint64_t desc_k_major_sw128(const void* tile) {
    return desc_from_lo(desc_k_major_sw128_lo(smem_addr(tile)));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are still running.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}

// wgmma's accumulator operands. Inline asm wants the "%0, %1, …" lists as literal strings and one
// "+f" output per register, so both are spelled once here, for 16, 32, 64, 96 and 128 registers, and
// every wrapper below is written with them.
// Kept as a table, 16 registers a line (clang-format does not settle on macro continuations).
// clang-format off
#define FANOUT_SM90_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define FANOUT_SM90_R32 FANOUT_SM90_R16 ", " \
    "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FANOUT_SM90_R64 FANOUT_SM90_R32 ", " \
    "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define FANOUT_SM90_R96 FANOUT_SM90_R64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95"
#define FANOUT_SM90_R128 FANOUT_SM90_R64 ", " \
    "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, " \
    "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, " \
    "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, " \
    "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
// d[i], d[i + 1], ... as read-write f32 outputs.
#define FANOUT_SM90_OUT8(d, i) \
    "+f"(d[(i)]), "+f"(d[(i) + 1]), "+f"(d[(i) + 2]), "+f"(d[(i) + 3]), \
    "+f"(d[(i) + 4]), "+f"(d[(i) + 5]), "+f"(d[(i) + 6]), "+f"(d[(i) + 7])
#define FANOUT_SM90_OUT16(d, i) FANOUT_SM90_OUT8(d, i), FANOUT_SM90_OUT8(d, (i) + 8)
#define FANOUT_SM90_OUT32(d, i) FANOUT_SM90_OUT16(d, i), FANOUT_SM90_OUT16(d, (i) + 16)
#define FANOUT_SM90_OUT64(d, i) FANOUT_SM90_OUT32(d, i), FANOUT_SM90_OUT32(d, (i) + 32)
#define FANOUT_SM90_OUT96(d) FANOUT_SM90_OUT64(d, 0), FANOUT_SM90_OUT32(d, 64)
#define FANOUT_SM90_OUT128(d) FANOUT_SM90_OUT64(d, 0), FANOUT_SM90_OUT64(d, 64)
// clang-format on

// d[64, N] (+)= a[64, 32] · b[N, 32]ᵀ, e4m3 operands from shared memory, f32 accumulators in the
// fragment layout of PTX's wgmma (warp w of the group: rows 16w + lane/4 (+8); register 4j + i:
// column 8j + 2·(lane%4) + (i & 1), row +8 when i >= 2). scale_d = 0 overwrites d.
template <int N>
struct Wgmma;

template <>
struct Wgmma<32> {
    static __device__ __forceinline__ void mma(float (&d)[16], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 {" FANOUT_SM90_R16 "}, %16, %17, p, 1, 1;\n}\n"
            : FANOUT_SM90_OUT16(d, 0)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d));
    }
};

template <>
struct Wgmma<64> {
    static __device__ __forceinline__ void mma(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" FANOUT_SM90_R32 "}, %32, %33, p, 1, 1;\n}\n"
            : FANOUT_SM90_OUT32(d, 0)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d));
    }
};

template <>
struct Wgmma<192> {
    static __device__ __forceinline__ void mma(float (&d)[96], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %98, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n192k32.f32.e4m3.e4m3 {" FANOUT_SM90_R96 "}, %96, %97, p, 1, 1;\n}\n"
            : FANOUT_SM90_OUT96(d)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d));
    }
};

template <>
struct Wgmma<128> {
    static __device__ __forceinline__ void mma(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" FANOUT_SM90_R64 "}, %64, %65, p, 1, 1;\n}\n"
            : FANOUT_SM90_OUT64(d, 0)
            : "l"(desc_a), "l"(desc_b), "r"(scale_d));
    }
};

// Keeps the compiler from moving accumulator reads/writes across an in-flight wgmma.
template <int R>
__device__ __forceinline__ void fence_regs(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// Multiplies an accumulator fragment's two rows by f0 (row r0) and f1 (row r0 + 8): the online
// softmax's rescale of a running output.
template <int R>
__device__ __forceinline__ void scale_rows(float (&o)[R], float f0, float f1) {
#pragma unroll
    for (int j = 0; j < R / 4; ++j) {
        o[4 * j] *= f0;
        o[4 * j + 1] *= f0;
        o[4 * j + 2] *= f1;
        o[4 * j + 3] *= f1;
    }
}

// ---- bf16 wgmma (the MLA decode kernel): 64×64 scores from shared memory, 64×256 outputs with A
// from shared memory or registers ----

__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(threads) : "memory");
}

// Four 8 × 8 blocks of 16-bit values to shared memory (stmatrix .x4): register i of each lane holds
// the two consecutive values of block i at row lane / 4, columns 2·(lane % 4) and + 1 — an mma
// accumulator's or A fragment's layout — and lane L gives the address of row L % 8 of block L / 8.
__device__ __forceinline__ void stmatrix_x4(void* row_addr, uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_addr(row_addr)), "r"(b0),
                 "r"(b1), "r"(b2), "r"(b3)
                 : "memory");
}

// The row lane `lane` addresses in an stmatrix .x4 of a warp's wgmma fragment rows (r0: the
// thread's first fragment row): row L % 8 of 8 × 8 block L / 8, blocks 0 and 2 the warp's top
// 8 rows, 1 and 3 its bottom 8.
__device__ __forceinline__ int stmatrix_row(int r0, int lane) { return r0 - lane / 4 + 8 * (lane / 8 & 1) + lane % 8; }

// A warp's 16 rows × 64 columns of a wgmma fragment in bf16 pairs (pk[2j] row r0, pk[2j + 1] row
// r0 + 8, columns 8j + 2·(lane % 4), + 1) → rows of 128 bytes in the 128-byte swizzle from `panel`
// (1024-byte aligned: the layout of a K-major wgmma operand and of a TMA box with that swizzle), by
// four stmatrix of four 8 × 8 blocks each (column block 2q + L / 16 for lane L).
__device__ __forceinline__ void store_rows_sw128(uint8_t* panel, const uint32_t (&pk)[16], int r0, int lane) {
    const int row = stmatrix_row(r0, lane);
#pragma unroll
    for (int q = 0; q < 4; ++q) {
        const int j = 2 * q + lane / 16;
        stmatrix_x4(panel + row * 128 + ((j ^ (row & 7)) << 4), pk[4 * q], pk[4 * q + 1], pk[4 * q + 2], pk[4 * q + 3]);
    }
}

// Two f32 → bf16x2 (round to nearest even), `lo` in the low half.
__device__ __forceinline__ uint32_t pack_bf16_rn(float lo, float hi) {
    uint32_t d;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

template <int R>
__device__ __forceinline__ void fence_u32(uint32_t (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+r"(d[i])::"memory");
}

// wgmma descriptor of an N-major (MN-major) bf16 operand in 128-byte-swizzled panels: 64-element
// column panels `panel_bytes` apart (leading byte offset), 8-row groups 1024 bytes apart (stride).
__device__ __forceinline__ uint64_t desc_mn_major_sw128(const void* tile, uint32_t panel_bytes) {
    const uint64_t addr = smem_addr(tile);
    return ((addr & 0x3FFFF) >> 4) | (uint64_t{panel_bytes >> 4} << 16) | (uint64_t{1024 >> 4} << 32) |
           (uint64_t{1} << 62);
}

// d[64, 64] (+)= a · b, bf16 operands from shared memory (a K-major; b K-major), f32 accumulators.
__device__ __forceinline__ void wgmma_s(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" FANOUT_SM90_R32 "}, %32, %33, p, 1, 1, 0, 0;\n}\n"
        : FANOUT_SM90_OUT32(d, 0)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[64, 256] += a · b, a (P, bf16, K-major) from shared memory, b (V, N-major) from shared memory.
__device__ __forceinline__ void wgmma_pv(float (&d)[128], uint64_t desc_a, uint64_t desc_b) {
    asm volatile("{\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" FANOUT_SM90_R128
                 "}, "
                 "%128, %129, 1, 1, 1, 0, 1;\n}\n"
                 : FANOUT_SM90_OUT128(d)
                 : "l"(desc_a), "l"(desc_b));
}

// The same with a (P) from registers in the accumulator fragment layout, packed in bf16 pairs.
__device__ __forceinline__ void wgmma_pv_rs(float (&d)[128], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                            uint64_t desc_b) {
    asm volatile("{\nwgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" FANOUT_SM90_R128
                 "}, "
                 "{%128, %129, %130, %131}, %132, 1, 1, 1, 1;\n}\n"
                 : FANOUT_SM90_OUT128(d)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}

// ---- bf16 wgmma at n128 (the MHA-form prefill kernel) ----
// d[64, 128] (+)= a · bᵀ, bf16 operands from shared memory, both K-major; scale_d = 0 overwrites d.
__device__ __forceinline__ void wgmma_bf16_n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int scale_d) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" FANOUT_SM90_R64 "}, %64, %65, p, 1, 1, 0, 0;\n}\n"
        : FANOUT_SM90_OUT64(d, 0)
        : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}

// d[64, 128] += a · b, a from registers (bf16 pairs in the accumulator fragment layout: k-step
// columns 16kk.. are a0..a3 = pairs 4kk..4kk+3), b N-major from shared memory.
__device__ __forceinline__ void wgmma_bf16_n128_rs(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint64_t desc_b) {
    asm volatile("{\nwgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" FANOUT_SM90_R64
                 "}, "
                 "{%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n}\n"
                 : FANOUT_SM90_OUT64(d, 0)
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b));
}
#undef FANOUT_SM90_R16
#undef FANOUT_SM90_R32
#undef FANOUT_SM90_R64
#undef FANOUT_SM90_R128
#undef FANOUT_SM90_OUT8
#undef FANOUT_SM90_OUT16
#undef FANOUT_SM90_OUT32
#undef FANOUT_SM90_OUT64
#undef FANOUT_SM90_OUT128

}  // namespace fanout::ops::sm90
