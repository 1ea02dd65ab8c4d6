// What the wgmma backward's main loops write (attn_bwd_wgmma.cuh): P and dS of visible
// entries only, the fused pass's dS tile and its dQ added with atomics, and the
// accumulators out to global memory.
#pragma once

#include "wgmma_tiles.cuh"

namespace cupyattn {

// Write a warpgroup's 64-row accumulator (CHUNKS x CN columns) times `scale`: this
// lane's rows g and g + 8 of its warp's 16, from row 0 of dst, rows [0, valid_rows)
// and columns [0, valid_cols) only.
template <int CHUNKS, int CN>
__device__ __forceinline__ void store_wg_acc(float* dst, long long dst_stride, const float (&acc)[CHUNKS][CN / 8][4],
                                             float scale, int valid_rows, int valid_cols, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + half * 8;
        if (r >= valid_rows) continue;
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
            for (int j = 0; j < CN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int col = c * CN + j * 8 + 2 * t + e;
                    if (col < valid_cols) dst[r * dst_stride + col] = acc[c][j][half * 2 + e] * scale;
                }
    }
}

// A warp's dS (the m64nBLOCK_M accumulator rows of its 16 keys, from key_base of the
// warpgroup's 64) into the warpgroup's dS tile: BLOCK_M query rows x 64 keys as k, the
// B operand of dQ^T = K^T dS^T, TF32 parts BLOCK_M * 64 words apart.
template <int PASSES, int BLOCK_M, int M_BLOCKS>
__device__ __forceinline__ void store_ds_tile(float* ds, const float (&x)[M_BLOCKS][4], int key_base, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int j = 0; j < M_BLOCKS; ++j)
#pragma unroll
        for (int e4 = 0; e4 < 4; ++e4) {
            Tf32Words<PASSES, 1> w;
            w.set(0, x[j][e4]);
            const int at = core_offset<BLOCK_M>(j * 8 + 2 * t + e4 % 2, key_base + g + (e4 / 2) * 8);
            reinterpret_cast<unsigned*>(ds)[at] = w.big[0];
            if constexpr (PASSES == 3) reinterpret_cast<unsigned*>(ds + BLOCK_M * 64)[at] = w.small[0];
        }
}

// dQ^T = K^T dS^T over a warpgroup's 64 keys, 64 head-dim rows a wgmma (A = the K^T tile
// from the warpgroup's first key, B = its dS tile): issued only (ISSUE_ONLY, one TF32
// pass: the caller commits and waits), or done.
template <int PASSES, int D_PAD, int BLOCK_M, int BLOCK_N, bool ISSUE_ONLY>
__device__ __forceinline__ void dq_of_keys(float (&dqt)[D_PAD / 64][1][BLOCK_M / 8][4], unsigned kt_addr,
                                           unsigned ds_addr) {
#pragma unroll
    for (int i = 0; i < D_PAD / 64; ++i)
        rows_by_rows<PASSES, 1, BLOCK_M, 8, D_PAD, BLOCK_M, ISSUE_ONLY>(
            dqt[i], {kt_addr + i * 8 * 128}, BLOCK_N * D_PAD * 4, {ds_addr}, BLOCK_M * 64 * 4);
}

// dq_rows[row, :] (row stride ss) += scale * dQ from dQ^T accumulators, rows below
// valid_rows and columns below valid_cols, with float32 atomics. The warpgroup's dS tile
// (its products done, free until the next item) carries dQ, 64 columns at a time, from
// the accumulator layout (a lane's columns 8 apart) to 4 consecutive columns a lane, so
// that one red.v4 adds 16 bytes (scalar atomics where dq's rows are not 16-byte aligned).
template <int D_PAD, int BLOCK_M>
__device__ __forceinline__ void add_dq_rows(float* dq_rows, long long ss,
                                            const float (&dqt)[D_PAD / 64][1][BLOCK_M / 8][4], float* ds, float scale,
                                            int valid_rows, int valid_cols, int wg, int lane) {
    const int g = lane / 4, t = lane % 4, warp = threadIdx.x / 32 % 4;
    // Row r's 4-column group c of a chunk at ds[r * 64 + 4 (c ^ r % 8)]: the XOR spreads a
    // warp's stores (8 columns, 4 row pairs) over the banks.
    auto at = [](int r, int col) { return r * 64 + 4 * ((col / 4) ^ (r % 8)) + col % 4; };
    const bool vector = ((reinterpret_cast<unsigned long long>(dq_rows) | (unsigned long long)(ss * 4)) & 15) == 0;
#pragma unroll
    for (int i = 0; i < D_PAD / 64; ++i) {
        if (i > 0) warpgroup_barrier(wg);  // the last chunk is read
#pragma unroll
        for (int j = 0; j < BLOCK_M / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                ds[at(j * 8 + 2 * t + e % 2, warp * 16 + g + (e / 2) * 8)] = scale * dqt[i][0][j][e];
        warpgroup_barrier(wg);
#pragma unroll
        for (int n = threadIdx.x % 128; n < BLOCK_M * 16; n += 128) {
            const int r = n / 16, col = i * 64 + n % 16 * 4;
            if (r >= valid_rows || col >= valid_cols) continue;  // head dims are multiples of 8
            const float4 x = *reinterpret_cast<const float4*>(ds + at(r, n % 16 * 4));
            float* dst = dq_rows + r * ss + col;
            if (vector) {
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(x.x), "f"(x.y), "f"(x.z),
                             "f"(x.w)
                             : "memory");
            } else {
                atomicAdd(dst, x.x);
                atomicAdd(dst + 1, x.y);
                atomicAdd(dst + 2, x.z);
                atomicAdd(dst + 3, x.w);
            }
        }
    }
}

// Where a fused pass adds dQ (attn_bwd_fused_wgmma): float32 atomics into dq (zeroed
// before the launch), at (batch, query head) rows.
struct DqAtomics {
    float* dq;
    long long sb, ss, sh;
};

// x where entry (row, key) is visible (inside both sequences and, causal, key <= row +
// causal_offset; every entry where !needs_mask), else 0: selected, never multiplied by 0,
// and without a branch, so that lse and delta are read before any entry's work.
__device__ __forceinline__ float visible_or_zero(float x, bool needs_mask, int row, int key, int seqlen_q, int seqlen_k,
                                                 bool causal, int causal_offset) {
    const bool visible = !needs_mask | ((row < seqlen_q) & (key < seqlen_k) & (!causal | (key <= row + causal_offset)));
    return visible ? x : 0.0f;
}

}  // namespace cupyattn
