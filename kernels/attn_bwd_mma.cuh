// Backward attention on tensor cores (sm_80+), float32 accumulation. T and Op as in
// attn_fwd_mma.cuh: T is the global type of q, k, v, dout and the gradients; Op
// stages tiles in shared memory as Op::Smem and multiplies them (half types, TF32
// or 3xTF32; mma.cuh).
//
// The same three launches as the SIMT backward (attn_bwd_simt.cuh), deterministic,
// no atomics; attn_bwd_delta is shared. Products run as mma.sync with ldmatrix
// fragments; P and dS are rounded to the operand type on their way from the
// accumulators into the next product's A operand, as FlashAttention-2 does.
//
// attn_bwd_dkdv_mma: a block owns BLOCK_N keys of one key/value head. K and V stay
//   in shared memory; Q, dO, lse and delta tiles of BLOCK_M query rows stream
//   through two cp.async stages, over every query head of the GQA group. Warps
//   work in key-major orientation, so no transpose is ever stored:
//     S^T  = K Q^T            (A: K rows,  B: Q rows)       16 keys x BLOCK_M
//     dP^T = V dO^T           (A: V rows,  B: dO rows)
//     P^T  = exp2(S^T * scale log2 e - lse log2 e),  dS^T = P^T * (dP^T - delta)
//     dV  += P^T dO           (A: P^T from the S^T accumulators, B: dO k-major)
//     dK  += dS^T Q           (A: dS^T from the dP^T accumulators, B: Q k-major)
//   Each warp owns 16 keys. With D_SPLIT = 16 * NUM_WARPS / BLOCK_N = 2 (head dim
//   256) two warps share 16 keys, both compute S^T and dP^T, and each keeps the
//   dK and dV accumulators of half the head dim: 128 instead of 256 registers.
// attn_bwd_dq_mma: as the forward, a block owns BLOCK_M query rows (16 per warp),
//   Q and dO stay in shared memory, K and V tiles stream through two stages:
//     S = Q K^T, dP = dO V^T, dS = P * (dP - delta), dQ += dS K (K k-major).
// Invisible entries (causal, past either sequence end) are selected to zero, never
// multiplied by zero, so garbage in keys or values no query may see cannot turn
// into NaN in a gradient.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0, 16-byte aligned rows of
// q, k, v and dout (the planner checks; otherwise the SIMT kernels run).
//
// Shared memory, same names and order as plan.BwdDkdvMmaConfig.layout
// (S = Op::Smem, rows padded by 16 bytes as in attn_fwd_mma.cuh):
//   k_tile     [BLOCK_N][STRIDE]      S
//   v_tile     [BLOCK_N][STRIDE]      S
//   q_tile     [2][BLOCK_M][STRIDE]   S      two pipeline stages
//   do_tile    [2][BLOCK_M][STRIDE]   S
//   lse_tile   [2][BLOCK_M]           float  lse * log2(e), 0 past the end
//   delta_tile [2][BLOCK_M]           float
// and as plan.BwdDqMmaConfig.layout:
//   q_tile     [BLOCK_M][STRIDE]      S
//   do_tile    [BLOCK_M][STRIDE]      S
//   k_tile     [2][BLOCK_N][STRIDE]   S      two pipeline stages
//   v_tile     [2][BLOCK_N][STRIDE]   S
#pragma once

#include "attn_bwd_simt.cuh"  // attn_bwd_delta, LOG2E
#include "mma.cuh"

