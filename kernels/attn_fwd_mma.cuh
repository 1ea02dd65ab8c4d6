// Forward attention on tensor cores (sm_80+), float32 accumulation. T is the type
// of q, k, v and out in global memory; Op (mma.cuh) how tiles sit in shared
// memory and are multiplied: MmaHalf<T> for float16 / bfloat16 inputs; for float32
// inputs MmaTf32<3> (3xTF32, float32 accuracy), MmaTf32<1> (TF32), or
// MmaHalf<__half / __nv_bfloat16> (staged: converted to a half type on load).
//
// Algorithm (FlashAttention-2): each warp owns MT x 16 query rows; per K/V tile,
// S = Q K^T with mma.sync (Q and K fragments by ldmatrix), online softmax on the
// accumulators in base 2 with the scale folded in, P taken as the next A operand
// straight from the S accumulators, O += P V (V fragments by ldmatrix.trans, or
// 32-bit loads for TF32). K/V tiles stream through a two-stage pipeline (cp.async
// when no conversion is needed): tile j + 1 loads while tile j is computed. Tiles
// that lie wholly below the causal diagonal skip the mask arithmetic.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0, 16-byte aligned rows (the
// planner checks; otherwise the SIMT kernel runs).
//
// Grid: as attn_fwd_simt (query_block). Block: NUM_WARPS warps, BLOCK_M = MT * 16 * NUM_WARPS.
// With MT = 2 every K and V fragment read from shared memory feeds two mma
// instead of one: at MT = 1 the ldmatrix traffic alone keeps shared memory as
// busy as the tensor cores (one 512-byte x4 load per two m16n8k16).
//
// Shared memory (FwdMmaLayout; same names and order as plan.FwdMmaConfig.layout),
// S = Op::Smem, rows padded by 16 bytes (padded_stride):
//   q_tile [BLOCK_M][STRIDE]            S
//   k_tile [2][BLOCK_N][STRIDE]         S   two pipeline stages
//   v_tile [2][BLOCK_N][STRIDE]         S
#pragma once

#include "mma.cuh"
#include "simt_tiles.cuh"
#include "softmax.cuh"

