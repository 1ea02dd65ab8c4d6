// Backward attention, SIMT (CUDA cores, float32 accumulation), any head dim 1..256.
//
// FlashAttention-2's algorithm in three launches, deterministic (no atomics):
//   attn_bwd_delta:     delta_i = rowsum(dO_i * O_i)                     (float32)
//   attn_bwd_dkdv_simt: a block owns BLOCK_N keys of one key/value head and loops
//                       over every query head of its GQA group and every query
//                       tile: P = exp(S - lse), dV += P^T dO, dP = dO V^T,
//                       dS = P * (dP - delta), dK += scale * dS^T Q.
//   attn_bwd_dq_simt:   a block owns BLOCK_M query rows and loops over key tiles:
//                       dQ += scale * dS K (S, P, dP, dS recomputed).
// Recomputing S and dP in the dQ pass costs two extra products out of seven but
// needs no float32 dQ accumulator and no atomics, so every result is bitwise
// reproducible.
//
// Shared memory, same names and order as plan.BwdDkdvSimtConfig.layout:
//   k_tile  [BLOCK_N][D_PAD]         T   the block's keys (read by broadcast)
//   v_tile  [BLOCK_N][DV_PAD]        T
//   q_tile  [BLOCK_M][D_PAD + VEC]   T   one word of padding per row: lanes read by column
//   do_tile [BLOCK_M][DV_PAD + VEC]  T
// and as plan.BwdDqSimtConfig.layout:
//   q_tile  [BLOCK_M][D_PAD]         T   the block's query rows (read by broadcast)
//   do_tile [BLOCK_M][DV_PAD]        T
//   k_tile  [BLOCK_N][D_PAD + VEC]   T
//   v_tile  [BLOCK_N][DV_PAD + VEC]  T
#pragma once

#include "simt_tiles.cuh"

namespace cupyattn {

constexpr float LOG2E = 1.4426950408889634f;

// sum[r]: this lane's part of rowsum(a[r] * c[r]) over head_dim_v columns (lane l adds columns
// l, l + 32, ...; group_sum<32> makes the row's), the rows' loads issued together so that a
// warp has 2 x ROWS in flight (one row a warp: blocks too short for their loads' latency,
// ~300 GB/s on the H200 at head dim 64).
template <typename T, int ROWS>
__device__ __forceinline__ void warp_row_dots(const T* const (&a)[ROWS], const T* const (&c)[ROWS], int head_dim_v,
                                              int lane, float (&sum)[ROWS]) {
    using E = Elem<T>;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) sum[r] = 0.0f;
    for (int d = lane; d < head_dim_v; d += 32)
#pragma unroll
        for (int r = 0; r < ROWS; ++r) sum[r] = fmaf(E::to_float(a[r][d]), E::to_float(c[r][d]), sum[r]);
}

// Row i of dO and of O in (batch, query head) bh = b * n_heads_q + h, both (b, s, h) strided.
template <typename T>
__device__ __forceinline__ void delta_rows_at(const T* dout, const T* out, long long do_sb, long long do_ss,
                                              long long do_sh, long long o_sb, long long o_ss, long long o_sh,
                                              int n_heads_q, long long bh, int i, const T*& a, const T*& c) {
    const int h = (int)(bh % n_heads_q);
    const long long b = bh / n_heads_q;
    a = dout + b * do_sb + h * do_sh + i * do_ss;
    c = out + b * o_sb + h * o_sh + i * o_ss;
}

