// Tensor-core building blocks for sm_80 and newer: cp.async, ldmatrix and
// mma.sync m16n8k16 (float32 accumulate) for __half and __nv_bfloat16.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A 16x16 (row-major), 4 registers of 2 elements:
//     a0 (row g,   cols 2t, 2t+1)   a1 (row g+8, cols 2t, 2t+1)
//     a2 (row g,   cols 2t+8, +9)   a3 (row g+8, cols 2t+8, +9)
//   B 16x8 ("col"), 2 registers:  b0 (rows 2t, 2t+1, col g)  b1 (rows 2t+8, +9, col g)
//   C 16x8 float: c0, c1 (row g, cols 2t, 2t+1)  c2, c3 (row g+8, cols 2t, 2t+1)
// Two neighbouring C tiles (n-blocks 2s and 2s+1) hold exactly the A fragment
// of a 16x16 tile, so P goes from the S accumulators to the P V product
// without leaving registers.
#pragma once

#include "common.cuh"

namespace cupyattn {

template <typename T> struct MmaType;
template <> struct MmaType<__half> {
    __device__ static unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};
template <> struct MmaType<__nv_bfloat16> {
    __device__ static unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
};

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                          __half) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1,
                                          __nv_bfloat16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8,
// as a 32-bit shared-memory address (smem_addr): one register instead of a
// 64-bit generic pointer's two, which the 32-row tiles need.
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

// 16-byte asynchronous copy; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 :: "r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N)); }

// Copy a [ROWS][COLS] tile (COLS a multiple of 8 elements) from global memory
// (row stride src_stride elements, 16-byte aligned rows) into shared memory
// (row stride DST_STRIDE) with 16-byte cp.async; rows >= valid_rows and
// 8-element chunks at or past valid_cols (a multiple of 8) are zero-filled.
template <typename T, int ROWS, int COLS, int DST_STRIDE, int THREADS>
__device__ __forceinline__ void cp_async_tile(T* dst, const T* src, long long src_stride,
                                              int valid_rows, int valid_cols) {
    constexpr int CHUNKS = COLS / 8;
    // Not unrolled: unrolled, ptxas keeps every row's 64-bit source address live
    // across the caller's whole K/V loop, registers the 32-row tiles need.
#pragma unroll 1
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = r < valid_rows && c < valid_cols;
        cp_async_16(dst + r * DST_STRIDE + c, ok ? src + r * src_stride + c : src, ok ? 16 : 0);
    }
}

}  // namespace cupyattn