namespace cupyattn {

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDkdvMmaLayout {
    static constexpr int STRIDE = padded_stride<T, D_PAD>();
    static constexpr int TILE_N = BLOCK_N * STRIDE * (int)sizeof(T);
    static constexpr int TILE_M = BLOCK_M * STRIDE * (int)sizeof(T);
    static constexpr int k_tile = 0;
    static constexpr int v_tile = align16(k_tile + TILE_N);
    static constexpr int q_tile = align16(v_tile + TILE_N);
    static constexpr int do_tile = align16(q_tile + 2 * TILE_M);
    static constexpr int lse_tile = align16(do_tile + 2 * TILE_M);
    static constexpr int delta_tile = align16(lse_tile + 2 * BLOCK_M * (int)sizeof(float));
    static constexpr int total = delta_tile + 2 * BLOCK_M * (int)sizeof(float);
    static constexpr int num_buffers = 6;
    static constexpr int offsets[num_buffers] = {k_tile, v_tile, q_tile, do_tile, lse_tile, delta_tile};
};

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDqMmaLayout {
    static constexpr int STRIDE = padded_stride<T, D_PAD>();
    static constexpr int TILE_N = BLOCK_N * STRIDE * (int)sizeof(T);
    static constexpr int TILE_M = BLOCK_M * STRIDE * (int)sizeof(T);
    static constexpr int q_tile = 0;
    static constexpr int do_tile = align16(q_tile + TILE_M);
    static constexpr int k_tile = align16(do_tile + TILE_M);
    static constexpr int v_tile = align16(k_tile + 2 * TILE_N);
    static constexpr int total = v_tile + 2 * TILE_N;
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {q_tile, do_tile, k_tile, v_tile};
};

// acc[j] (j < 2 * NB2 blocks of 8 columns) += A (16 x K_DIM rows of a_rows) times
// B^T, B's rows (columns of the product) read from b_rows: the "both operands
// row-major in shared memory" product of S = Q K^T. a_rows / b_rows point at
// the first row; K_DIM is the reduction length.
template <typename Op, int K_DIM, int NB2, int STRIDE, typename S>
__device__ __forceinline__ void mma_rows_by_rows(float (&acc)[2 * NB2][4], const S* a_rows, const S* b_rows, int lane) {
    constexpr int ROW = STRIDE * (int)sizeof(S), E = (int)sizeof(S);
    const unsigned a_addr = smem_addr(a_rows + a_lane_offset<S>(lane, STRIDE));
    const unsigned b_addr = smem_addr(b_rows + b_lane_offset<S>(lane, STRIDE));
#pragma unroll
    for (int kk = 0; kk < K_DIM; kk += Op::K_STEP) {
        typename Op::A a;
        Op::load_a(a, a_addr + kk * E);
#pragma unroll
        for (int j = 0; j < 2 * NB2; j += 2) {
            typename Op::B b;  // column blocks j and j + 1
            Op::load_b(b, b_addr + j * 8 * ROW + kk * E);
            Op::mma(acc[j], a, b, 0);
            Op::mma(acc[j + 1], a, b, 1);
        }
    }
}

// acc[j] (OUT_BLOCKS blocks of 8 columns) += A B with A (16 x K_BLOCKS * 8) taken
// from float accumulators and B (K_BLOCKS * 8 rows x OUT_BLOCKS * 8 columns,
// row-major in shared memory at b) read k-major: P^T dO, dS^T Q, dS K
// (acc_times_kmajor in mma.cuh, one row tile).
template <typename Op, int K_BLOCKS, int OUT_BLOCKS, int STRIDE, typename S>
__device__ __forceinline__ void mma_acc_by_rows(float (&acc)[OUT_BLOCKS][4], const float (&x)[K_BLOCKS][4], const S* b,
                                                int lane) {
    using One = float[1][OUT_BLOCKS][4];
    using OneIn = const float[1][K_BLOCKS][4];
    acc_times_kmajor<Op, 1, K_BLOCKS, OUT_BLOCKS, STRIDE*(int)sizeof(S)>(
        reinterpret_cast<One&>(acc), reinterpret_cast<OneIn&>(x), smem_addr(b + Op::kmajor_lane_offset(lane, STRIDE)));
}

template <int N>
__device__ __forceinline__ void zero(float (&acc)[N][4]) {
#pragma unroll
    for (int j = 0; j < N; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
}

// Write a 16 x (N * 8) accumulator tile times `scale` to rows [0, valid_rows) and
// columns [0, valid_cols) of dst (row stride dst_stride elements).
template <typename T, int N>
__device__ __forceinline__ void store_acc(T* dst, long long dst_stride, const float (&acc)[N][4], float scale,
                                          int valid_rows, int valid_cols, int lane) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = g + half * 8;
        if (r >= valid_rows) continue;
#pragma unroll
        for (int j = 0; j < N; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int c = j * 8 + 2 * t + e;
                if (c < valid_cols) dst[r * dst_stride + c] = Elem<T>::from_float(acc[j][half * 2 + e] * scale);
            }
    }
}