// delta = rowsum(dO * O), a warp per ROWS_PER_WARP consecutive (batch, head, row) rows;
// rows are (b, s, h) strided.
template <typename T, int NUM_WARPS, int ROWS_PER_WARP>
__global__ void
__launch_bounds__(NUM_WARPS * 32)
attn_bwd_delta(const T* __restrict__ dout, const T* __restrict__ out, float* __restrict__ delta,
               long long do_sb, long long do_ss, long long do_sh,
               long long o_sb, long long o_ss, long long o_sh,
               int n_heads_q, int seqlen_q, int head_dim_v, long long total_rows) {
    const long long row0 = ((long long)blockIdx.x * NUM_WARPS + threadIdx.x / 32) * ROWS_PER_WARP;
    if (row0 >= total_rows) return;
    const int lane = threadIdx.x % 32;
    const T* a[ROWS_PER_WARP];
    const T* c[ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const long long row = min(row0 + r, total_rows - 1);  // past the end: the last row again, not stored
        delta_rows_at(dout, out, do_sb, do_ss, do_sh, o_sb, o_ss, o_sh, n_heads_q, row / seqlen_q,
                      (int)(row % seqlen_q), a[r], c[r]);
    }
    float sum[ROWS_PER_WARP];
    warp_row_dots<T, ROWS_PER_WARP>(a, c, head_dim_v, lane, sum);
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const float s = group_sum<32>(sum[r]);
        if (lane == 0 && row0 + r < total_rows) delta[row0 + r] = s;  // delta is (B, Hq, Sq) contiguous
    }
}

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDkdvSimtLayout {
    static constexpr int VEC = Elem<T>::VEC;
    static constexpr int Q_STRIDE = D_PAD + VEC;
    static constexpr int DO_STRIDE = DV_PAD + VEC;
    static constexpr int k_tile = 0;
    static constexpr int v_tile = align16(k_tile + BLOCK_N * D_PAD * (int)sizeof(T));
    static constexpr int q_tile = align16(v_tile + BLOCK_N * DV_PAD * (int)sizeof(T));
    static constexpr int do_tile = align16(q_tile + BLOCK_M * Q_STRIDE * (int)sizeof(T));
    static constexpr int total = do_tile + BLOCK_M * DO_STRIDE * (int)sizeof(T);
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {k_tile, v_tile, q_tile, do_tile};
};

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDqSimtLayout {
    static constexpr int VEC = Elem<T>::VEC;
    static constexpr int K_STRIDE = D_PAD + VEC;
    static constexpr int V_STRIDE = DV_PAD + VEC;
    static constexpr int q_tile = 0;
    static constexpr int do_tile = align16(q_tile + BLOCK_M * D_PAD * (int)sizeof(T));
    static constexpr int k_tile = align16(do_tile + BLOCK_M * DV_PAD * (int)sizeof(T));
    static constexpr int v_tile = align16(k_tile + BLOCK_N * K_STRIDE * (int)sizeof(T));
    static constexpr int total = v_tile + BLOCK_N * V_STRIDE * (int)sizeof(T);
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {q_tile, do_tile, k_tile, v_tile};
};

