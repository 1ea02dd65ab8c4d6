// Hopper warpgroup MMA (sm_90a only: compiled with -arch=sm_90a), TF32 operands,
// float32 accumulators: wgmma.mma_async m64nNk8, A from shared memory (SS) or from
// registers (RS), B from shared memory, asynchronous (commit / wait groups).
//
// Shared-memory operand layout (no swizzle; scripts/wgmma_probe.py measured it on
// the H200): a tile of R rows (R % 8 == 0) and K-major columns is stored as 8-row x
// 4-word "core matrices" of 128 contiguous bytes, row-group fastest:
//   element (r, k) at word ((k / 4) * (R / 8) + r / 8) * 32 + (r % 8) * 4 + k % 4.
// The descriptor of the k-step at column kk (a multiple of 8) points at core matrix
// (kk / 4, 0); its leading byte offset is the step to the next 4 columns, (R / 8) *
// 128, and its stride byte offset the step to the next 8 rows, 128.
//
// Accumulator layout (m64nN, N / 2 registers per lane, as float d[N / 8][4]): warp w
// of the warpgroup holds rows 16w..16w+15, d[j][e] of lane (g, t) is row g + 8 (e / 2),
// column 8j + 2t + e % 2 - mma.sync's m16n8 C layout per 8 columns. A from registers
// (4 words per lane) is mma.sync's m16n8k8 TF32 A layout: rows g, g + 8, columns t, t + 4.
//
// The compiler does not know that an asynchronous wgmma still reads and writes its
// registers after the instruction issues: fence_operand() after wgmma_wait pins
// accumulators and register A operands so that nothing touches them in between.
#pragma once

#include "common.cuh"
#include "softmax.cuh"

namespace cupyattn {

__device__ __forceinline__ unsigned wg_smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Word offset of element (r, k) of an R-row core-matrix tile (see above).
template <int R>
__host__ __device__ constexpr int core_offset(int r, int k) {
    return ((k / 4) * (R / 8) + r / 8) * 32 + (r % 8) * 4 + k % 4;
}

// Descriptor of the 8-column k-step of an R-row tile whose core matrix (kk / 4, 0)
// is at shared address base + offset (bytes, multiples of 16): no swizzle, so bits
// 62-63 stay 0. Shared addresses stay below 2^18, so the 14-bit address field (address
// >> 4) never carries into the leading byte offset at bit 16: the low word is built
// once per base and each k-step or part adds its offset / 16 (a compile-time constant
// where the loops unroll), one integer add a descriptor where a mask, a shift and an
// or of the whole address ran before every wgmma.
template <int R>
__host__ __device__ __forceinline__ constexpr unsigned long long wgmma_desc(unsigned base, unsigned offset = 0) {
    constexpr unsigned LEADING = (R / 8) * 128, STRIDE = 128;
    const unsigned lo = ((base >> 4) | ((LEADING >> 4) << 16)) + (offset >> 4);
    return (unsigned long long)lo | ((unsigned long long)(STRIDE >> 4) << 32);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// This thread's warp in the block, broadcast from lane 0: provably warp-uniform, so that
// ptxas keeps the wgmma descriptors built from it in uniform registers (threadIdx.x / 32
// it cannot prove uniform: an R2UR pair before every HGMMA).
__device__ __forceinline__ int warp_uniform_index() { return __shfl_sync(0xffffffffu, int(threadIdx.x / 32), 0); }
// The 128 threads of warpgroup `wg` wait for each other (named barrier wg + 1; 0 is
// __syncthreads').
__device__ __forceinline__ void warpgroup_barrier(int wg) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(wg + 1) : "memory");
}
// `threads` threads (whole warps) wait for each other on named barrier `id` (past
// warpgroup_barrier's 1-4); the others do not take part.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
    asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// The first `threads` threads of the block (whole warps) wait for each other on named
// barrier `id`; the others do not take part.
__device__ __forceinline__ void leading_threads_barrier(int id, int threads) { named_barrier_sync(id, threads); }
// Generic-proxy shared-memory stores become visible to wgmma's (async proxy) reads.
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Bulk copies (cp.async.bulk, the TMA's one-dimensional form) and the mbarriers that
// count their bytes: one thread arms a barrier with the bytes to come and starts the
// copy; every thread that reads the destination waits for the barrier's phase.
__device__ __forceinline__ void mbarrier_init(unsigned long long* bar, unsigned arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(wg_smem_addr(bar)), "r"(arrivals) : "memory");
}
// The barriers' initialization is visible to the asynchronous proxy (the copies).
__device__ __forceinline__ void fence_mbarrier_init() {
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// Thread 0 initializes N mbarriers of one arrival each (the thread that arms them),
// and after them EMPTY more of EMPTY_ARRIVALS each (a "slot is free" barrier that each
// consumer warp arrives at: mbarrier_arrive_warp); the block waits until it has, before
// anyone copies or waits.
template <int N, int EMPTY = 0, int EMPTY_ARRIVALS = 1>
__device__ __forceinline__ void init_mbarriers(unsigned long long* bars) {
    if (threadIdx.x == 0) {
        for (int i = 0; i < N; ++i) mbarrier_init(&bars[i], 1);
        for (int i = N; i < N + EMPTY; ++i) mbarrier_init(&bars[i], EMPTY_ARRIVALS);
        fence_mbarrier_init();
    }
    __syncthreads();
}

// This thread arrives at the barrier (its earlier shared-memory reads and writes released
// to whoever waits on the barrier's phase).
__device__ __forceinline__ void mbarrier_arrive(unsigned long long* bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(wg_smem_addr(bar)) : "memory");
}

