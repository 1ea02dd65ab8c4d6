// Hopper warpgroup MMA on 16-bit operands (sm_90a): wgmma m64nNk16 with float16 or
// bfloat16 operands and float32 accumulators, A and B from shared memory (SS) or A from
// registers (RS); 128-byte-swizzled shared-memory tiles written by the TMA
// (cp.async.bulk.tensor from a CUtensorMap that cupyattn/tma.py encodes).
//
// Swizzled tiles: a tile of R rows (R % 8 == 0) and C columns is C / 64 chunks of R rows
// of 128 bytes, element (r, c) at byte
//   (c / 64) * R * 128 + r * 128 + (((c % 64) / 8) ^ (r % 8)) * 16 + (c % 8) * 2,
// every chunk 1024-byte aligned (the XOR reads address bits 7-9). K-major operands (Q, K
// of S = Q K^T) step 16 columns by 32 bytes inside a chunk; V (the B operand of P V,
// MN-major: keys x head dim as in memory) steps 16 keys by 2048 bytes, its 64-column
// chunks BLOCK_N * 128 bytes apart (the descriptor's leading byte offset).
//
// Accumulators as wgmma.cuh's (d[j][e]: row g + 8 (e / 2), column 8j + 2t + e % 2); the
// register A operand of the k-step over columns 16kk..16kk+15 is MmaHalf's a_from_acc of
// blocks 2kk and 2kk + 1, so P goes from S's accumulators to P V in-thread.
#pragma once

#include "mma.cuh"
#include "wgmma.cuh"

namespace cupyattn {

// A CUtensorMap (128 bytes, 64-aligned) as a kernel parameter (__grid_constant__): the TMA
// reads it by its generic address.
struct alignas(64) TmaMap {
    unsigned long long w[16];
};
// The forward's maps: rank 4 over a (B, S, H, D) array, dims {D, S, H, B} innermost first,
// box {64, rows, 1, 1}, 128-byte swizzle, zeros outside the array.
struct TmaMaps {
    TmaMap q, k, v;
};
static_assert(sizeof(TmaMaps) == 384, "TmaMaps: tma.TMA_MAPS is three maps of 128 bytes");
// The backward's: q's and dout's in boxes of the kernel's query rows, k's and v's of its keys.
struct BwdTmaMaps {
    TmaMap q, k, v, dout;
};
static_assert(sizeof(BwdTmaMaps) == 512, "BwdTmaMaps: tma.BWD_TMA_MAPS is four maps of 128 bytes");

// Descriptor of a 128-byte-swizzled operand at shared address base + offset: the stride
// byte offset (next 8 rows) is 1024 and the layout field 1 (bits 62-63), so the high word
// is constant; the low word is the address / 16 and the leading byte offset / 16 at bit
// 16 (shared addresses stay below 2^18, so offsets add without carrying into it).
__device__ __forceinline__ unsigned long long desc_sw128(unsigned base, unsigned leading, unsigned offset = 0) {
    const unsigned lo = ((base >> 4) | ((leading >> 4) << 16)) + (offset >> 4);
    return (unsigned long long)lo | (0x40000040ull << 32);
}

// desc_sw128(base, leading, offset) from desc_sw128(base, leading): a 64-bit add, after which
// ptxas keeps the constant high word in place instead of writing it again for each wgmma, at
// the cost of the base descriptors' registers (the backward has them; the forward spills).
__device__ __forceinline__ unsigned long long desc_plus(unsigned long long desc, unsigned offset) {
    return desc + (offset >> 4);
}

// One box of `map` at coordinates {c, r, h, b} (column, row, head, batch) into shared dst,
// counted on bar; parts outside the array are zeros.
__device__ __forceinline__ void tma_load_4d(void* dst, const TmaMap* map, int c, int r, int h, int b,
                                            unsigned long long* bar) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
        "[%6];\n" ::"r"(wg_smem_addr(dst)),
        "l"(map), "r"(c), "r"(r), "r"(h), "r"(b), "r"(wg_smem_addr(bar))
        : "memory");
}

