// Shared memory of the wgmma backward kernels (attn_bwd_wgmma.cuh), PARTS = 2 (big,
// small) for 3xTF32, else 1. The planner computes the same layouts (plan.BwdDkdvWgmmaConfig,
// BwdFusedWgmmaConfig, BwdDqWgmmaConfig .layout); check_staged_layout pins the two together.
//
// dK/dV:  k_tile, v_tile  [PARTS][BLOCK_N x D_PAD] core matrices, or (KV_IN_REGISTERS) float32
//                         words in register A order
//         q_tiles         [STAGES][Q | dO | Q^T | dO^T | lse * log2(e) | delta], a staged query
//                         tile (stage_queries_tf32); RING: [3][one operand tile, lse, delta]
//         barriers        [STAGES], one stage: [2], ring: [3] (PRODUCER: [3] more, "free")
// fused:  k_tile, v_tile, kt_tile (K^T, keys in natural order), ds_tiles ([BLOCK_N / 64]
//         warpgroups' dS, keys as k), then q_tiles and barriers as dK/dV's
// dQ:     q_tile, do_tile [PARTS][BLOCK_M x D_PAD], or (Q_IN_REGISTERS) words as above
//         kv_tiles        [STAGES][K | V | K^T], a staged key tile (stage_keys_tf32)
//         barriers        [STAGES], one stage: [2] (PRODUCER: [2] more, "free")
// STAGES = 2 where that fits in sm_90's 232448 bytes, else 1.
#pragma once

#include "wgmma_staging.cuh"

