// Forward attention, SIMT (CUDA cores, float32 accumulation), any head dim 1..256.
//
// Algorithm (FlashAttention): load a BLOCK_M x D tile of Q; loop over BLOCK_N x D
// tiles of K and V; S = scale * Q K^T; online softmax (running row max m and row
// sum l, base 2 with the scale folded into log2(e)); O = O * alpha + P V; at the
// end O /= l and lse = (m + log2 l) * ln 2.
//
// Grid: one block per (query tile, query head, batch), flattened into grid.x
// (query_block in simt_tiles.cuh). Block: NUM_WARPS warps; warp w owns query rows [w*ROWS, (w+1)*ROWS).
// For S, lane L owns keys (L % KEY_LANES) + i*KEY_LANES and head-dim words
// congruent to L / KEY_LANES (mod D_SPLIT); for O, lane L owns value words
// L + 32*t. P moves from the S lanes to the O lanes by warp shuffles.
//
// Shared memory (FwdSimtLayout; same names and order as plan.FwdSimtConfig.layout):
//   q_tile [BLOCK_M][D_PAD]         T
//   k_tile [BLOCK_N][D_PAD + VEC]   T   one 4-byte word of padding per row:
//                                       lanes read a column of K, conflict-free
//   v_tile [BLOCK_N][DV_PAD]        T
// Padding columns (d >= D) and rows past the sequence end are zero-filled.
#pragma once

#include "simt_tiles.cuh"

namespace cupyattn {

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N>
struct FwdSimtLayout {
    static constexpr int VEC = Elem<T>::VEC;
    static constexpr int K_STRIDE = D_PAD + VEC;  // elements per padded k_tile row
    static constexpr int q_tile = 0;
    static constexpr int k_tile = align16(q_tile + BLOCK_M * D_PAD * (int)sizeof(T));
    static constexpr int v_tile = align16(k_tile + BLOCK_N * K_STRIDE * (int)sizeof(T));
    static constexpr int total = v_tile + BLOCK_N * DV_PAD * (int)sizeof(T);
    static constexpr int num_buffers = 3;
    static constexpr int offsets[num_buffers] = {q_tile, k_tile, v_tile};
};

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32, 1)
attn_fwd_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
              T* __restrict__ out, float* __restrict__ lse,
              long long q_sb, long long q_ss, long long q_sh,
              long long k_sb, long long k_ss, long long k_sh,
              long long v_sb, long long v_ss, long long v_sh,
              long long o_sb, long long o_ss, long long o_sh,
              int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
              int head_dim, int head_dim_v, int num_m_tiles,
              float scale_log2, int causal_offset) {
    using L = FwdSimtLayout<T, D_PAD, DV_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int ROWS = BLOCK_M / NUM_WARPS;
    using Tile = WarpTile<T, ROWS, BLOCK_N>;
    using Word = typename Tile::Word;
    constexpr int VEC = Tile::VEC;
    constexpr int CPL = Tile::CPL;
    static_assert(BLOCK_M % NUM_WARPS == 0, "BLOCK_M must split evenly over warps");
    static_assert(D_PAD % 8 == 0 && DV_PAD % 8 == 0, "head dims are padded to multiples of 8");

    extern __shared__ __align__(16) unsigned char smem[];
    T* q_tile = reinterpret_cast<T*>(smem + L::q_tile);
    T* k_tile = reinterpret_cast<T*>(smem + L::k_tile);
    T* v_tile = reinterpret_cast<T*>(smem + L::v_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const long long b = qb.b;
    const int h = qb.h, h_kv = qb.h_kv, m0 = qb.m0;

    q += b * q_sb + h * q_sh + m0 * q_ss;
    k += b * k_sb + h_kv * k_sh;
    v += b * v_sb + h_kv * v_sh;
    out += b * o_sb + h * o_sh + m0 * o_ss;
    lse += (b * n_heads_q + h) * (long long)seqlen_q + m0;

    load_tile<T, BLOCK_M, D_PAD, D_PAD, THREADS>(q_tile, q, q_ss, seqlen_q - m0, head_dim);

    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);

    float m_run[ROWS], l_run[ROWS];
    typename Tile::template Out<DV_PAD / VEC> o_acc;
    o_acc.zero();
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        m_run[r] = CUPYATTN_NEG_INF;
        l_run[r] = 0.0f;
    }

    const Word* q_words = reinterpret_cast<const Word*>(q_tile) + warp * ROWS * (D_PAD / VEC);
    for (int n0 = 0; n0 < n_end; n0 += BLOCK_N) {
        __syncthreads();  // every warp is done with the previous K/V tiles
        load_tile<T, BLOCK_N, D_PAD, L::K_STRIDE, THREADS>(k_tile, k + n0 * k_ss, k_ss, n_end - n0, head_dim);
        load_tile<T, BLOCK_N, DV_PAD, DV_PAD, THREADS>(v_tile, v + n0 * v_ss, v_ss, n_end - n0, head_dim_v);
        __syncthreads();

        float s[ROWS][CPL];  // S = Q K^T for this warp's rows and this lane's keys
        Tile::template dots<D_PAD / VEC, D_PAD / VEC, L::K_STRIDE / VEC>(
            q_words, reinterpret_cast<const Word*>(k_tile), s, lane);

        // Mask, then online softmax in base 2 with the scale folded in.
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int row = m0 + warp * ROWS + r;
            float row_max = CUPYATTN_NEG_INF;
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int col = n0 + Tile::col_of(lane, c);
                const bool visible = col < seqlen_k && (!CAUSAL || col <= row + causal_offset);
                s[r][c] = visible ? s[r][c] * scale_log2 : CUPYATTN_NEG_INF;
                row_max = fmaxf(row_max, s[r][c]);
            }
            row_max = group_max<Tile::COL_LANES>(row_max);
            const float m_new = fmaxf(m_run[r], row_max);
            // A row that has seen no visible key yet keeps m = -inf; use 0 as the
            // exponent base so exp2 gives 0 (not NaN) for its masked scores.
            const float base = m_new == CUPYATTN_NEG_INF ? 0.0f : m_new;
            const float alpha = exp2f(m_run[r] - base);
            float row_sum = 0.0f;
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                s[r][c] = exp2f(s[r][c] - base);
                row_sum += s[r][c];
            }
            l_run[r] = l_run[r] * alpha + group_sum<Tile::COL_LANES>(row_sum);
            m_run[r] = m_new;
            o_acc.scale_row(r, alpha);
        }

        o_acc.template accumulate<DV_PAD / VEC>(s, reinterpret_cast<const Word*>(v_tile), lane);  // O += P V
    }

    // O /= l; rows that saw no key get O = 0 and lse = -inf.
    const int rows_left = seqlen_q - m0 - warp * ROWS;
    float inv_l[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        inv_l[r] = l_run[r] > 0.0f ? 1.0f / l_run[r] : 0.0f;
        if (lane == 0 && r < rows_left)
            lse[warp * ROWS + r] = l_run[r] > 0.0f ? (m_run[r] + log2f(l_run[r])) * LN2 : CUPYATTN_NEG_INF;
    }
    o_acc.store(out + warp * ROWS * o_ss, o_ss, rows_left, head_dim_v, inv_l, lane);
}

}  // namespace cupyattn
