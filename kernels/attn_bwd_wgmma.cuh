// Backward attention for float32 inputs on Hopper's warpgroup MMA (sm_90a), TF32
// operands: Op = MmaTf32<3> (3xTF32, float32 accuracy) or MmaTf32<1> (one TF32 pass).
// The same launches and algorithm as attn_bwd_mma.cuh (attn_bwd_delta first, then
// dK/dV and dQ, deterministic, no atomics); the products run as wgmma on TF32 tiles.
// The tiles a block keeps (K and V for dK/dV, Q and dO for dQ) it splits itself, once;
// the tiles it streams come split once per call by a staging launch
// (wgmma_staging.cuh), each as one pipeline stage holds it, copied whole with one
// cp.async.bulk counted by an mbarrier. TF32 B operands must be K-major, so the operand
// that a product reduces over its rows (Q and dO for dK and dV, K for dQ) is staged a
// second time, transposed, in the k order of the register A operand that P^T, dS^T or
// dS becomes (slots permuted within 8, wgmma_tiles.cuh).
//
//   bwd_wgmma_layout.cuh    shared memory of each kernel, and where a producer warpgroup runs
//   bwd_wgmma_pipeline.cuh  the staged tiles' pipelines (stages, a stage's halves, the ring)
//   bwd_wgmma_dkdv.cuh      dK/dV's main loop (and the fused pass's dQ)
//   bwd_wgmma_dq.cuh        dQ's main loop
//   bwd_wgmma_epilogue.cuh  the visibility select, dS and dQ's atomic adds, the stores out
//
// attn_bwd_dkdv_wgmma: a block owns BLOCK_N keys of one key/value head, 64 per
//   warpgroup, or 64 per pair of warpgroups that each keep half of dK's and dV's columns
//   (D_SPLIT = 2, where one warpgroup's registers do not hold them); Q and dO tiles of
//   BLOCK_M query rows stream over every query head of the GQA group.
// attn_bwd_dq_wgmma: a block owns BLOCK_M query rows, 64 per warpgroup, or 64 shared by
//   a pair of warpgroups that each keep half of dQ's columns; K and V tiles stream.
// attn_bwd_fused_wgmma (deterministic=False): dK/dV's pass, which also adds dQ^T = K^T dS^T
//   over each warpgroup's 64 keys to dq (zeroed first) with float32 atomics.
// 3xTF32 follows the forward's accuracy rule (each k-step of S, dP in a fresh
// accumulator; at most 4 k-steps per fresh accumulator of dK, dV, dQ before a rounded
// add; 16-wide score products from head dim 136 two k-steps of big·big and big·small a
// fresh accumulator: words_by_rows' PARTS_AS_ROWS); one TF32 pass accumulates on the
// tensor cores. Invisible entries (causal, past either sequence end) are selected to
// zero, never multiplied by zero.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0, 16-byte aligned rows.
#pragma once

#include "bwd_wgmma_dkdv.cuh"
#include "bwd_wgmma_dq.cuh"

namespace cupyattn {

// q, dout, lse and delta stay in the launch signature every dK/dV kernel shares (Q, dO,
// lse and delta come through q_staged).
#define CUPYATTN_DKDV_WGMMA_PARAMS                                                                                     \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,                             \
        const float *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ delta,                \
        float *__restrict__ dk, float *__restrict__ dv, long long q_sb, long long q_ss, long long q_sh,                \
        long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh,                \
        long long do_sb, long long do_ss, long long do_sh, long long dk_sb, long long dk_ss, long long dk_sh,          \
        long long dv_sb, long long dv_ss, long long dv_sh, int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,  \
        int head_dim, int head_dim_v, int num_n_tiles, float scale, float scale_log2, int causal_offset,               \
        const float *__restrict__ q_staged
#define CUPYATTN_DKDV_WGMMA_ARGS                                                                                       \
    k, v, dk, dv, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, n_heads_q, n_heads_kv, \
        seqlen_q, seqlen_k, head_dim, head_dim_v, num_n_tiles, scale, scale_log2, causal_offset, q_staged

template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32 + (dkdv_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>()? 128 : 0), 1)
attn_bwd_dkdv_wgmma(CUPYATTN_DKDV_WGMMA_PARAMS) {
    static_assert(same_type<T, float>, "float32 inputs (T is there to name kernels as attn_bwd_dkdv_mma does)");
    constexpr bool PRODUCER = dkdv_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>();
    dkdv_wgmma<BwdDkdvWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N, PRODUCER>, false, Op, D_PAD, BLOCK_M, BLOCK_N,
               NUM_WARPS, CAUSAL>(CUPYATTN_DKDV_WGMMA_ARGS, DqAtomics{nullptr, 0, 0, 0});
}

// dK, dV and dQ in one pass (deterministic=False): dK/dV's launch, plus dq (zeroed
// first) and its strides.
template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32, 1)
attn_bwd_fused_wgmma(CUPYATTN_DKDV_WGMMA_PARAMS, float* __restrict__ dq, long long dq_sb, long long dq_ss,
                     long long dq_sh) {
    static_assert(same_type<T, float>, "float32 inputs (T is there to name kernels as attn_bwd_dkdv_mma does)");
    dkdv_wgmma<BwdFusedWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>, true, Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS,
               CAUSAL>(CUPYATTN_DKDV_WGMMA_ARGS, DqAtomics{dq, dq_sb, dq_ss, dq_sh});
}

#undef CUPYATTN_DKDV_WGMMA_PARAMS
#undef CUPYATTN_DKDV_WGMMA_ARGS

// k, v and their strides stay in the launch signature every dQ kernel shares (K and V
// come through kv_staged).
template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32 + (dq_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>() ? 128 : 0), 1)
attn_bwd_dq_wgmma(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                  const float* __restrict__ dout, const float* __restrict__ lse,
                  const float* __restrict__ delta, float* __restrict__ dq,
                  long long q_sb, long long q_ss, long long q_sh,
                  long long k_sb, long long k_ss, long long k_sh,
                  long long v_sb, long long v_ss, long long v_sh,
                  long long do_sb, long long do_ss, long long do_sh,
                  long long dq_sb, long long dq_ss, long long dq_sh,
                  int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                  int head_dim, int head_dim_v, int num_m_tiles,
                  float scale, float scale_log2, int causal_offset, const float* __restrict__ kv_staged) {
    static_assert(same_type<T, float>, "float32 inputs (T is there to name kernels as attn_bwd_dq_mma does)");
    constexpr bool PRODUCER = dq_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>();
    dq_wgmma<BwdDqWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N, PRODUCER>, Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS, CAUSAL>(
        q, dout, lse, delta, dq, q_sb, q_ss, q_sh, do_sb, do_ss, do_sh, dq_sb, dq_ss, dq_sh, n_heads_q, n_heads_kv,
        seqlen_q, seqlen_k, head_dim, head_dim_v, num_m_tiles, scale, scale_log2, causal_offset, kv_staged);
}

}  // namespace cupyattn