// dS for a (rows x columns) warp tile, in place of the scores: p = exp2(s * scale_log2
// - lse * log2 e) where visible, dS = p * (dP - delta); also returns P in p_out.
template <int ROWS, int CPL>
__device__ __forceinline__ void softmax_grad(float (&s)[ROWS][CPL], const float (&dp)[ROWS][CPL],
                                             float (&p_out)[ROWS][CPL], const bool (&visible)[ROWS][CPL],
                                             const float (&lse_log2)[ROWS][CPL],
                                             const float (&delta)[ROWS][CPL], float scale_log2) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
            const float p = visible[r][c] ? exp2f(s[r][c] * scale_log2 - lse_log2[r][c]) : 0.0f;
            p_out[r][c] = p;
            // Selected, not multiplied: dP of an invisible key may be NaN (garbage in V).
            s[r][c] = visible[r][c] ? p * (dp[r][c] - delta[r][c]) : 0.0f;
        }
}

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32, 1)
attn_bwd_dkdv_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                   const T* __restrict__ dout, const float* __restrict__ lse,
                   const float* __restrict__ delta, T* __restrict__ dk, T* __restrict__ dv,
                   long long q_sb, long long q_ss, long long q_sh,
                   long long k_sb, long long k_ss, long long k_sh,
                   long long v_sb, long long v_ss, long long v_sh,
                   long long do_sb, long long do_ss, long long do_sh,
                   long long dk_sb, long long dk_ss, long long dk_sh,
                   long long dv_sb, long long dv_ss, long long dv_sh,
                   int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                   int head_dim, int head_dim_v, int num_n_tiles,
                   float scale, float scale_log2, int causal_offset) {
    using L = BwdDkdvSimtLayout<T, D_PAD, DV_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int ROWS = BLOCK_N / NUM_WARPS;  // keys per warp
    using Tile = WarpTile<T, ROWS, BLOCK_M>;    // columns are query rows
    using Word = typename Tile::Word;
    constexpr int VEC = Tile::VEC;
    constexpr int CPL = Tile::CPL;
    static_assert(BLOCK_N % NUM_WARPS == 0, "BLOCK_N must split evenly over warps");

    extern __shared__ __align__(16) unsigned char smem[];
    T* k_tile = reinterpret_cast<T*>(smem + L::k_tile);
    T* v_tile = reinterpret_cast<T*>(smem + L::v_tile);
    T* q_tile = reinterpret_cast<T*>(smem + L::q_tile);
    T* do_tile = reinterpret_cast<T*>(smem + L::do_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const KeyBlock kb = key_block<CAUSAL, BLOCK_N>(num_n_tiles, n_heads_q, n_heads_kv);
    const long long b = kb.b;
    const int h_kv = kb.h_kv, group = kb.group, n0 = kb.n0;

    load_tile<T, BLOCK_N, D_PAD, D_PAD, THREADS>(
        k_tile, k + b * k_sb + h_kv * k_sh + n0 * k_ss, k_ss, seqlen_k - n0, head_dim);
    load_tile<T, BLOCK_N, DV_PAD, DV_PAD, THREADS>(
        v_tile, v + b * v_sb + h_kv * v_sh + n0 * v_ss, v_ss, seqlen_k - n0, head_dim_v);

    typename Tile::template Out<D_PAD / VEC> dk_acc;
    typename Tile::template Out<DV_PAD / VEC> dv_acc;
    dk_acc.zero();
    dv_acc.zero();

    // Query rows that can see any of this block's keys start at n0 - causal_offset.
    const int m_begin = first_query_tile<CAUSAL, BLOCK_M>(n0, causal_offset);
    const Word* k_words = reinterpret_cast<const Word*>(k_tile) + warp * ROWS * (D_PAD / VEC);
    const Word* v_words = reinterpret_cast<const Word*>(v_tile) + warp * ROWS * (DV_PAD / VEC);

    for (int hq = h_kv * group; hq < (h_kv + 1) * group; ++hq) {
        const T* q_h = q + b * q_sb + hq * q_sh;
        const T* do_h = dout + b * do_sb + hq * do_sh;
        const float* lse_h = lse + (b * n_heads_q + hq) * (long long)seqlen_q;
        const float* delta_h = delta + (b * n_heads_q + hq) * (long long)seqlen_q;
        for (int m0 = m_begin; m0 < seqlen_q; m0 += BLOCK_M) {
            __syncthreads();  // previous Q / dO tiles are consumed (and K / V are loaded)
            load_tile<T, BLOCK_M, D_PAD, L::Q_STRIDE, THREADS>(
                q_tile, q_h + m0 * q_ss, q_ss, seqlen_q - m0, head_dim);
            load_tile<T, BLOCK_M, DV_PAD, L::DO_STRIDE, THREADS>(
                do_tile, do_h + m0 * do_ss, do_ss, seqlen_q - m0, head_dim_v);
            __syncthreads();

            float s[ROWS][CPL], dp[ROWS][CPL], p[ROWS][CPL], lse_log2[ROWS][CPL], dlt[ROWS][CPL];
            bool visible[ROWS][CPL];
            Tile::template dots<D_PAD / VEC, D_PAD / VEC, L::Q_STRIDE / VEC>(
                k_words, reinterpret_cast<const Word*>(q_tile), s, lane);
            Tile::template dots<DV_PAD / VEC, DV_PAD / VEC, L::DO_STRIDE / VEC>(
                v_words, reinterpret_cast<const Word*>(do_tile), dp, lane);
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int row = m0 + Tile::col_of(lane, c);
                const bool row_ok = row < seqlen_q;
                const float l = row_ok ? lse_h[row] * LOG2E : 0.0f;
                const float d = row_ok ? delta_h[row] : 0.0f;
#pragma unroll
                for (int r = 0; r < ROWS; ++r) {
                    const int col = n0 + warp * ROWS + r;
                    visible[r][c] = row_ok && col < seqlen_k && (!CAUSAL || col <= row + causal_offset);
                    lse_log2[r][c] = l;
                    dlt[r][c] = d;
                }
            }
            softmax_grad(s, dp, p, visible, lse_log2, dlt, scale_log2);
            dv_acc.template accumulate<DV_PAD / VEC + 1>(p, reinterpret_cast<const Word*>(do_tile), lane);
            dk_acc.template accumulate<D_PAD / VEC + 1>(s, reinterpret_cast<const Word*>(q_tile), lane);
        }
    }

    const int keys_left = seqlen_k - n0 - warp * ROWS;
    float ones[ROWS], scales[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        ones[r] = 1.0f;
        scales[r] = scale;
    }
    const long long key = n0 + warp * ROWS;
    dk_acc.store(dk + b * dk_sb + h_kv * dk_sh + key * dk_ss, dk_ss, keys_left, head_dim, scales, lane);
    dv_acc.store(dv + b * dv_sb + h_kv * dv_sh + key * dv_ss, dv_ss, keys_left, head_dim_v, ones, lane);
}

