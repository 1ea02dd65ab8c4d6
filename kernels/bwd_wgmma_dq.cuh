// The wgmma backward's dQ main loop (attn_bwd_dq_wgmma): a block keeps its query rows'
// Q and dO and streams the key tiles through a pipeline (bwd_wgmma_pipeline.cuh):
//   S = Q K^T,  dP = dO V^T,  dS = P * (dP - delta),  dQ += dS K   (B = the K^T tile)
#pragma once

#include "attn_bwd_simt.cuh"  // LOG2E
#include "bwd_wgmma_epilogue.cuh"
#include "bwd_wgmma_layout.cuh"
#include "bwd_wgmma_pipeline.cuh"
#include "simt_tiles.cuh"

namespace cupyattn {

template <typename L, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__device__ __forceinline__ void dq_wgmma(const float* __restrict__ q, const float* __restrict__ dout,
                                         const float* __restrict__ lse, const float* __restrict__ delta,
                                         float* __restrict__ dq, long long q_sb, long long q_ss, long long q_sh,
                                         long long do_sb, long long do_ss, long long do_sh, long long dq_sb,
                                         long long dq_ss, long long dq_sh, int n_heads_q, int n_heads_kv, int seqlen_q,
                                         int seqlen_k, int head_dim, int head_dim_v, int num_m_tiles, float scale,
                                         float scale_log2, int causal_offset, const float* __restrict__ kv_staged) {
    constexpr int PASSES = Op::passes;
    constexpr bool PRODUCER = L::HAS_PRODUCER;  // (dq_producer_warp)
    constexpr int THREADS = NUM_WARPS * 32;  // the consumers (a producer warpgroup comes after them)
    constexpr int K_STEPS = D_PAD / 8;
    constexpr int N_BLOCKS = BLOCK_N / 8;  // 8-key column blocks of S, the k-steps of dS K
    // D_SPLIT = 2: two warpgroups share 64 query rows, each with half of dQ's columns; the
    // first computes S, the second dP, and they swap them (plan.BwdDqWgmmaConfig.d_split).
    constexpr int D_SPLIT = 16 * NUM_WARPS / BLOCK_M, D_WG = D_PAD / D_SPLIT;
    constexpr int CN = chunk_columns<PASSES, D_WG>();
    constexpr int CHUNKS = D_WG / CN;
    constexpr int KG = PASSES == 3 && N_BLOCKS > 4 ? 4 : N_BLOCKS;
    // As dK/dV's: 16-key 3xTF32 score products 4 k-steps deep, 3 or 2 where a warpgroup
    // keeps more of dQ's columns (registers).
    constexpr int SCORE_DEPTH = PASSES == 3 && BLOCK_N == 16 ? (D_WG <= 128 ? 4 : D_WG <= 160 ? 3 : 2) : 2;
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_M * D_SPLIT == 16 * NUM_WARPS && (D_SPLIT == 1 || BLOCK_M == 64),
                  "each warpgroup owns 64 query rows, or a pair (the only one of its block) shares them");
    static_assert(D_WG % 16 == 0, "a warpgroup's columns");
    static_assert(BLOCK_N == 16 || BLOCK_N == 32 || BLOCK_N == 64, "wgmma.cuh has n16, n32, n64");
    static_assert(D_PAD % 16 == 0 && N_BLOCKS % KG == 0, "tile shape");
    constexpr int Q_PART = BLOCK_M * D_PAD, KV_PART = BLOCK_N * D_PAD;
    // 3xTF32 with 64-key tiles: S, P = exp2(S - lse), then dP, one product's fresh
    // accumulators at a time. With nothing between the two products ptxas compiled them as
    // one at small head dims, dP lost (test_compile checks the SASS for empty HGMMAs).
    constexpr bool P_BEFORE_DP = D_SPLIT == 1 && PASSES == 3 && BLOCK_N == 64;
    static_assert(!P_BEFORE_DP || SCORE_DEPTH == 2, "64-key tiles: two k-steps in flight");

    constexpr int STAGES = L::STAGES;

    extern __shared__ __align__(128) unsigned char smem[];
    float* q_tile = reinterpret_cast<float*>(smem + L::q_tile);
    float* do_tile = reinterpret_cast<float*>(smem + L::do_tile);
    unsigned char* kv_tiles = smem + L::kv_tiles;
    unsigned long long* barriers = reinterpret_cast<unsigned long long*>(smem + L::barriers);

    const int warp = warp_uniform_index(), wg = warp / 4;
    const int row_wg = wg / D_SPLIT, col0 = wg % D_SPLIT * D_WG;  // its 64 rows, its first dQ column
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    const int wg_row0 = m0 + row_wg * 64;
    const int warp_row0 = wg_row0 + (warp % 4) * 16;
    const int n_kv_tiles = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(kv_staged) +
                                  (long long)(qb.b * n_heads_kv + qb.h_kv) * n_kv_tiles * L::STAGED_BYTES;
    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;