// This warp arrives at the barrier once every lane is past this point (its earlier
// shared-memory reads and writes released to whoever waits on the barrier's phase).
__device__ __forceinline__ void mbarrier_arrive_warp(unsigned long long* bar) {
    __syncwarp();
    if (threadIdx.x % 32 == 0) mbarrier_arrive(bar);
}

// The barrier's current phase waits for `bytes` more bytes of copies (this thread's arrival
// counted).
__device__ __forceinline__ void mbarrier_expect_tx(unsigned long long* bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(wg_smem_addr(bar)), "r"(bytes)
                 : "memory");
}

// `bytes` (a multiple of 16, both addresses 16-byte aligned) from global src to shared dst,
// counted on a barrier armed for them (mbarrier_expect_tx).
__device__ __forceinline__ void bulk_load(void* dst, const void* src, unsigned bytes, unsigned long long* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                     wg_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(wg_smem_addr(bar))
                 : "memory");
}

// bulk_load on a barrier this thread arms (and arrives at) for it alone: the barrier's
// current phase completes when the bytes have landed.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, unsigned bytes,
                                                    unsigned long long* bar) {
    mbarrier_expect_tx(bar, bytes);
    bulk_load(dst, src, bytes, bar);
}

// Wait until the barrier's phase of this parity (0, 1, 0, ... for its 1st, 2nd, 3rd
// phase) has completed.
__device__ __forceinline__ void mbarrier_wait(unsigned long long* bar, unsigned parity) {
    unsigned done = 0;
    while (!done)
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(wg_smem_addr(bar)), "r"(parity)
            : "memory");
}

template <int NB>
__device__ __forceinline__ void fence_operand(float (&d)[NB][4]) {
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[j][e])::"memory");
}
template <int NW>
__device__ __forceinline__ void fence_operand(unsigned (&w)[NW]) {
#pragma unroll
    for (int i = 0; i < NW; ++i) asm volatile("" : "+r"(w[i])::"memory");
}

#define CUPYATTN_ACC8(d, j)                                                                                            \
    "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[j + 1][0]), "+f"(d[j + 1][1]),                  \
        "+f"(d[j + 1][2]), "+f"(d[j + 1][3])
// The operand lists as written (formatted, they do not settle).
// clang-format off
#define CUPYATTN_REGS8 "%0, %1, %2, %3, %4, %5, %6, %7"
#define CUPYATTN_REGS16 CUPYATTN_REGS8 ", %8, %9, %10, %11, %12, %13, %14, %15"
#define CUPYATTN_REGS32 \
    CUPYATTN_REGS16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define CUPYATTN_REGS64 \
    CUPYATTN_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, " \
                    "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// clang-format on

// d (+)= A B^T, m64nNk8, TF32. ACCUMULATE = false overwrites d (scale-d = 0).
template <int N>
struct WgmmaTf32;

#define CUPYATTN_WGMMA_TF32(N, REGS, NEXT_SS_A, NEXT_SS_B, NEXT_SS_P, RS_A, NEXT_RS_B, NEXT_RS_P, ...)                 \
    template <>                                                                                                        \
    struct WgmmaTf32<N> {                                                                                              \
        template <bool ACCUMULATE>                                                                                     \
        __device__ static void ss(float (&d)[N / 8][4], unsigned long long a, unsigned long long b) {                  \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " NEXT_SS_P                                                 \
                         ", 0;\n"                                                                                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, " NEXT_SS_A              \
                         ", " NEXT_SS_B ", p, 1, 1;\n}\n"                                                              \
                         : __VA_ARGS__                                                                                 \
                         : "l"(a), "l"(b), "n"((int)ACCUMULATE));                                                      \
        }                                                                                                              \
        template <bool ACCUMULATE>                                                                                     \
        __device__ static void rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b) {                \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " NEXT_RS_P                                                 \
                         ", 0;\n"                                                                                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k8.f32.tf32.tf32 {" REGS "}, {" RS_A "}, " NEXT_RS_B  \
                         ", p, 1, 1;\n}\n"                                                                             \
                         : __VA_ARGS__                                                                                 \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"((int)ACCUMULATE));                  \
        }                                                                                                              \
    };

CUPYATTN_WGMMA_TF32(16, CUPYATTN_REGS8, "%8", "%9", "%10", "%8, %9, %10, %11", "%12", "%13", CUPYATTN_ACC8(d, 0))
CUPYATTN_WGMMA_TF32(32, CUPYATTN_REGS16, "%16", "%17", "%18", "%16, %17, %18, %19", "%20", "%21", CUPYATTN_ACC8(d, 0),
                    CUPYATTN_ACC8(d, 2))
CUPYATTN_WGMMA_TF32(64, CUPYATTN_REGS32, "%32", "%33", "%34", "%32, %33, %34, %35", "%36", "%37", CUPYATTN_ACC8(d, 0),
                    CUPYATTN_ACC8(d, 2), CUPYATTN_ACC8(d, 4), CUPYATTN_ACC8(d, 6))
CUPYATTN_WGMMA_TF32(128, CUPYATTN_REGS64, "%64", "%65", "%66", "%64, %65, %66, %67", "%68", "%69", CUPYATTN_ACC8(d, 0),
                    CUPYATTN_ACC8(d, 2), CUPYATTN_ACC8(d, 4), CUPYATTN_ACC8(d, 6), CUPYATTN_ACC8(d, 8),
                    CUPYATTN_ACC8(d, 10), CUPYATTN_ACC8(d, 12), CUPYATTN_ACC8(d, 14))

#undef CUPYATTN_WGMMA_TF32
#undef CUPYATTN_REGS64
#undef CUPYATTN_REGS32
#undef CUPYATTN_REGS16
#undef CUPYATTN_REGS8
#undef CUPYATTN_ACC8

}  // namespace cupyattn