namespace cupyattn {

// PRODUCER: the ring, and a producer warpgroup that issues its copies as the consumers
// free its slots: three "free" mbarriers after the three "landed" ones.
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, bool PRODUCER = false>
struct BwdDkdvWgmmaLayout {
    static constexpr int PARTS = Op::passes == 3 ? 2 : 1;
    static constexpr int TILE_N = PARTS * BLOCK_N * D_PAD * 4, TILE_M = PARTS * BLOCK_M * D_PAD * 4;
    // 3xTF32 from head dim 128: K and V kept as float32 words in register A order
    // (a_words_global), split per k-step (words_by_rows): half the bytes of two parts.
    static constexpr bool KV_IN_REGISTERS = Op::passes == 3 && D_PAD >= 128;
    static constexpr int TILE_KV = KV_IN_REGISTERS ? BLOCK_N * D_PAD * 4 : TILE_N;  // K's (V's) bytes
    // A staged query tile: Q, dO, Q^T, dO^T, then lse * log2(e) and delta per row (stage_queries_tf32).
    static constexpr int ROWWISE_BYTES = 2 * BLOCK_M * 4;
    static constexpr int STAGE_BYTES = 4 * TILE_M + ROWWISE_BYTES;
    static constexpr int STAGES = stages_that_fit(2 * TILE_KV, STAGE_BYTES, 1);
    // Where not even one stage fits beside K and V: a ring of three slots of one operand
    // tile each, through which an item's dO, Q, dO^T (with lse and delta) and Q^T pass in
    // turn (QueryRing), three quarters of a stage's bytes.
    static constexpr bool RING = 2 * TILE_KV + STAGE_BYTES + 2 * 8 > SM90_SMEM_PER_BLOCK;
    static constexpr int RING_SLOTS = 3, RING_SLOT = TILE_M + ROWWISE_BYTES;
    // One stage: its halves (Q, dO | Q^T, dO^T, lse, delta) land apart, each on its own
    // barrier, so that one half copies while the other is in use (QueryStages).
    static constexpr bool SPLIT_STAGE = STAGES == 1 && !RING;
    static constexpr int ROWS_HALF = 2 * TILE_M;  // Q and dO: the bytes of a stage's first half
    static_assert(!PRODUCER || RING, "a producer warpgroup for the ring");
    static constexpr bool HAS_PRODUCER = PRODUCER;
    static constexpr int STAGED_BYTES = STAGE_BYTES;  // global, a tile
    // 3xTF32 16-query tiles with K and V as words: Q's and dO's row tiles staged with their
    // parts as rows (stage_queries_tf32<..., true>), the B operands of words_by_rows'
    // PARTS_AS_ROWS score products (n32 where n16 ran).
    static constexpr bool SCORE_PARTS_AS_ROWS = PARTS == 2 && BLOCK_M == 16 && KV_IN_REGISTERS;
    static constexpr int BARRIER_COUNT = RING ? (PRODUCER ? 2 : 1) * RING_SLOTS : SPLIT_STAGE ? 2 : STAGES;
    static constexpr int k_tile = 0;
    static constexpr int v_tile = k_tile + TILE_KV;
    static constexpr int q_tiles = v_tile + TILE_KV;
    static constexpr int barriers = q_tiles + (RING ? RING_SLOTS * RING_SLOT : STAGES * STAGE_BYTES);
    static constexpr int total = barriers + BARRIER_COUNT * 8;
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {k_tile, v_tile, q_tiles, barriers};
};

// attn_bwd_fused_wgmma's: dK/dV's, with K^T (the A operand of dQ^T = K^T dS^T, keys in
// natural order) and each warpgroup's dS (the B operand: its 64 keys as k) kept too.
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdFusedWgmmaLayout {
    using Dkdv = BwdDkdvWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>;  // its tiles and staged query tile
    static constexpr int PARTS = Dkdv::PARTS, TILE_N = Dkdv::TILE_N, TILE_M = Dkdv::TILE_M;
    static constexpr bool KV_IN_REGISTERS = false;  // K's core-matrix tile is transposed into K^T
    static constexpr int STAGE_BYTES = Dkdv::STAGE_BYTES;
    static constexpr bool RING = false;  // (no tile that needs it fits beside K^T)
    static constexpr bool HAS_PRODUCER = false, SCORE_PARTS_AS_ROWS = false;
    static constexpr int STAGED_BYTES = STAGE_BYTES;
    static constexpr int ROWWISE_BYTES = Dkdv::ROWWISE_BYTES, RING_SLOTS = Dkdv::RING_SLOTS,
                         RING_SLOT = Dkdv::RING_SLOT;
    static constexpr int DS_TILE = PARTS * BLOCK_M * 64 * 4;  // one warpgroup's dS
    static constexpr int k_tile = 0;
    static constexpr int v_tile = k_tile + TILE_N;
    static constexpr int kt_tile = v_tile + TILE_N;
    static constexpr int ds_tiles = kt_tile + TILE_N;
    static constexpr int q_tiles = ds_tiles + BLOCK_N / 64 * DS_TILE;
    static constexpr int STAGES = stages_that_fit(q_tiles, STAGE_BYTES, 1);
    static constexpr bool SPLIT_STAGE = STAGES == 1;  // as dK/dV's
    static constexpr int ROWS_HALF = Dkdv::ROWS_HALF;
    static constexpr int BARRIER_COUNT = SPLIT_STAGE ? 2 : STAGES;
    static constexpr int barriers = q_tiles + STAGES * STAGE_BYTES;
    static constexpr int total = barriers + BARRIER_COUNT * 8;
    static constexpr int num_buffers = 6;
    static constexpr int offsets[num_buffers] = {k_tile, v_tile, kt_tile, ds_tiles, q_tiles, barriers};
};

// PRODUCER: one stage, and a producer warpgroup that issues its copies as the consumers
// free its parts: two "free" mbarriers after the two "landed" ones.
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, bool PRODUCER = false>
struct BwdDqWgmmaLayout {
    static constexpr int PARTS = Op::passes == 3 ? 2 : 1;
    // 3xTF32 from head dim 128: Q and dO kept as float32 words in register A order, as
    // dK/dV's K and V.
    static constexpr bool Q_IN_REGISTERS = Op::passes == 3 && D_PAD >= 128;
    static constexpr int TILE_N = PARTS * BLOCK_N * D_PAD * 4;
    static constexpr int TILE_M = (Q_IN_REGISTERS ? 1 : PARTS) * BLOCK_M * D_PAD * 4;
    static constexpr int STAGE_BYTES = 3 * TILE_N;  // a staged key tile: K, V, K^T (stage_keys_tf32)
    static constexpr int STAGES = stages_that_fit(2 * TILE_M, STAGE_BYTES, 1);
    // One stage: K and V | K^T land apart, each on its own barrier (KeyStages).
    static constexpr bool SPLIT_STAGE = STAGES == 1;
    static constexpr int KV_PART_BYTES = 2 * TILE_N;  // K and V: the bytes of a stage's first part
    static_assert(!PRODUCER || SPLIT_STAGE, "a producer warpgroup for one stage's two parts");
    static constexpr bool HAS_PRODUCER = PRODUCER;
    static constexpr int STAGED_BYTES = STAGE_BYTES;  // global, a tile
    // 3xTF32 16-key tiles with Q and dO as words: K's and V's row tiles staged with their
    // parts as rows (stage_keys_tf32<..., true, true, true>), as dK/dV's query tiles.
    static constexpr bool SCORE_PARTS_AS_ROWS = PARTS == 2 && BLOCK_N == 16 && Q_IN_REGISTERS;
    static constexpr int BARRIER_COUNT = SPLIT_STAGE ? (PRODUCER ? 4 : 2) : STAGES;
    static constexpr int q_tile = 0;
    static constexpr int do_tile = q_tile + TILE_M;
    static constexpr int kv_tiles = do_tile + TILE_M;
    static constexpr int barriers = kv_tiles + STAGES * STAGE_BYTES;
    static constexpr int total = barriers + BARRIER_COUNT * 8;
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {q_tile, do_tile, kv_tiles, barriers};
};

// A producer warpgroup for dK/dV: where a pair of warpgroups shares 64 keys and the query
// tiles stream through the ring, 3xTF32 only (plan.BwdDkdvWgmmaConfig.producer_warp).
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS>
__host__ __device__ constexpr bool dkdv_producer_warp() {
    return BwdDkdvWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>::RING && 16 * NUM_WARPS / BLOCK_N == 2 && Op::passes == 3;
}

// A producer warpgroup for dQ: where a pair of warpgroups shares 64 rows and one stage
// fits (plan.BwdDqWgmmaConfig.producer_warp).
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS>
__host__ __device__ constexpr bool dq_producer_warp() {
    return BwdDqWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>::SPLIT_STAGE && 16 * NUM_WARPS / BLOCK_M == 2;
}

}  // namespace cupyattn