    // One stage: the next tile's K and V copy once every warpgroup has S and dP, while
    // this tile's dQ is added; its K^T once that is done, while its S and dP are.
    const KeyStages<L> stages{kv_tiles, staged, barriers};
    init_mbarriers<PRODUCER ? 2 : L::BARRIER_COUNT, PRODUCER ? 2 : 0, NUM_WARPS>(barriers);
    if constexpr (PRODUCER) {
        // (right after the barriers' setup, so that the consumers load Q and dO with their
        // registers too)
        if (warp >= NUM_WARPS) {
            producer_gives_registers();
            if (warp == NUM_WARPS && lane == 0) stages.produce(n_tiles);
            return;
        }
        consumer_takes_registers();
    } else if (threadIdx.x == 0) {
        if constexpr (L::SPLIT_STAGE) {
            if (n_tiles > 0) {
                stages.fetch_kv(0);
                stages.fetch_kt(0);
            }
        } else {
            for (int tile = 0; tile < STAGES && tile < n_tiles; ++tile) stages.fetch(tile);
        }
    }

    // Q and dO, once, from global memory (zeros past the last row): TF32 parts in
    // core-matrix order, or (L::Q_IN_REGISTERS) float32 words in register A order.
    const float* q_rows = q + qb.b * q_sb + qb.h * q_sh + m0 * q_ss;
    const float* do_rows = dout + qb.b * do_sb + qb.h * do_sh + m0 * do_ss;
    constexpr bool Q_WORDS = L::Q_IN_REGISTERS;
    kept_tile_global<Q_WORDS, PASSES, BLOCK_M, D_PAD, THREADS>(q_tile, q_rows, q_ss, seqlen_q - m0, head_dim);
    kept_tile_global<Q_WORDS, PASSES, BLOCK_M, D_PAD, THREADS>(do_tile, do_rows, do_ss, seqlen_q - m0, head_dim_v);

    // This thread's rows (g and g + 8 of the warp): lse (base 2) and delta.
    float lse_log2[2], dlt[2];
    const long long row_base = (qb.b * n_heads_q + qb.h) * (long long)seqlen_q;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + g + half * 8;
        lse_log2[half] = row < seqlen_q ? lse[row_base + row] * LOG2E : 0.0f;
        dlt[half] = row < seqlen_q ? delta[row_base + row] : 0.0f;
    }

    float dq_acc[1][CHUNKS][CN / 8][4];