template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32, 1)
attn_bwd_dkdv_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
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
    using S = typename Op::Smem;
    using L = BwdDkdvMmaLayout<S, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int STRIDE = L::STRIDE;
    constexpr int KEY_WARPS = BLOCK_N / 16;           // warps with distinct keys
    constexpr int D_SPLIT = NUM_WARPS / KEY_WARPS;    // warps sharing 16 keys
    constexpr int D_PART = D_PAD / D_SPLIT;           // head-dim columns of dK, dV per warp
    constexpr int M_BLOCKS = BLOCK_M / 8;             // 8-query column blocks of S^T
    static_assert(BLOCK_N % 16 == 0 && NUM_WARPS % KEY_WARPS == 0, "16 keys per warp");
    static_assert(D_PART % 16 == 0 && BLOCK_M % 16 == 0, "mma steps are 16 wide");

    extern __shared__ __align__(16) unsigned char smem[];
    S* k_tile = reinterpret_cast<S*>(smem + L::k_tile);
    S* v_tile = reinterpret_cast<S*>(smem + L::v_tile);
    S* q_tile = reinterpret_cast<S*>(smem + L::q_tile);
    S* do_tile = reinterpret_cast<S*>(smem + L::do_tile);
    float* lse_tile = reinterpret_cast<float*>(smem + L::lse_tile);
    float* delta_tile = reinterpret_cast<float*>(smem + L::delta_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const int key_warp = warp % KEY_WARPS, d_part = warp / KEY_WARPS;
    const KeyBlock kb = key_block<CAUSAL, BLOCK_N>(num_n_tiles, n_heads_q, n_heads_kv);
    const long long b = kb.b;
    const int h_kv = kb.h_kv, group = kb.group, n0 = kb.n0;
    const int key0 = n0 + key_warp * 16;  // this warp's first key

    stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS>(k_tile, k + b * k_sb + h_kv * k_sh + n0 * k_ss, k_ss,
                                                      seqlen_k - n0, head_dim);
    stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS>(v_tile, v + b * v_sb + h_kv * v_sh + n0 * v_ss, v_ss,
                                                      seqlen_k - n0, head_dim_v);

    // Work items: (query head of the group, query tile), query tiles that can see
    // a key of this block only (causal: from n0 - causal_offset on).
    // first_query_tile (simt_tiles.cuh), written out: through the helper ptxas schedules
    // the non-causal head-dim-256 tiles differently (SASS compared, NVRTC 13.5).
    const int m_begin = CAUSAL ? max(0, n0 - causal_offset) / BLOCK_M * BLOCK_M : 0;
    const int m_tiles = m_begin < seqlen_q ? (seqlen_q - m_begin + BLOCK_M - 1) / BLOCK_M : 0;
    const int n_items = group * m_tiles;
    auto load_item = [&](int item) {
        const int stage = item % 2;
        const int hq = h_kv * group + item / m_tiles;
        const int m0 = m_begin + (item % m_tiles) * BLOCK_M;
        const long long row = (b * n_heads_q + hq) * (long long)seqlen_q + m0;
        stage_tile<T, S, BLOCK_M, D_PAD, STRIDE, THREADS>(q_tile + stage * BLOCK_M * STRIDE,
                                                          q + b * q_sb + hq * q_sh + m0 * q_ss, q_ss,
                                                          seqlen_q - m0, head_dim);
        stage_tile<T, S, BLOCK_M, D_PAD, STRIDE, THREADS>(do_tile + stage * BLOCK_M * STRIDE,
                                                          dout + b * do_sb + hq * do_sh + m0 * do_ss, do_ss,
                                                          seqlen_q - m0, head_dim_v);
        for (int i = threadIdx.x; i < BLOCK_M; i += THREADS) {  // plain loads: 4-byte rows
            const bool ok = m0 + i < seqlen_q;
            lse_tile[stage * BLOCK_M + i] = ok ? lse[row + i] * LOG2E : 0.0f;
            delta_tile[stage * BLOCK_M + i] = ok ? delta[row + i] : 0.0f;
        }
    };
    if (n_items > 0) load_item(0);
    cp_async_commit();

    float dk_acc[D_PART / 8][4], dv_acc[D_PART / 8][4];
    zero(dk_acc);
    zero(dv_acc);
    const S* k_rows = k_tile + key_warp * 16 * STRIDE;
    const S* v_rows = v_tile + key_warp * 16 * STRIDE;

    for (int item = 0; item < n_items; ++item) {
        if (item + 1 < n_items) load_item(item + 1);  // the other stage, free since the last barrier
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        const int stage = item % 2;
        const int m0 = m_begin + (item % m_tiles) * BLOCK_M;
        const S* qs = q_tile + stage * BLOCK_M * STRIDE;
        const S* dos = do_tile + stage * BLOCK_M * STRIDE;
        const float* lse_s = lse_tile + stage * BLOCK_M;
        const float* delta_s = delta_tile + stage * BLOCK_M;
        // Skip warps none of whose keys any query of this tile sees.
        const bool warp_active = key0 < seqlen_k &&
                                 (!CAUSAL || key0 <= m0 + BLOCK_M - 1 + causal_offset);
        if (warp_active) {
            float s[M_BLOCKS][4], dp[M_BLOCKS][4];
            zero(s);
            zero(dp);
            mma_rows_by_rows<Op, D_PAD, M_BLOCKS / 2, STRIDE>(s, k_rows, qs, lane);
            mma_rows_by_rows<Op, D_PAD, M_BLOCKS / 2, STRIDE>(dp, v_rows, dos, lane);

            const bool needs_mask = m0 + BLOCK_M > seqlen_q || key0 + 16 > seqlen_k ||
                                    (CAUSAL && key0 + 15 > m0 + causal_offset);
#pragma unroll
            for (int j = 0; j < M_BLOCKS; ++j)
#pragma unroll
                for (int e4 = 0; e4 < 4; ++e4) {
                    const int key = key0 + g + (e4 / 2) * 8;
                    const int col = j * 8 + 2 * t + e4 % 2;  // query row within the tile
                    const int row = m0 + col;
                    const bool visible = !needs_mask ||
                                         (row < seqlen_q && key < seqlen_k &&
                                          (!CAUSAL || key <= row + causal_offset));
                    const float p = visible ? exp2f(s[j][e4] * scale_log2 - lse_s[col]) : 0.0f;
                    dp[j][e4] = visible ? p * (dp[j][e4] - delta_s[col]) : 0.0f;
                    s[j][e4] = p;
                }
            mma_acc_by_rows<Op, M_BLOCKS, D_PART / 8, STRIDE>(dv_acc, s, dos + d_part * D_PART, lane);
            mma_acc_by_rows<Op, M_BLOCKS, D_PART / 8, STRIDE>(dk_acc, dp, qs + d_part * D_PART, lane);
        }
        __syncthreads();  // this stage is free for the load two items ahead
    }
    cp_async_wait<0>();

    const int keys_left = seqlen_k - key0;
    const int d0 = d_part * D_PART;
    store_acc<T>(dk + b * dk_sb + h_kv * dk_sh + key0 * dk_ss + d0, dk_ss, dk_acc, scale, keys_left,
                 head_dim - d0, lane);
    store_acc<T>(dv + b * dv_sb + h_kv * dv_sh + key0 * dv_ss + d0, dv_ss, dv_acc, 1.0f, keys_left,
                 head_dim_v - d0, lane);
}