__device__ __forceinline__ void prefetch_tma_map(const TmaMap* map) {
    asm volatile("prefetch.tensormap [%0];\n" ::"l"(map) : "memory");
}

// The descriptor of k-step ks (16 columns) of a K-major swizzled operand of `rows` rows, and
// its byte offset from the operand's start.
__device__ __forceinline__ int kmajor_offset(int rows, int ks) { return (ks / 4) * rows * 128 + (ks % 4) * 32; }
__device__ __forceinline__ unsigned long long kmajor_step(unsigned base, int rows, int ks) {
    return desc_sw128(base, 16, kmajor_offset(rows, ks));
}

// acc = A B^T over K_STEPS k-steps (issued, not committed): 64 rows of A at shared address a
// in an a_rows-row tile, B the b_rows-row tile at b, both K-major swizzled.
// DESC_PLUS: each k-step's descriptors by desc_plus from the tiles' first.
template <class Wg, int K_STEPS, bool DESC_PLUS = false, int N_BLOCKS>
__device__ __forceinline__ void wgmma_kmajor(float (&acc)[N_BLOCKS][4], unsigned a, int a_rows, unsigned b,
                                             int b_rows) {
    const unsigned long long a0 = desc_sw128(a, 16), b0 = desc_sw128(b, 16);
#pragma unroll
    for (int ks = 0; ks < K_STEPS; ++ks) {
        const auto ad = DESC_PLUS ? desc_plus(a0, kmajor_offset(a_rows, ks)) : kmajor_step(a, a_rows, ks);
        const auto bd = DESC_PLUS ? desc_plus(b0, kmajor_offset(b_rows, ks)) : kmajor_step(b, b_rows, ks);
        if (ks == 0)
            Wg::template ss<false>(acc, ad, bd);
        else
            Wg::template ss<true>(acc, ad, bd);
    }
}

// The register A operands of the k-steps over an m64nN accumulator's columns (16 a step):
// k-step kk takes 8-column blocks 2kk and 2kk + 1, rounded to S (P or dS on their way
// from one product's accumulators to the next product's A operand).
template <typename S, int N_BLOCKS>
__device__ __forceinline__ void pack_a_operands(unsigned (&a)[N_BLOCKS / 2][4], const float (&x)[N_BLOCKS][4]) {
#pragma unroll
    for (int kk = 0; kk < N_BLOCKS / 2; ++kk) {
        a[kk][0] = HalfOps<S>::pack(x[2 * kk][0], x[2 * kk][1]);
        a[kk][1] = HalfOps<S>::pack(x[2 * kk][2], x[2 * kk][3]);
        a[kk][2] = HalfOps<S>::pack(x[2 * kk + 1][0], x[2 * kk + 1][1]);
        a[kk][3] = HalfOps<S>::pack(x[2 * kk + 1][2], x[2 * kk + 1][3]);
    }
}

// Rows [from, ROWS) of a swizzled tile of D_CHUNKS chunks to zeros (whole 128-byte rows,
// so the swizzle does not matter), by the THREADS threads from thread 0 on.
template <int D_CHUNKS, int ROWS, int THREADS>
__device__ __forceinline__ void zero_rows_from(unsigned char* tile, int from) {
    const int units = (ROWS - from) * 8;  // 16-byte units a chunk
    for (int i = threadIdx.x; i < D_CHUNKS * units; i += THREADS) {
        const int c = i / units, u = i % units;
        *reinterpret_cast<uint4*>(tile + c * ROWS * 128 + from * 128 + u * 16) = make_uint4(0, 0, 0, 0);
    }
}

// Registers move between warpgroups: every thread of a warpgroup runs the same one.
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N) : "memory");
}

// Add `bytes` of float32s (a multiple of 16; both addresses 16-byte aligned) from shared src
// into global dst, element by element (the TMA's bulk reduction), in this thread's bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, const void* src, unsigned bytes) {
    asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(dst),
                 "r"(wg_smem_addr(src)), "r"(bytes)
                 : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }

// Until at most N of this thread's bulk groups are pending: READ_ONLY, done reading shared
// memory; else complete, their writes to global memory performed.
template <int N, bool READ_ONLY>
__device__ __forceinline__ void bulk_wait() {
    if constexpr (READ_ONLY)
        asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
    else
        asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// A counter other blocks release (red_release_add) and this thread acquires.
__device__ __forceinline__ int load_acquire(const int* p) {
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void red_release_add(int* p, int v) {
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// This warp arrives at named barrier `id` of `threads` threads without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
    asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

#define CUPYATTN_HACC8(d, j)                                                                                           \
    "+f"(d[j][0]), "+f"(d[j][1]), "+f"(d[j][2]), "+f"(d[j][3]), "+f"(d[j + 1][0]), "+f"(d[j + 1][1]),                  \
        "+f"(d[j + 1][2]), "+f"(d[j + 1][3])

// d (+)= A B, m64nNk16, S = __half or __nv_bfloat16 operands. ss: A and B by descriptor,
// both K-major (MN_MAJOR: both MN-major, A read as V is; B_MN_MAJOR alone: B MN-major, A
// K-major); rs: A from registers (4 words),
// B by descriptor, MN-major (transposed).
// ACCUMULATE = false overwrites d (scale-d = 0).
template <typename S, int N>
struct WgmmaHalf;

#define CUPYATTN_WGMMA_HALF_TYPED(TY, N, REGS, SS_A, SS_B, SS_P, RS_A, RS_B, RS_P, ...)                                \
    template <bool ACCUMULATE, bool MN_MAJOR, bool B_MN_MAJOR>                                                         \
    __device__ static void ss_##TY(float (&d)[N / 8][4], unsigned long long a, unsigned long long b) {                 \
        if constexpr (MN_MAJOR)                                                                                        \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_P                                                      \
                         ", 0;\n"                                                                                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" REGS "}, " SS_A ", " SS_B  \
                         ", p, 1, 1, 1, 1;\n}\n"                                                                       \
                         : __VA_ARGS__                                                                                 \
                         : "l"(a), "l"(b), "n"((int)ACCUMULATE));                                                      \
        else if constexpr (B_MN_MAJOR)                                                                                 \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_P                                                      \
                         ", 0;\n"                                                                                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" REGS "}, " SS_A ", " SS_B  \
                         ", p, 1, 1, 0, 1;\n}\n"                                                                       \
                         : __VA_ARGS__                                                                                 \
                         : "l"(a), "l"(b), "n"((int)ACCUMULATE));                                                      \
        else                                                                                                           \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " SS_P                                                      \
                         ", 0;\n"                                                                                      \
                         "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" REGS "}, " SS_A ", " SS_B  \
                         ", p, 1, 1, 0, 0;\n}\n"                                                                       \
                         : __VA_ARGS__                                                                                 \
                         : "l"(a), "l"(b), "n"((int)ACCUMULATE));                                                      \
    }                                                                                                                  \
    template <bool ACCUMULATE>                                                                                         \
    __device__ static void rs_##TY(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b) {               \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " RS_P                                                          \
                     ", 0;\n"                                                                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." #TY "." #TY " {" REGS "}, {" RS_A "}, " RS_B    \
                     ", p, 1, 1, 1;\n}\n"                                                                              \
                     : __VA_ARGS__                                                                                     \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "n"((int)ACCUMULATE));                      \
    }