#pragma unroll
    for (int c = 0; c < CHUNKS; ++c) zero_acc(dq_acc[0][c]);
    const unsigned q_addr = wg_smem_addr(q_tile) + row_wg * 8 * 128;  // the warpgroup's 8 row groups
    const unsigned do_addr = wg_smem_addr(do_tile) + row_wg * 8 * 128;
    // L::Q_IN_REGISTERS: this lane's words of k-step 0 in its warp's 16 rows.
    const int row_warp = row_wg * 4 + warp % 4;
    const float4* q_words = reinterpret_cast<const float4*>(q_tile) + row_warp * K_STEPS * 32 + lane;
    const float4* do_words = reinterpret_cast<const float4*>(do_tile) + row_warp * K_STEPS * 32 + lane;
    const unsigned col_bytes = col0 / 8 * 128;  // its columns' core matrices in the K^T tile
    fence_proxy_async();
    consumers_barrier<PRODUCER, THREADS>();  // Q's and dO's TF32 tiles written (and visible to wgmma)

    for (int tile = 0; tile < n_tiles; ++tile) {
        unsigned char* const stage = stages.stage(tile);
        const unsigned k_addr = wg_smem_addr(stage);
        const unsigned v_addr = k_addr + L::TILE_N, kt_addr = k_addr + 2 * L::TILE_N;
        const int n0 = tile * BLOCK_N;
        if (!PRODUCER && tile > 0) {
            // Every warpgroup is done with the last tile's stage (one stage: its K^T).
            __syncthreads();
            if constexpr (L::SPLIT_STAGE) {
                if (threadIdx.x == 0) stages.fetch_kt(tile);
            } else {
                if (threadIdx.x == 0 && tile - 1 + STAGES < n_tiles) stages.fetch(tile - 1 + STAGES);
            }
        }
        stages.wait(tile);
        const bool idle = CAUSAL && n0 > wg_row0 + 63 + causal_offset;  // uniform per warpgroup
        float sdp[2][N_BLOCKS][4];  // S (or P: P_BEFORE_DP), dP
        // P of a score in this lane's row `half` (g or g + 8 of its warp's 16).
        auto probability = [&](float s, int half) { return exp2f(s * scale_log2 - lse_log2[half]); };
        auto one_product = [&](float (&d)[N_BLOCKS][4], int product) {
            one_of_two_products<PASSES, L::Q_IN_REGISTERS, BLOCK_N, K_STEPS, BLOCK_M, BLOCK_N, SCORE_DEPTH,
                                L::SCORE_PARTS_AS_ROWS>(d, product, {q_words, do_words}, {q_addr, do_addr}, Q_PART * 4,
                                                        {k_addr, v_addr}, KV_PART * 4);
        };
        auto scores = [&] {
            if constexpr (D_SPLIT == 2) {
                // As dK/dV's pair: S over K's tile, dP over V's, each read back by the other.
                // The caller's next barrier orders these reads before the copies that refill
                // the tiles.
                const int product = wg % 2;  // 0: S, 1: dP
                float own[N_BLOCKS][4];
                one_product(own, product);
                float4* const swap[2] = {reinterpret_cast<float4*>(stage),
                                         reinterpret_cast<float4*>(stage + L::TILE_N)};
                swap_pair_products<N_BLOCKS, PRODUCER ? THREADS : 0>(sdp, own, swap, product, warp % 4, lane);
            } else if constexpr (P_BEFORE_DP) {
                one_product(sdp[0], 0);
#pragma unroll
                for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                    for (int e4 = 0; e4 < 4; ++e4) sdp[0][j][e4] = probability(sdp[0][j][e4], e4 / 2);
                one_product(sdp[1], 1);
            } else if constexpr (L::Q_IN_REGISTERS)
                words_by_rows<2, BLOCK_N, K_STEPS, BLOCK_N, L::SCORE_PARTS_AS_ROWS, SCORE_DEPTH>(
                    sdp, {q_words, do_words}, {k_addr, v_addr}, KV_PART * 4);
            else
                rows_by_rows<PASSES, 2, BLOCK_N, K_STEPS, BLOCK_M, BLOCK_N, false, SCORE_DEPTH>(
                    sdp, {q_addr, do_addr}, Q_PART * 4, {k_addr, v_addr}, KV_PART * 4);
        };
        if constexpr (L::SPLIT_STAGE) {
            if (!idle) scores();
            if constexpr (PRODUCER) {
                stages.release_kv();  // this warp is done with K and V
            } else {
                __syncthreads();  // every warpgroup is done with K and V
                if (threadIdx.x == 0 && tile + 1 < n_tiles) stages.fetch_kv(tile + 1);
            }
            stages.wait_kt(tile);
        }
        // A causal block's last tile may reach past every key its rows see (n_end; the
        // staging zero-fills past seqlen_k only): K^T is zeroed there, so that NaN or inf
        // in keys no row may see cannot reach dQ through 0 * NaN (S and dP select).
        if (CAUSAL && n0 + BLOCK_N > n_end && n_end < seqlen_k) {
            zero_transposed_rows<L::PARTS, BLOCK_N, D_PAD, THREADS>(reinterpret_cast<float*>(stage + 2 * L::TILE_N),
                                                                    n_end - n0);
            fence_proxy_async();
            consumers_barrier<PRODUCER, THREADS>();
        }
        if (idle) {
            if constexpr (PRODUCER) stages.release_kt();
            continue;
        }
        if constexpr (!L::SPLIT_STAGE) scores();

        // dS = P * (dP - delta), visible entries only, as the register A operand.
        const bool needs_mask = warp_row0 + 16 > seqlen_q || n0 + BLOCK_N > seqlen_k ||
                                (CAUSAL && n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int e4 = 0; e4 < 4; ++e4) {
                const int half = e4 / 2;
                const int row = warp_row0 + g + half * 8;
                const int key = n0 + j * 8 + 2 * t + e4 % 2;
                const float p = P_BEFORE_DP ? sdp[0][j][e4] : probability(sdp[0][j][e4], half);
                const float ds = p * (sdp[1][j][e4] - dlt[half]);
                sdp[1][j][e4] = visible_or_zero(ds, needs_mask, row, key, seqlen_q, seqlen_k, CAUSAL, causal_offset);
            }
        Tf32Words<PASSES, 4> a[1][N_BLOCKS];
        a_words(a[0], sdp[1]);

        // dQ += dS K. 3xTF32: two fresh accumulators alternate (BUFS = 2), each chunk's add
        // running while the next chunk's products do.
        regs_by_transposed<PASSES, 1, CN, CHUNKS, N_BLOCKS, KG, D_PAD, false, 2>(dq_acc, a, {kt_addr + col_bytes},
                                                                                 KV_PART * 4);
        if constexpr (PRODUCER) stages.release_kt();  // this warp is done with K^T
    }

    store_wg_acc<CHUNKS, CN>(dq + qb.b * dq_sb + qb.h * dq_sh + (long long)warp_row0 * dq_ss + col0, dq_ss, dq_acc[0],
                             scale, seqlen_q - warp_row0, head_dim - col0, lane);
}

}  // namespace cupyattn