template <typename T, int D_PAD, int DV_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32, 1)
attn_bwd_dq_simt(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                 const T* __restrict__ dout, const float* __restrict__ lse,
                 const float* __restrict__ delta, T* __restrict__ dq,
                 long long q_sb, long long q_ss, long long q_sh,
                   long long k_sb, long long k_ss, long long k_sh,
                   long long v_sb, long long v_ss, long long v_sh,
                   long long do_sb, long long do_ss, long long do_sh,
                   long long dq_sb, long long dq_ss, long long dq_sh,
                 int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                 int head_dim, int head_dim_v, int num_m_tiles,
                 float scale, float scale_log2, int causal_offset) {
    using L = BwdDqSimtLayout<T, D_PAD, DV_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int ROWS = BLOCK_M / NUM_WARPS;  // query rows per warp
    using Tile = WarpTile<T, ROWS, BLOCK_N>;    // columns are keys
    using Word = typename Tile::Word;
    constexpr int VEC = Tile::VEC;
    constexpr int CPL = Tile::CPL;
    static_assert(BLOCK_M % NUM_WARPS == 0, "BLOCK_M must split evenly over warps");

    extern __shared__ __align__(16) unsigned char smem[];
    T* q_tile = reinterpret_cast<T*>(smem + L::q_tile);
    T* do_tile = reinterpret_cast<T*>(smem + L::do_tile);
    T* k_tile = reinterpret_cast<T*>(smem + L::k_tile);
    T* v_tile = reinterpret_cast<T*>(smem + L::v_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const long long b = qb.b;
    const int h = qb.h, h_kv = qb.h_kv, m0 = qb.m0;

    load_tile<T, BLOCK_M, D_PAD, D_PAD, THREADS>(
        q_tile, q + b * q_sb + h * q_sh + m0 * q_ss, q_ss, seqlen_q - m0, head_dim);
    load_tile<T, BLOCK_M, DV_PAD, DV_PAD, THREADS>(
        do_tile, dout + b * do_sb + h * do_sh + m0 * do_ss, do_ss, seqlen_q - m0, head_dim_v);
    const T* k_h = k + b * k_sb + h_kv * k_sh;
    const T* v_h = v + b * v_sb + h_kv * v_sh;

    // This lane's rows: lse (base 2) and delta, fixed for the whole key loop.
    const long long row_base = (b * n_heads_q + h) * (long long)seqlen_q + m0 + warp * ROWS;
    float lse_log2[ROWS][CPL], dlt[ROWS][CPL];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
        const bool ok = m0 + warp * ROWS + r < seqlen_q;
        const float l = ok ? lse[row_base + r] * LOG2E : 0.0f;
        const float d = ok ? delta[row_base + r] : 0.0f;
#pragma unroll
        for (int c = 0; c < CPL; ++c) {
            lse_log2[r][c] = l;
            dlt[r][c] = d;
        }
    }

    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);

    typename Tile::template Out<D_PAD / VEC> dq_acc;
    dq_acc.zero();
    const Word* q_words = reinterpret_cast<const Word*>(q_tile) + warp * ROWS * (D_PAD / VEC);
    const Word* do_words = reinterpret_cast<const Word*>(do_tile) + warp * ROWS * (DV_PAD / VEC);
    for (int n0 = 0; n0 < n_end; n0 += BLOCK_N) {
        __syncthreads();
        load_tile<T, BLOCK_N, D_PAD, L::K_STRIDE, THREADS>(
            k_tile, k_h + n0 * k_ss, k_ss, n_end - n0, head_dim);
        load_tile<T, BLOCK_N, DV_PAD, L::V_STRIDE, THREADS>(
            v_tile, v_h + n0 * v_ss, v_ss, n_end - n0, head_dim_v);
        __syncthreads();

        float s[ROWS][CPL], dp[ROWS][CPL], p[ROWS][CPL];
        bool visible[ROWS][CPL];
        Tile::template dots<D_PAD / VEC, D_PAD / VEC, L::K_STRIDE / VEC>(
            q_words, reinterpret_cast<const Word*>(k_tile), s, lane);
        Tile::template dots<DV_PAD / VEC, DV_PAD / VEC, L::V_STRIDE / VEC>(
            do_words, reinterpret_cast<const Word*>(v_tile), dp, lane);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
            const int row = m0 + warp * ROWS + r;
#pragma unroll
            for (int c = 0; c < CPL; ++c) {
                const int col = n0 + Tile::col_of(lane, c);
                visible[r][c] = row < seqlen_q && col < seqlen_k && (!CAUSAL || col <= row + causal_offset);
            }
        }
        softmax_grad(s, dp, p, visible, lse_log2, dlt, scale_log2);
        dq_acc.template accumulate<L::K_STRIDE / VEC>(s, reinterpret_cast<const Word*>(k_tile), lane);
    }

    float scales[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; ++r) scales[r] = scale;
    dq_acc.store(dq + b * dq_sb + h * dq_sh + (long long)(m0 + warp * ROWS) * dq_ss, dq_ss,
                 seqlen_q - m0 - warp * ROWS, head_dim, scales, lane);
}

}  // namespace cupyattn