template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32, 1)
attn_bwd_dq_mma(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                const T* __restrict__ dout, const float* __restrict__ lse,
                const float* __restrict__ delta, T* __restrict__ dq,
                long long q_sb, long long q_ss, long long q_sh,
                long long k_sb, long long k_ss, long long k_sh,
                long long v_sb, long long v_ss, long long v_sh,
                long long do_sb, long long do_ss, long long do_sh,
                long long dq_sb, long long dq_ss, long long dq_sh,
                int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                int head_dim, int head_dim_v, int num_m_tiles,
                float scale, float scale_log2, int diagonal_offset) {
    // Not causal: the causal code with a diagonal past every key (key < seqlen_k <=
    // row + seqlen_k). Compiled with CAUSAL folded out of the loop, ptxas (NVRTC 13.5)
    // spilled 36-544 bytes in most planned tiles from head dim 144 on sm_80-sm_89 (and
    // 484 in 3xTF32 at head dim 64 on sm_90) whose causal instances need 160-250
    // registers; H200 timings are the same either way (float16 and float32, within 1%).
    // The forward lost up to 23% to the same change, so it keeps its own non-causal
    // code (tests/test_compile.py compiles both instances of every planned tile).
    const int causal_offset = CAUSAL ? diagonal_offset : seqlen_k;
    using S = typename Op::Smem;
    using L = BwdDqMmaLayout<S, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int STRIDE = L::STRIDE;
    constexpr int N_BLOCKS = BLOCK_N / 8;
    static_assert(BLOCK_M == 16 * NUM_WARPS, "each warp owns 16 query rows");
    static_assert(D_PAD % 16 == 0 && BLOCK_N % 16 == 0, "mma steps are 16 wide");

    extern __shared__ __align__(16) unsigned char smem[];
    S* q_tile = reinterpret_cast<S*>(smem + L::q_tile);
    S* do_tile = reinterpret_cast<S*>(smem + L::do_tile);
    S* k_tile = reinterpret_cast<S*>(smem + L::k_tile);
    S* v_tile = reinterpret_cast<S*>(smem + L::v_tile);

    const int warp = threadIdx.x / 32;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    const int warp_row0 = m0 + warp * 16;
    const T* k_h = k + qb.b * k_sb + qb.h_kv * k_sh;
    const T* v_h = v + qb.b * v_sb + qb.h_kv * v_sh;

    stage_tile<T, S, BLOCK_M, D_PAD, STRIDE, THREADS>(q_tile, q + qb.b * q_sb + qb.h * q_sh + m0 * q_ss, q_ss,
                                                      seqlen_q - m0, head_dim);
    stage_tile<T, S, BLOCK_M, D_PAD, STRIDE, THREADS>(do_tile, dout + qb.b * do_sb + qb.h * do_sh + m0 * do_ss,
                                                      do_ss, seqlen_q - m0, head_dim_v);
    const int n_end = key_end<true, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
    auto load_kv = [&](int tile) {
        const int n0 = tile * BLOCK_N, stage = tile % 2;
        stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS>(k_tile + stage * BLOCK_N * STRIDE, k_h + n0 * k_ss,
                                                          k_ss, n_end - n0, head_dim);
        stage_tile<T, S, BLOCK_N, D_PAD, STRIDE, THREADS>(v_tile + stage * BLOCK_N * STRIDE, v_h + n0 * v_ss,
                                                          v_ss, n_end - n0, head_dim_v);
    };
    if (n_tiles > 0) load_kv(0);
    cp_async_commit();

    // This thread's rows (g and g + 8 of the warp): lse (base 2) and delta.
    float lse_log2[2], dlt[2];
    const long long row_base = (qb.b * n_heads_q + qb.h) * (long long)seqlen_q;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + g + half * 8;
        lse_log2[half] = row < seqlen_q ? lse[row_base + row] * LOG2E : 0.0f;
        dlt[half] = row < seqlen_q ? delta[row_base + row] : 0.0f;
    }

    float dq_acc[D_PAD / 8][4];
    zero(dq_acc);
    const S* q_rows = q_tile + warp * 16 * STRIDE;
    const S* do_rows = do_tile + warp * 16 * STRIDE;

    for (int tile = 0; tile < n_tiles; ++tile) {
        if (tile + 1 < n_tiles) load_kv(tile + 1);
        cp_async_commit();
        cp_async_wait<1>();
        __syncthreads();

        const S* ks = k_tile + (tile % 2) * BLOCK_N * STRIDE;
        const S* vs = v_tile + (tile % 2) * BLOCK_N * STRIDE;
        const int n0 = tile * BLOCK_N;
        const bool warp_sees_tile = n0 <= warp_row0 + 15 + causal_offset;
        if (warp_sees_tile) {
            float s[N_BLOCKS][4], dp[N_BLOCKS][4];
            zero(s);
            zero(dp);
            mma_rows_by_rows<Op, D_PAD, N_BLOCKS / 2, STRIDE>(s, q_rows, ks, lane);
            mma_rows_by_rows<Op, D_PAD, N_BLOCKS / 2, STRIDE>(dp, do_rows, vs, lane);

            const bool needs_mask = warp_row0 + 16 > seqlen_q || n0 + BLOCK_N > seqlen_k ||
                                    (n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
#pragma unroll
            for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                for (int e4 = 0; e4 < 4; ++e4) {
                    const int half = e4 / 2;
                    const int row = warp_row0 + g + half * 8;
                    const int key = n0 + j * 8 + 2 * t + e4 % 2;
                    const bool visible = !needs_mask ||
                                         (row < seqlen_q && key < seqlen_k &&
                                          key <= row + causal_offset);
                    const float p = visible ? exp2f(s[j][e4] * scale_log2 - lse_log2[half]) : 0.0f;
                    dp[j][e4] = visible ? p * (dp[j][e4] - dlt[half]) : 0.0f;
                }
            mma_acc_by_rows<Op, N_BLOCKS, D_PAD / 8, STRIDE>(dq_acc, dp, ks, lane);
        }
        __syncthreads();
    }
    cp_async_wait<0>();

    store_acc<T>(dq + qb.b * dq_sb + qb.h * dq_sh + (long long)warp_row0 * dq_ss, dq_ss, dq_acc, scale,
                 seqlen_q - warp_row0, head_dim, lane);
}

}  // namespace cupyattn