#define CUPYATTN_WGMMA_HALF(N, REGS, SS_A, SS_B, SS_P, RS_A, RS_B, RS_P, ...)                                          \
    template <typename S>                                                                                              \
    struct WgmmaHalf<S, N> {                                                                                           \
        CUPYATTN_WGMMA_HALF_TYPED(f16, N, REGS, SS_A, SS_B, SS_P, RS_A, RS_B, RS_P, __VA_ARGS__)                       \
        CUPYATTN_WGMMA_HALF_TYPED(bf16, N, REGS, SS_A, SS_B, SS_P, RS_A, RS_B, RS_P, __VA_ARGS__)                      \
        template <bool ACCUMULATE, bool MN_MAJOR = false, bool B_MN_MAJOR = MN_MAJOR>                                  \
        __device__ static void ss(float (&d)[N / 8][4], unsigned long long a, unsigned long long b) {                  \
            if constexpr (same_type<S, __half>)                                                                        \
                ss_f16<ACCUMULATE, MN_MAJOR, B_MN_MAJOR>(d, a, b);                                                     \
            else                                                                                                       \
                ss_bf16<ACCUMULATE, MN_MAJOR, B_MN_MAJOR>(d, a, b);                                                    \
        }                                                                                                              \
        template <bool ACCUMULATE>                                                                                     \
        __device__ static void rs(float (&d)[N / 8][4], const unsigned (&a)[4], unsigned long long b) {                \
            if constexpr (same_type<S, __half>)                                                                        \
                rs_f16<ACCUMULATE>(d, a, b);                                                                           \
            else                                                                                                       \
                rs_bf16<ACCUMULATE>(d, a, b);                                                                          \
        }                                                                                                              \
    };

// The operand lists as written (formatted, they do not settle).
// clang-format off
CUPYATTN_WGMMA_HALF(32,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15",
        "%16", "%17", "%18", "%16, %17, %18, %19", "%20", "%21",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2))
CUPYATTN_WGMMA_HALF(64,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31",
        "%32", "%33", "%34", "%32, %33, %34, %35", "%36", "%37",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6))
CUPYATTN_WGMMA_HALF(80,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39",
        "%40", "%41", "%42", "%40, %41, %42, %43", "%44", "%45",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8))
CUPYATTN_WGMMA_HALF(96,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47",
        "%48", "%49", "%50", "%48, %49, %50, %51", "%52", "%53",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8), CUPYATTN_HACC8(d, 10))
CUPYATTN_WGMMA_HALF(128,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63",
        "%64", "%65", "%66", "%64, %65, %66, %67", "%68", "%69",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8), CUPYATTN_HACC8(d, 10), CUPYATTN_HACC8(d, 12), CUPYATTN_HACC8(d, 14))
CUPYATTN_WGMMA_HALF(176,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87",
        "%88", "%89", "%90", "%88, %89, %90, %91", "%92", "%93",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8), CUPYATTN_HACC8(d, 10), CUPYATTN_HACC8(d, 12), CUPYATTN_HACC8(d, 14),
        CUPYATTN_HACC8(d, 16), CUPYATTN_HACC8(d, 18), CUPYATTN_HACC8(d, 20))
CUPYATTN_WGMMA_HALF(192,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95",
        "%96", "%97", "%98", "%96, %97, %98, %99", "%100", "%101",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8), CUPYATTN_HACC8(d, 10), CUPYATTN_HACC8(d, 12), CUPYATTN_HACC8(d, 14),
        CUPYATTN_HACC8(d, 16), CUPYATTN_HACC8(d, 18), CUPYATTN_HACC8(d, 20), CUPYATTN_HACC8(d, 22))
CUPYATTN_WGMMA_HALF(256,
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
        "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
        "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
        "%62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, "
        "%82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, "
        "%102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, "
        "%119, %120, %121, %122, %123, %124, %125, %126, %127",
        "%128", "%129", "%130", "%128, %129, %130, %131", "%132", "%133",
        CUPYATTN_HACC8(d, 0), CUPYATTN_HACC8(d, 2), CUPYATTN_HACC8(d, 4), CUPYATTN_HACC8(d, 6),
        CUPYATTN_HACC8(d, 8), CUPYATTN_HACC8(d, 10), CUPYATTN_HACC8(d, 12), CUPYATTN_HACC8(d, 14),
        CUPYATTN_HACC8(d, 16), CUPYATTN_HACC8(d, 18), CUPYATTN_HACC8(d, 20), CUPYATTN_HACC8(d, 22),
        CUPYATTN_HACC8(d, 24), CUPYATTN_HACC8(d, 26), CUPYATTN_HACC8(d, 28), CUPYATTN_HACC8(d, 30))

// clang-format on

#undef CUPYATTN_WGMMA_HALF
#undef CUPYATTN_WGMMA_HALF_TYPED
#undef CUPYATTN_HACC8

}  // namespace cupyattn
