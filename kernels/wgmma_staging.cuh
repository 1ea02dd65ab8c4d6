// TF32 tiles staged once per call for the wgmma kernels (sm_90a): every tile a kernel
// streams (key tiles for the forward and dQ, query tiles for dK/dV) written to global
// memory exactly as that kernel's shared memory holds one pipeline stage, so that the
// kernel copies it whole (cp.async.bulk) instead of every block splitting every tile
// again (attn_fwd_wgmma.cuh says what that cost). Tiles of R rows: the row tile
// (split_rows_global order) and, where a product reduces over the rows, the transposed tile
// (split_transposed order: slots permuted within 8 for a register A operand), TF32
// parts PART words apart, zeros past the sequence and the head dim.
//
//   stage_keys_tf32<Op, D_PAD, BLOCK_N, DQ>: per (batch, kv head, key tile), tiles of a
//     head consecutive: the forward's [K | V^T], dQ's (DQ) [K | V | K^T].
//   stage_queries_tf32<Op, D_PAD, BLOCK_M>: per (batch, query head, query tile), dK/dV's
//     [Q | dO | Q^T | dO^T | lse * log2(e) | delta] (BLOCK_M floats each, 0 past the end).
#pragma once

#include "attn_bwd_simt.cuh"  // LOG2E
#include "wgmma_tiles.cuh"

namespace cupyattn {

// Every sm_90 GPU's opt-in shared memory per block (plan.SM90_SMEM_PER_BLOCK): the
// kernels fed by these tiles keep two stages where two fit.
constexpr int SM90_SMEM_PER_BLOCK = 232448;

// Pipeline stages of staged tiles (STAGE_BYTES each, with BARRIERS 8-byte mbarriers) beside
// RESIDENT_BYTES of tiles a block keeps: two where they fit, else one (plan.WgmmaConfig._staged_tiles).
__host__ __device__ constexpr int stages_that_fit(int resident_bytes, int stage_bytes, int barriers) {
    return resident_bytes + 2 * (stage_bytes + barriers * 8) <= SM90_SMEM_PER_BLOCK ? 2 : 1;
}
constexpr int STAGING_THREADS = 128;
constexpr int STAGING_PIECE = 16;  // rows per transposed piece: the transposed tile is 8-row groups in order

// The transposed tile of R global rows (row stride `stride`), in pieces of 16 rows
// through `raw` (STAGING_PIECE x (D_PAD + 4) floats of shared memory).
template <int PASSES, int R, int D_PAD>
__device__ __forceinline__ void split_transposed_global(float* out, int part, const float* src, long long stride,
                                                        int valid_rows, int valid_cols, float* raw) {
    constexpr int P = STAGING_PIECE, RAW_STRIDE = D_PAD + 4;
#pragma unroll 1
    for (int piece = 0; piece < R / P; ++piece) {
        cp_async_tile<float, P, D_PAD, RAW_STRIDE, STAGING_THREADS>(raw, src + piece * P * stride, stride,
                                                                    valid_rows - piece * P, valid_cols);
        cp_async_commit();
        cp_async_wait<0>();
        __syncthreads();
        split_transposed<PASSES, P, D_PAD, RAW_STRIDE, STAGING_THREADS>(out + piece * P * D_PAD, part, raw);
        __syncthreads();  // raw is read before the next piece overwrites it
    }
}

template <typename Op, int D_PAD, int BLOCK_N, bool DQ>
__global__ void __launch_bounds__(STAGING_THREADS)
stage_keys_tf32(const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ staged,
                long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh,
                int n_heads_kv, int seqlen_k, int head_dim, int n_tiles) {
    constexpr int PASSES = Op::passes, PARTS = PASSES == 3 ? 2 : 1;
    constexpr int PART = BLOCK_N * D_PAD;  // words per TF32 part
    __shared__ __align__(16) float raw[STAGING_PIECE * (D_PAD + 4)];
    const int tile = blockIdx.x % n_tiles, bh = blockIdx.x / n_tiles;
    const int b = bh / n_heads_kv, h = bh % n_heads_kv, n0 = tile * BLOCK_N;
    float* out = staged + (long long)blockIdx.x * (DQ ? 3 : 2) * PARTS * PART;
    k += b * k_sb + h * k_sh + n0 * k_ss;
    v += b * v_sb + h * v_sh + n0 * v_ss;
    split_rows_global<PASSES, BLOCK_N, D_PAD, STAGING_THREADS>(out, PART, k, k_ss, seqlen_k - n0, head_dim);
    if constexpr (DQ) {
        split_rows_global<PASSES, BLOCK_N, D_PAD, STAGING_THREADS>(out + PARTS * PART, PART, v, v_ss, seqlen_k - n0,
                                                                   head_dim);
        split_transposed_global<PASSES, BLOCK_N, D_PAD>(out + 2 * PARTS * PART, PART, k, k_ss, seqlen_k - n0,
                                                        head_dim, raw);
    } else {
        split_transposed_global<PASSES, BLOCK_N, D_PAD>(out + PARTS * PART, PART, v, v_ss, seqlen_k - n0, head_dim,
                                                        raw);
    }
}

template <typename Op, int D_PAD, int BLOCK_M>
__global__ void __launch_bounds__(STAGING_THREADS)
stage_queries_tf32(const float* __restrict__ q, const float* __restrict__ dout, const float* __restrict__ lse,
                   const float* __restrict__ delta, float* __restrict__ staged,
                   long long q_sb, long long q_ss, long long q_sh, long long do_sb, long long do_ss, long long do_sh,
                   int n_heads_q, int seqlen_q, int head_dim, int n_tiles) {
    constexpr int PASSES = Op::passes, PARTS = PASSES == 3 ? 2 : 1;
    constexpr int PART = BLOCK_M * D_PAD;
    __shared__ __align__(16) float raw[STAGING_PIECE * (D_PAD + 4)];
    const int tile = blockIdx.x % n_tiles, bh = blockIdx.x / n_tiles;
    const int b = bh / n_heads_q, h = bh % n_heads_q, m0 = tile * BLOCK_M;
    float* out = staged + (long long)blockIdx.x * (4 * PARTS * PART + 2 * BLOCK_M);
    q += b * q_sb + h * q_sh + m0 * q_ss;
    dout += b * do_sb + h * do_sh + m0 * do_ss;
    const int rows = seqlen_q - m0;
    split_rows_global<PASSES, BLOCK_M, D_PAD, STAGING_THREADS>(out, PART, q, q_ss, rows, head_dim);
    split_rows_global<PASSES, BLOCK_M, D_PAD, STAGING_THREADS>(out + PARTS * PART, PART, dout, do_ss, rows, head_dim);
    split_transposed_global<PASSES, BLOCK_M, D_PAD>(out + 2 * PARTS * PART, PART, q, q_ss, rows, head_dim, raw);
    split_transposed_global<PASSES, BLOCK_M, D_PAD>(out + 3 * PARTS * PART, PART, dout, do_ss, rows, head_dim, raw);
    float* rowwise = out + 4 * PARTS * PART;
    const long long at = (long long)bh * seqlen_q + m0;
    for (int i = threadIdx.x; i < BLOCK_M; i += STAGING_THREADS) {
        rowwise[i] = i < rows ? lse[at + i] * LOG2E : 0.0f;
        rowwise[BLOCK_M + i] = i < rows ? delta[at + i] : 0.0f;
    }
}

}  // namespace cupyattn