namespace cupyattn {

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct FwdMmaLayout {
    static constexpr int STRIDE = padded_stride<T, D_PAD>();  // elements per padded row
    static constexpr int STAGES = 2;
    static constexpr int q_tile = 0;
    static constexpr int k_tile = align16(q_tile + BLOCK_M * STRIDE * (int)sizeof(T));
    static constexpr int v_tile = align16(k_tile + STAGES * BLOCK_N * STRIDE * (int)sizeof(T));
    static constexpr int total = v_tile + STAGES * BLOCK_N * STRIDE * (int)sizeof(T);
    static constexpr int num_buffers = 3;
    static constexpr int offsets[num_buffers] = {q_tile, k_tile, v_tile};
};

template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32, 1)
attn_fwd_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
             T* __restrict__ out, float* __restrict__ lse,
             long long q_sb, long long q_ss, long long q_sh,
             long long k_sb, long long k_ss, long long k_sh,
             long long v_sb, long long v_ss, long long v_sh,
             long long o_sb, long long o_ss, long long o_sh,
             int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
             int head_dim, int head_dim_v, int num_m_tiles,
             float scale_log2, int causal_offset) {
    using S = typename Op::Smem;
    using L = FwdMmaLayout<S, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int STRIDE = L::STRIDE;
    constexpr int MT = BLOCK_M / (16 * NUM_WARPS);  // 16-row m-tiles per warp
    constexpr int N_BLOCKS = BLOCK_N / 8;  // 8-key column blocks of S
    constexpr int D_BLOCKS = D_PAD / 8;    // 8-wide column blocks of O
    static_assert(MT >= 1 && BLOCK_M == 16 * MT * NUM_WARPS, "each warp owns MT x 16 query rows");
    static_assert(D_PAD % 16 == 0 && BLOCK_N % 16 == 0, "mma k-steps are 16 wide");

    extern __shared__ __align__(16) unsigned char smem[];
    S* q_tile = reinterpret_cast<S*>(smem + L::q_tile);
    S* k_tile = reinterpret_cast<S*>(smem + L::k_tile);
    S* v_tile = reinterpret_cast<S*>(smem + L::v_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    q += qb.b * q_sb + qb.h * q_sh + m0 * q_ss;
    k += qb.b * k_sb + qb.h_kv * k_sh;
    v += qb.b * v_sb + qb.h_kv * v_sh;

    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;

    // K/V copies stepped (cp_async_tile) where the block's threads cover whole rows.
    constexpr int KV_CHUNKS = D_PAD * (int)sizeof(T) / 16;
    constexpr bool STEPPED = THREADS % KV_CHUNKS == 0 && BLOCK_N % (THREADS / KV_CHUNKS) == 0;
    auto load_kv = [&](int tile) {
        const int n0 = tile * BLOCK_N, stage = tile % 2;
        stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS, STEPPED>(k_tile + stage * BLOCK_N * STRIDE, k + n0 * k_ss,
                                                          k_ss, n_end - n0, head_dim);
        stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS, STEPPED>(v_tile + stage * BLOCK_N * STRIDE, v + n0 * v_ss,
                                                          v_ss, n_end - n0, head_dim_v);
    };
    stage_tile<T, S, BLOCK_M, D_PAD, STRIDE, THREADS>(q_tile, q, q_ss, seqlen_q - m0, head_dim);
    if (n_tiles > 0) load_kv(0);
    cp_async_commit();

    float o_acc[MT][D_BLOCKS][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int j = 0; j < D_BLOCKS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[mt][j][e] = 0.0f;
    float m_run[MT][2], l_run[MT][2];  // rows g and g + 8 of each m-tile
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            m_run[mt][half] = CUPYATTN_NEG_INF;
            l_run[mt][half] = 0.0f;
        }
    if (scale_log2 < 0.0f) {  // online_softmax takes |scale|: scores of -Q for a negative one
        cp_async_wait<0>();
        __syncthreads();
        negate_tile<S, BLOCK_M, D_PAD, STRIDE, THREADS>(q_tile);
    }  // (the loop's first barrier orders these stores before the fragments' loads)
    const int warp_row0 = m0 + warp * 16 * MT;  // the warp's first query row
    // Shared-memory addresses of the rows this lane reads fragments from (see
    // mma.cuh for the mapping); the loops below add compile-time byte offsets.
    constexpr int ROW = STRIDE * (int)sizeof(S), E = (int)sizeof(S);
    const unsigned q_addr = smem_addr(q_tile + warp * 16 * MT * STRIDE + a_lane_offset<S>(lane, STRIDE));
    const unsigned k_addr0 = smem_addr(k_tile + b_lane_offset<S>(lane, STRIDE));
    const unsigned v_addr0 = smem_addr(v_tile + Op::kmajor_lane_offset(lane, STRIDE));

    for (int tile = 0; tile < n_tiles; ++tile) {
        if (tile + 1 < n_tiles) load_kv(tile + 1);  // the other stage, free since the last barrier
        cp_async_commit();
        cp_async_wait<1>();  // everything but the newest group has landed: Q and this tile
        __syncthreads();

        const unsigned k_addr = k_addr0 + (tile % 2) * BLOCK_N * ROW;
        const unsigned v_addr = v_addr0 + (tile % 2) * BLOCK_N * ROW;
        const int n0 = tile * BLOCK_N;
        // Causal: a warp whose last row precedes this tile's first key has nothing to add.
        const bool warp_sees_tile = !CAUSAL || n0 <= warp_row0 + 16 * MT - 1 + causal_offset;
        if (warp_sees_tile) {
            float s[MT][N_BLOCKS][4];
#pragma unroll
            for (int mt = 0; mt < MT; ++mt)
#pragma unroll
                for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[mt][j][e] = 0.0f;
            // S = Q K^T: each K fragment feeds all MT m-tiles of the warp.
#pragma unroll
            for (int kk = 0; kk < D_PAD; kk += Op::K_STEP) {
                typename Op::A a[MT];
#pragma unroll
                for (int mt = 0; mt < MT; ++mt) Op::load_a(a[mt], q_addr + mt * 16 * ROW + kk * E);
#pragma unroll
                for (int j = 0; j < N_BLOCKS; j += 2) {
                    typename Op::B b;  // key blocks j and j + 1
                    Op::load_b(b, k_addr + j * 8 * ROW + kk * E);
#pragma unroll
                    for (int mt = 0; mt < MT; ++mt) {
                        Op::mma(s[mt][j], a[mt], b, 0);
                        Op::mma(s[mt][j + 1], a[mt], b, 1);
                    }
                }
            }

            // Mask only tiles that reach past the sequence end or the warp's causal diagonal.
            const bool needs_mask = n0 + BLOCK_N > seqlen_k ||
                                    (CAUSAL && n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                float alpha[2];
                if (online_softmax<N_BLOCKS, CAUSAL>(s[mt], warp_row0 + mt * 16 + g, n0, t, needs_mask, seqlen_k,
                                                     causal_offset, fabsf(scale_log2), m_run[mt], l_run[mt], alpha))
#pragma unroll
                    for (int j = 0; j < D_BLOCKS; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) o_acc[mt][j][e] *= alpha[e / 2];
            }

            // O += P V (acc_times_kmajor, mma.cuh): each V fragment feeds all MT m-tiles.
            acc_times_kmajor<Op, MT, N_BLOCKS, D_BLOCKS, ROW>(o_acc, s, v_addr);
        }
        __syncthreads();  // this stage is free for the load two tiles ahead
    }
    cp_async_wait<0>();

    // O /= l; rows that saw no key get O = 0 and lse = -inf. out and lse are offset only here:
    // offset before the loop, the two pointers stayed live across it and spilled (two m-tiles
    // at head dim 128).
    out += qb.b * o_sb + qb.h * o_sh + m0 * o_ss;
    lse += (qb.b * n_heads_q + qb.h) * (long long)seqlen_q + m0;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int r = warp * 16 * MT + mt * 16 + g + half * 8;
            if (m0 + r >= seqlen_q) continue;
            const float l = l_run[mt][half];
            const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
            for (int j = 0; j < D_BLOCKS; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d = j * 8 + 2 * t + e;
                    if (d < head_dim_v)
                        out[r * o_ss + d] = Elem<T>::from_float(o_acc[mt][j][half * 2 + e] * inv_l);
                }
            if (t == 0) lse[r] = l > 0.0f ? (m_run[mt][half] + log2f(l)) * LN2 : CUPYATTN_NEG_INF;
        }
}

}  // namespace cupyattn
