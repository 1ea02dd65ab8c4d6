// Backward attention for float32 inputs on Hopper's warpgroup MMA (sm_90a), TF32
// operands: Op = MmaTf32<3> (3xTF32, float32 accuracy) or MmaTf32<1> (one TF32 pass).
// The same launches and algorithm as attn_bwd_mma.cuh (attn_bwd_delta first, then
// dK/dV and dQ, deterministic, no atomics); the products run as wgmma on TF32 tiles.
// The tiles a block keeps (K and V for dK/dV, Q and dO for dQ) it splits itself, once;
// the tiles it streams come split once per call by a staging launch
// (wgmma_staging.cuh), each as one pipeline stage holds it, copied whole with one
// cp.async.bulk counted by an mbarrier, one or two stages ahead. TF32 B operands must be
// K-major, so the operand that a product reduces over its rows (Q and dO for dK and
// dV, K for dQ) is staged a second time, transposed, in the k order of the register
// A operand that P^T, dS^T or dS becomes (slots permuted within 8, wgmma_tiles.cuh),
//
// attn_bwd_dkdv_wgmma: a block owns BLOCK_N keys of one key/value head, 64 per
//   warpgroup, or 64 per pair of warpgroups that each keep half of dK's and dV's
//   columns (D_SPLIT = 2, where one warpgroup's registers do not hold them; the first
//   computes S^T, the second dP^T, and they swap them through shared memory); K and
//   V stay in shared memory (split once, or in 3xTF32 from head dim 128 as float32
//   words split per k-step in registers); Q and dO tiles of BLOCK_M query rows stream
//   over every query head of the GQA group:
//     S^T  = K Q^T,  dP^T = V dO^T                 (both operands in shared memory)
//     P^T  = exp2(S^T * scale log2 e - lse log2 e),  dS^T = P^T * (dP^T - delta)
//     dV  += P^T dO,  dK += dS^T Q                 (A in registers, B = dO^T, Q^T tiles)
// attn_bwd_dq_wgmma: a block owns BLOCK_M query rows, 64 per warpgroup, or 64 shared by
//   a pair of warpgroups that each keep half of dQ's columns (D_SPLIT = 2, where only 64
//   rows of Q and dO fit; S by the first, dP by the second, swapped as dK/dV's pair do);
//   Q and dO stay in shared memory (split once); K and V tiles stream:
//     S = Q K^T,  dP = dO V^T,  dS = P * (dP - delta),  dQ += dS K   (B = the K^T tile)
// attn_bwd_fused_wgmma (deterministic=False): dK/dV's pass, which also adds dQ, so that
//   no dQ pass recomputes S and dP: each warpgroup writes its dS to shared memory and
//   adds, over its 64 keys,
//     dQ^T = K^T dS^T    (A = K^T, transposed once from the K tile; B = the dS tile)
//   to dq (zeroed first) with float32 atomics, in whatever order blocks get there.
// 3xTF32 follows the forward's accuracy rule (each k-step of S, dP in a fresh
// accumulator; at most 4 k-steps per fresh accumulator of dK, dV, dQ before a rounded
// add; 16-wide score products from head dim 136 two k-steps of big·big and big·small
// a fresh accumulator, one n32 wgmma a k-step: words_by_rows' PARTS_AS_ROWS); one TF32
// pass accumulates on the tensor cores. Invisible entries (causal, past
// either sequence end) are selected to zero, never multiplied by zero.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0, 16-byte aligned rows.
//
// Shared memory, PARTS = 2 (big, small) for 3xTF32, else 1; names and order as
// plan.BwdDkdvWgmmaConfig.layout:
//   k_tile     [PARTS][BLOCK_N x D_PAD]   float  core matrices (wgmma.cuh); 3xTF32 from head dim 128:
//   v_tile     [PARTS][BLOCK_N x D_PAD]   float   [1], float32 words in register A order (KV_IN_REGISTERS)
//   q_tiles    [STAGES][Q: PARTS][BLOCK_M x D_PAD], [dO: ...], [Q^T: PARTS][D_PAD x BLOCK_M],
//                      [dO^T: ...], [lse * log2(e): BLOCK_M], [delta: BLOCK_M]   a query tile as
//                      stage_queries_tf32 writes it (transposed: query slots permuted);
//                      where one stage does not fit (RING): [3][one operand tile, lse, delta]
//   barriers   [STAGES], one stage: [2], ring: [3]   mbarrier  (a stage, one stage's two halves:
//                      Q, dO | the rest, or a ring slot; PRODUCER: [3] more, a slot is free)
// (plan.BwdFusedWgmmaConfig.layout: k_tile, v_tile, then
//   kt_tile    [PARTS][D_PAD x BLOCK_N]   float  K^T, keys in natural order
//   ds_tiles   [BLOCK_N / 64][PARTS][BLOCK_M x 64]  float  each warpgroup's dS, its keys as k
//  then q_tiles and barriers as above) and as plan.BwdDqWgmmaConfig.layout:
//   q_tile     [PARTS][BLOCK_M x D_PAD]   float  (3xTF32 from head dim 128: [1], float32 words
//   do_tile    [PARTS][BLOCK_M x D_PAD]   float   in register A order, Q_IN_REGISTERS)
//   kv_tiles   [STAGES][K: PARTS][BLOCK_N x D_PAD], [V: PARTS][BLOCK_N x D_PAD],
//                      [K^T: PARTS][D_PAD x BLOCK_N]   float  a key tile as stage_keys_tf32<..., true>
//                                                             writes it, copied whole (cp.async.bulk)
//   barriers   [STAGES], one stage: [2]   mbarrier  (a stage, or one stage's parts: K, V | K^T;
//                      PRODUCER: [2] more, a part is free)
// STAGES = 2 where that fits in sm_90's 232448 bytes, else 1.
#pragma once

#include "attn_bwd_simt.cuh"  // attn_bwd_delta, LOG2E
#include "simt_tiles.cuh"
#include "wgmma_staging.cuh"
#include "wgmma_tiles.cuh"

namespace cupyattn {

// PRODUCER: the ring, and a producer warpgroup that issues its copies as the consumers
// free its slots (dkdv_wgmma): three "free" mbarriers after the three "landed" ones.
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, bool PRODUCER = false>
struct BwdDkdvWgmmaLayout {
    static constexpr int PARTS = Op::passes == 3 ? 2 : 1;
    static constexpr int TILE_N = PARTS * BLOCK_N * D_PAD * 4, TILE_M = PARTS * BLOCK_M * D_PAD * 4;
    // 3xTF32 from head dim 128: K and V kept once as float32 in each lane's register A
    // order (a_words_global) and split per k-step in registers (words_by_rows), half the
    // bytes of two parts (as the dQ pass keeps Q and dO), so that a second stage or more
    // keys fit.
    static constexpr bool KV_IN_REGISTERS = Op::passes == 3 && D_PAD >= 128;
    static constexpr int TILE_KV = KV_IN_REGISTERS ? BLOCK_N * D_PAD * 4 : TILE_N;  // K's (V's) bytes
    // A staged query tile: Q, dO, Q^T, dO^T, then lse * log2(e) and delta per row (stage_queries_tf32).
    static constexpr int ROWWISE_BYTES = 2 * BLOCK_M * 4;
    static constexpr int STAGE_BYTES = 4 * TILE_M + ROWWISE_BYTES;
    static constexpr int STAGES = stages_that_fit(2 * TILE_KV, STAGE_BYTES, 1);
    // Where not even one stage fits beside K and V (3xTF32: 64-query tiles at head dim 64,
    // 32 at 80 and 128, 16 at 152-160 and 232-256; one TF32 pass: 64 at 128, 32 at 160 and
    // 240-256): a ring of three slots of one operand tile each, through which an item's
    // dO, Q, dO^T (with lse and delta) and Q^T pass in turn, each slot refilled once its
    // last tile is used (dkdv_wgmma): three quarters of a stage's bytes. Its S^T and dP^T
    // are computed one after the other, which leaves the registers for those wider tiles.
    static constexpr bool RING = 2 * TILE_KV + STAGE_BYTES + 2 * 8 > SM90_SMEM_PER_BLOCK;
    static constexpr int RING_SLOTS = 3, RING_SLOT = TILE_M + ROWWISE_BYTES;
    // One stage: its halves (Q, dO | Q^T, dO^T, lse, delta) land apart, each with its own
    // barrier, so that one half copies while the other is in use (dkdv_wgmma).
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

// PRODUCER: one stage, and a producer warpgroup that issues its copies as the consumers free
// its parts (attn_bwd_dq_wgmma): two "free" mbarriers after the two "landed" ones.
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, bool PRODUCER = false>
struct BwdDqWgmmaLayout {
    static constexpr int PARTS = Op::passes == 3 ? 2 : 1;
    // 3xTF32 from head dim 128: Q and dO kept once as float32 in each lane's register A
    // order (a_words_global) and split per k-step in registers (words_by_rows), half the
    // bytes of two parts (as the forward keeps Q), so that larger tiles or a second stage fit.
    static constexpr bool Q_IN_REGISTERS = Op::passes == 3 && D_PAD >= 128;
    static constexpr int TILE_N = PARTS * BLOCK_N * D_PAD * 4;
    static constexpr int TILE_M = (Q_IN_REGISTERS ? 1 : PARTS) * BLOCK_M * D_PAD * 4;
    static constexpr int STAGE_BYTES = 3 * TILE_N;  // a staged key tile: K, V, K^T (stage_keys_tf32)
    static constexpr int STAGES = stages_that_fit(2 * TILE_M, STAGE_BYTES, 1);
    // One stage: K and V | K^T land apart, each with its own barrier, so that one part
    // copies while the other is in use (as dK/dV's halves; attn_bwd_dq_wgmma).
    static constexpr bool SPLIT_STAGE = STAGES == 1;
    static constexpr int KV_PART_BYTES = 2 * TILE_N;  // K and V: the bytes of a stage's first part
    static_assert(!PRODUCER || SPLIT_STAGE, "a producer warpgroup for one stage's two parts");
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
        rows_by_rows<PASSES, 1, BLOCK_M, 8, D_PAD, BLOCK_M, ISSUE_ONLY>(dqt[i], {kt_addr + i * 8 * 128},
                                                                        BLOCK_N * D_PAD * 4, {ds_addr},
                                                                        BLOCK_M * 64 * 4);
}

// dq_rows[row, :] (row stride ss) += scale * dQ from dQ^T accumulators, rows below
// valid_rows and columns below valid_cols, with float32 atomics. The warpgroup's dS tile
// (its products done, free until the next item) carries dQ, 64 columns at a time, from
// the accumulator layout (a lane's columns 8 apart) to 4 consecutive columns a lane, so
// that one red.v4 adds 16 bytes (scalar atomics where dq's rows are not 16-byte aligned).
template <int D_PAD, int BLOCK_M>
__device__ __forceinline__ void add_dq_rows(float* dq_rows, long long ss, const float (&dqt)[D_PAD / 64][1][BLOCK_M / 8][4],
                                            float* ds, float scale, int valid_rows, int valid_cols, int wg, int lane) {
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
                asm volatile("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"l"(dst), "f"(x.x), "f"(x.y),
                             "f"(x.z), "f"(x.w)
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
// causal_offset; every entry where !needs_mask), else 0: selected, never multiplied by
// 0, and without a branch, so that a lane's exp2f and products over its entries issue
// straight through with lse and delta read first (a branch around each entry's work
// had the compiler read lse and delta inside it, one entry at a time).
__device__ __forceinline__ float visible_or_zero(float x, bool needs_mask, int row, int key, int seqlen_q,
                                                 int seqlen_k, bool causal, int causal_offset) {
    const bool visible = !needs_mask | ((row < seqlen_q) & (key < seqlen_k) & (!causal | (key <= row + causal_offset)));
    return visible ? x : 0.0f;
}

// The dK/dV pass (FUSED = false), or with dQ added as it goes (FUSED: each warpgroup
// writes its dS to shared memory and adds dQ^T = K^T dS^T over its 64 keys to dq with
// atomics, so the dQ pass and its recomputed S and dP are not needed).
template <typename L, bool FUSED, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__device__ __forceinline__ void dkdv_wgmma(const float* __restrict__ k, const float* __restrict__ v,
                                           float* __restrict__ dk, float* __restrict__ dv,
                                           long long k_sb, long long k_ss, long long k_sh,
                                           long long v_sb, long long v_ss, long long v_sh,
                                           long long dk_sb, long long dk_ss, long long dk_sh,
                                           long long dv_sb, long long dv_ss, long long dv_sh,
                                           int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                                           int head_dim, int head_dim_v, int num_n_tiles,
                                           float scale, float scale_log2, int causal_offset,
                                           const float* __restrict__ q_staged, DqAtomics dq) {
    constexpr int PASSES = Op::passes;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int K_STEPS = D_PAD / 8;     // k-steps of K Q^T and V dO^T
    constexpr int M_BLOCKS = BLOCK_M / 8;  // 8-query column blocks of S^T, the k-steps of dV and dK
    // D_SPLIT warpgroups share 64 keys, each with its share of dK's and dV's columns
    // (S^T by one, dP^T by the other, swapped): the accumulators of head dims past one warpgroup's
    // registers (plan.BwdDkdvWgmmaConfig.d_split).
    constexpr int D_SPLIT = 16 * NUM_WARPS / BLOCK_N, D_WG = D_PAD / D_SPLIT;
    constexpr int CN = chunk_columns<PASSES, D_WG>();
    constexpr int CHUNKS = D_WG / CN;
    constexpr int KG = PASSES == 3 && M_BLOCKS > 4 ? 4 : M_BLOCKS;
    // 3xTF32 score products 16 queries wide: 4 k-steps in flight (rows_by_rows' DEPTH), a
    // wgmma n16 being too short to cover the next one's latency two deep, where a
    // warpgroup keeps at most 128 of dK's and dV's columns (NVRTC 13.5: +14-26 registers,
    // to 195-237; at 160 columns (16,128,8) spilled 20-88 bytes at 3 and 4), fewer than
    // 128 without a pair ((16,128,8) and (16,64,4) at 128, K and V as words, spilled
    // 528-984 bytes at 4; neither is planned: rule_audit.py --admitted, nineteenth session).
    constexpr int SCORE_DEPTH = PASSES == 3 && BLOCK_M == 16 && (D_SPLIT == 2 ? D_WG <= 128 : D_WG < 128) ? 4 : 2;
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_N % 64 == 0 && BLOCK_N * D_SPLIT == 16 * NUM_WARPS &&
                  (D_SPLIT == 1 || D_SPLIT == 2), "each warpgroup owns 64 keys, one or two share them");
    static_assert(D_WG % 16 == 0 && (!FUSED || D_SPLIT == 1), "a warpgroup's columns");
    static_assert(D_SPLIT == 1 || BLOCK_N == 64, "one pair a block: its swap of S^T and dP^T meets at __syncthreads");
    static_assert(BLOCK_M == 16 || BLOCK_M == 32 || BLOCK_M == 64, "wgmma.cuh has n16, n32, n64");
    static_assert(D_PAD % 16 == 0 && M_BLOCKS % KG == 0, "tile shape");
    static_assert(!FUSED || D_PAD % 64 == 0, "dQ^T = K^T dS^T: 64 head-dim rows a wgmma");
    constexpr int KV_PART = BLOCK_N * D_PAD, Q_PART = BLOCK_M * D_PAD;  // words per TF32 part

    constexpr int STAGES = L::STAGES;
    constexpr bool PRODUCER = L::HAS_PRODUCER;  // (dkdv_producer_warp)
    static_assert(!PRODUCER || (D_SPLIT == 2 && !FUSED), "the producer warpgroup serves a pair's ring");

    extern __shared__ __align__(128) unsigned char smem[];
    float* k_tile = reinterpret_cast<float*>(smem + L::k_tile);
    float* v_tile = reinterpret_cast<float*>(smem + L::v_tile);
    unsigned char* q_tiles = smem + L::q_tiles;
    unsigned long long* barriers = reinterpret_cast<unsigned long long*>(smem + L::barriers);

    // (not warp_uniform_index in the fused pass, which then spilled 12-168 bytes at
    // admitted tiles: rule_audit.py --admitted)
    const int warp = FUSED ? int(threadIdx.x / 32) : warp_uniform_index();
    const int wg = warp / 4;
    const int key_wg = wg / D_SPLIT, col0 = wg % D_SPLIT * D_WG;  // its 64 keys, its first dK/dV column
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const KeyBlock kb = key_block<CAUSAL, BLOCK_N>(num_n_tiles, n_heads_q, n_heads_kv);
    const long long b = kb.b;
    const int h_kv = kb.h_kv, group = kb.group, n0 = kb.n0;
    const int wg_key0 = n0 + key_wg * 64;        // this warpgroup's first key
    const int key0 = wg_key0 + (warp % 4) * 16;  // this warp's

    // Work items: (query head of the group, query tile), query tiles that can see a key
    // of this block only (causal: from n0 - causal_offset on). Q, dO (and lse, delta)
    // come through q_staged (stage_queries_tf32); q, dout, lse, delta stay in the launch
    // signature every dK/dV kernel shares.
    const int m_begin = first_query_tile<CAUSAL, BLOCK_M>(n0, causal_offset);
    const int m_tiles = m_begin < seqlen_q ? (seqlen_q - m_begin + BLOCK_M - 1) / BLOCK_M : 0;
    const int n_items = group * m_tiles;
    const int n_q_tiles = (seqlen_q + BLOCK_M - 1) / BLOCK_M;
    // From the group's first query head, tile m_begin, on: item (head, m) is query head
    // `head` of the group, tile m after m_begin, staged tile head * n_q_tiles + m.
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(q_staged) +
                                  ((b * n_heads_q + h_kv * group) * n_q_tiles + m_begin / BLOCK_M) * L::STAGED_BYTES;
    // Items run from the group's last query head and tile down to its first head's tile
    // m_begin: causal blocks end at their own m_begin (BLOCK_N / BLOCK_M tiles later a key
    // tile) but all start at the last tile, so that blocks of a head dispatched together
    // read the same staged tile at about the same time (ascending, they set off tiles
    // apart). The whole backward: "fp32" D=256 -1.8..-2.0% causal and not, D=128 -0.9% /
    // -1.2%, "tf32" within +-1% (ab_trees.py, an A/B/A/B bench_fp32.py); the instrumented
    // dK/dV launch alone (phase_clocks.py) -0.3% causal, -1.7% not: why the call gains
    // more is not settled (BENCHMARKS.md, twenty-fourth session).
    // Item after item by a cursor (head, m, its staged tile's index), without a division:
    // a division at each fetch cost the fetching thread ~30 instructions and a MUFU round
    // trip, and the rest of the block waits for its warp at the next wgmma.
    struct ItemAt {
        int head, m;
        long long tile;
    };
    auto after = [&](ItemAt at) {
        return at.m > 0 ? ItemAt{at.head, at.m - 1, at.tile - 1}
                        : ItemAt{at.head - 1, m_tiles - 1, at.tile - 1 - (n_q_tiles - m_tiles)};
    };
    // Thread 0 only: bytes [from, to) of item's staged query tile (at `at`) into its stage.
    auto copy = [&](int item, ItemAt at, int from, int to, unsigned long long* bar) {
        bulk_copy_to_shared(q_tiles + item % STAGES * L::STAGE_BYTES + from,
                            staged + at.tile * L::STAGED_BYTES + from, to - from, bar);
    };
    // One stage (L::SPLIT_STAGE): Q and dO land on barriers[0], Q^T, dO^T, lse and delta on
    // barriers[1]. The next item's Q and dO copy once every warpgroup has S^T and dP^T,
    // while this item's dV and dK are done; its Q^T and dO^T once those are done, while
    // its S^T and dP^T are. Two stages: a whole stage on its barrier, one item ahead.
    auto fetch_rows = [&](int item, ItemAt at) { copy(item, at, 0, L::ROWS_HALF, &barriers[0]); };
    auto fetch_transposed = [&](int item, ItemAt at) { copy(item, at, L::ROWS_HALF, L::STAGE_BYTES, &barriers[1]); };
    auto fetch = [&](int item, ItemAt at) { copy(item, at, 0, L::STAGE_BYTES, &barriers[item % STAGES]); };
    // L::RING: an item's tiles r = 0..3 (dO, Q, dO^T with lse and delta, Q^T) are the ring's
    // tiles 4 item + r, tile i in slot i % 3 on that slot's barrier (phase i / 3). Tile i
    // is fetched once tile i - 3 is used: dO^T when an item begins (the last item's dK
    // done), Q^T and the next item's dO once S^T and dP^T are, the next item's Q once dV
    // is (so that it lands while dK runs: the pair's S^T waits for it first thing). dP^T
    // (dO) goes first, so that Q lands while it runs; dV (dO^T) before dK, so that Q^T
    // lands while it runs.
    auto ring_slot = [&](int i) { return q_tiles + i % L::RING_SLOTS * L::RING_SLOT; };
    auto ring_fetch = [&](int item, ItemAt at, int r) {
        constexpr int TILE_M = L::TILE_M;
        const int from = r == 0 ? TILE_M : r == 1 ? 0 : r == 2 ? 3 * TILE_M : 2 * TILE_M;  // in the staged tile
        const int i = 4 * item + r;
        // lse and delta come with dO^T
        bulk_copy_to_shared(ring_slot(i), staged + at.tile * L::STAGED_BYTES + from,
                            r == 2 ? TILE_M + L::ROWWISE_BYTES : TILE_M, &barriers[i % L::RING_SLOTS]);
    };
    auto ring_wait = [&](int item, int r) {
        const int i = 4 * item + r;
        mbarrier_wait(&barriers[i % L::RING_SLOTS], i / L::RING_SLOTS % 2);
    };
    // PRODUCER: ring_free[s] completes a phase when every consumer warp is done with the
    // tile in slot s (ring tile i's the (i / 3)-th).
    unsigned long long* const ring_free = barriers + L::RING_SLOTS;
    init_mbarriers<PRODUCER ? L::RING_SLOTS : L::BARRIER_COUNT, PRODUCER ? L::RING_SLOTS : 0, NUM_WARPS>(barriers);
    ItemAt at{group - 1, m_tiles - 1, (long long)(group - 1) * n_q_tiles + m_tiles - 1};  // item's (item 0's)
    if constexpr (PRODUCER) {
        // As attn_bwd_dq_wgmma's producer: registers to the consumers (128 x 40 + 256 x
        // 232 = 384 x 168), every ring tile fetched once the tile three before it is free.
        if (warp >= NUM_WARPS) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
            auto free_wait = [&](int i) {
                if (i >= L::RING_SLOTS) mbarrier_wait(&ring_free[i % L::RING_SLOTS], (i / L::RING_SLOTS - 1) % 2);
            };
            if (warp == NUM_WARPS) {
                if (lane == 0) {
                    ItemAt fetched = at;
                    for (int item = 0; item < n_items; ++item, fetched = after(fetched))
                        for (int r = 0; r < 4; ++r) {
                            free_wait(4 * item + r);
                            ring_fetch(item, fetched, r);
                        }
                }
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    } else if (threadIdx.x == 0) {
        if constexpr (L::RING) {
            if (n_items > 0)
                for (int r = 0; r < 3; ++r) ring_fetch(0, at, r);
        } else if constexpr (L::SPLIT_STAGE) {
            if (n_items > 0) {
                fetch_rows(0, at);
                fetch_transposed(0, at);
            }
        } else {
            ItemAt first = at;
            for (int item = 0; item < STAGES && item < n_items; ++item, first = after(first)) fetch(item, first);
        }
    }

    // K and V, once, from global memory (zeros past the last key), while the first query
    // tiles copy. The fused pass loads K as zeros from the first key no query sees
    // (causal) on too: its K^T multiplies dS, which is 0 there, and NaN or inf in such a
    // key must not reach dQ through 0 * NaN (S^T and dP^T select; dK and dV of such a key
    // are 0 either way).
    const int k_rows = FUSED && CAUSAL ? min(seqlen_k, max(0, seqlen_q + causal_offset)) : seqlen_k;
    // TF32 parts in core-matrix order, or (L::KV_IN_REGISTERS) float32 words in register A order.
    const float* k_rows_at = k + b * k_sb + h_kv * k_sh + n0 * k_ss;
    const float* v_rows_at = v + b * v_sb + h_kv * v_sh + n0 * v_ss;
    constexpr bool KV_WORDS = L::KV_IN_REGISTERS;
    kept_tile_global<KV_WORDS, PASSES, BLOCK_N, D_PAD, THREADS>(k_tile, k_rows_at, k_ss, k_rows - n0, head_dim);
    kept_tile_global<KV_WORDS, PASSES, BLOCK_N, D_PAD, THREADS>(v_tile, v_rows_at, v_ss, seqlen_k - n0, head_dim_v);
    if constexpr (FUSED) {
        __syncthreads();  // K's tile is written
        transpose_core_tile<L::PARTS, BLOCK_N, D_PAD, THREADS>(reinterpret_cast<float*>(smem + L::kt_tile), k_tile);
    }

    float acc[2][CHUNKS][CN / 8][4];  // dV, dK
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) zero_acc(acc[p][c]);
    const unsigned k_addr = wg_smem_addr(k_tile) + key_wg * 8 * 128;  // the warpgroup's 8 row groups
    const unsigned v_addr = wg_smem_addr(v_tile) + key_wg * 8 * 128;
    // L::KV_IN_REGISTERS: this lane's words of k-step 0 in its warp's 16 keys.
    const float4* k_words = reinterpret_cast<const float4*>(k_tile) + (key_wg * 4 + warp % 4) * K_STEPS * 32 + lane;
    const float4* v_words = reinterpret_cast<const float4*>(v_tile) + (key_wg * 4 + warp % 4) * K_STEPS * 32 + lane;
    const unsigned col_bytes = col0 / 8 * 128;  // its columns' core matrices in a transposed tile
    // The consumers meet: the whole block, or (PRODUCER) its first THREADS threads.
    auto consumers_barrier = [] {
        if constexpr (PRODUCER)
            leading_threads_barrier(6, THREADS);
        else
            __syncthreads();
    };
    // PRODUCER: this warp is done with ring tile i.
    auto ring_done = [&](int i) { mbarrier_arrive_warp(&ring_free[i % L::RING_SLOTS]); };
    fence_proxy_async();
    consumers_barrier();  // K's and V's TF32 tiles (and K^T) written (and visible to wgmma)

    for (int item = 0; item < n_items; ++item) {
        if (item > 0) at = after(at);  // (inside the block below it changed the fused kernels' SASS: unmeasured)
        if (!PRODUCER && item > 0) {
            // Every warpgroup is done with the last item's stage (one stage: its second
            // half) and its dS.
            __syncthreads();
            if constexpr (L::RING) {
                if (threadIdx.x == 0) ring_fetch(item, at, 2);
            } else if constexpr (L::SPLIT_STAGE) {
                if (threadIdx.x == 0) fetch_transposed(item, at);
            } else {
                static_assert(STAGES == 2 || L::RING || L::SPLIT_STAGE, "two stages: item + 1 is fetched here");
                if (threadIdx.x == 0 && item - 1 + STAGES < n_items) fetch(item - 1 + STAGES, after(at));
            }
        }
        const int m0 = m_begin + at.m * BLOCK_M;
        // A warpgroup whose keys are all past the end or after every query's diagonal
        // has nothing to add (uniform per warpgroup, as wgmma needs). With one stage it
        // computes S^T and dP^T all the same and meets the others at the barrier below
        // (skipping the products there cost ptxas up to 11 registers and spills). The
        // first warpgroup always adds: every item sees the block's first key, so each
        // copy is waited for before the next is issued.
        const bool idle = wg_key0 >= seqlen_k || (CAUSAL && wg_key0 > m0 + BLOCK_M - 1 + causal_offset);
        if (!L::SPLIT_STAGE && !L::RING && idle) continue;
        const int stage = item % STAGES;
        unsigned char* tiles = q_tiles + stage * L::STAGE_BYTES;
        unsigned q_addr = wg_smem_addr(tiles), do_addr = q_addr + L::TILE_M;
        unsigned qt_addr = q_addr + 2 * L::TILE_M + col_bytes, dot_addr = q_addr + 3 * L::TILE_M + col_bytes;
        const float* lse_tile = reinterpret_cast<const float*>(tiles + 4 * L::TILE_M);
        if constexpr (L::RING) {
            do_addr = wg_smem_addr(ring_slot(4 * item));
            q_addr = wg_smem_addr(ring_slot(4 * item + 1));
            dot_addr = wg_smem_addr(ring_slot(4 * item + 2)) + col_bytes;
            qt_addr = wg_smem_addr(ring_slot(4 * item + 3)) + col_bytes;
            lse_tile = reinterpret_cast<const float*>(ring_slot(4 * item + 2) + L::TILE_M);
        }
        const float* delta_tile = lse_tile + BLOCK_M;

        float sdp[2][M_BLOCKS][4];  // S^T, dP^T
        if constexpr (D_SPLIT == 2) {
            // The pair's first warpgroup computes S^T = K Q^T, the second dP^T = V dO^T
            // (products with head-dim k, two thirds of the work at 256), each in the same
            // order as one warpgroup does both; each writes its product over the operand
            // tile it has just used (Q's, dO's) and reads the other's back.
            const int product = wg % 2;  // 0: S^T, 1: dP^T
            float own[M_BLOCKS][4];
            // S^T over Q's tile, dP^T over dO's.
            float4* const swap[2] = {reinterpret_cast<float4*>(L::RING ? ring_slot(4 * item + 1) : tiles),
                                     reinterpret_cast<float4*>(L::RING ? ring_slot(4 * item) : tiles + L::TILE_M)};
            if constexpr (L::RING) {
                // Each warpgroup waits for its operand's tile only; its next wait on the
                // other's barrier comes after the __syncthreads below, so after that
                // tile's phase has completed (a parity wait must not skip a phase).
                ring_wait(item, product == 0 ? 1 : 0);
            } else {
                mbarrier_wait(&barriers[L::SPLIT_STAGE ? 0 : stage], (item / STAGES) % 2);
            }
            one_of_two_products<PASSES, L::KV_IN_REGISTERS, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, SCORE_DEPTH,
                                L::SCORE_PARTS_AS_ROWS>(
                own, product, {k_words, v_words}, {k_addr, v_addr}, KV_PART * 4, {q_addr, do_addr}, Q_PART * 4);
            swap_pair_products<M_BLOCKS, PRODUCER ? THREADS : 0>(sdp, own, swap, product, warp % 4, lane);
            if constexpr (PRODUCER) {
                ring_done(4 * item);  // dO's and Q's slots (the swap's too): read
                ring_done(4 * item + 1);
            } else if constexpr (L::RING || L::SPLIT_STAGE) {
                __syncthreads();  // (with two stages, the next item's first barrier orders them)
            }
            if constexpr (PRODUCER) {
                ring_wait(item, 2);
            } else if constexpr (L::RING) {
                if (threadIdx.x == 0) {
                    ring_fetch(item, at, 3);
                    if (item + 1 < n_items) ring_fetch(item + 1, after(at), 0);
                }
                ring_wait(item, 2);
            }
        } else if constexpr (L::RING) {
            ring_wait(item, 0);
            one_of_two_products<PASSES, L::KV_IN_REGISTERS, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, SCORE_DEPTH,
                                L::SCORE_PARTS_AS_ROWS>(
                sdp[1], 1, {k_words, v_words}, {k_addr, v_addr}, KV_PART * 4, {q_addr, do_addr}, Q_PART * 4);
            ring_wait(item, 1);
            one_of_two_products<PASSES, L::KV_IN_REGISTERS, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, SCORE_DEPTH,
                                L::SCORE_PARTS_AS_ROWS>(
                sdp[0], 0, {k_words, v_words}, {k_addr, v_addr}, KV_PART * 4, {q_addr, do_addr}, Q_PART * 4);
            __syncthreads();  // every warpgroup is done with dO and Q
            if (threadIdx.x == 0) {
                ring_fetch(item, at, 3);
                if (item + 1 < n_items) ring_fetch(item + 1, after(at), 0);
            }
            if (idle) continue;
            ring_wait(item, 2);
        } else {
            mbarrier_wait(&barriers[L::SPLIT_STAGE ? 0 : stage], (item / STAGES) % 2);
            if constexpr (L::KV_IN_REGISTERS)
                words_by_rows<2, BLOCK_M, K_STEPS, BLOCK_M, L::SCORE_PARTS_AS_ROWS, SCORE_DEPTH>(
                    sdp, {k_words, v_words}, {q_addr, do_addr}, Q_PART * 4);
            else
                rows_by_rows<PASSES, 2, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, false, SCORE_DEPTH>(
                    sdp, {k_addr, v_addr}, KV_PART * 4, {q_addr, do_addr}, Q_PART * 4);
        }
        if constexpr (L::SPLIT_STAGE) {
            if constexpr (D_SPLIT == 1) __syncthreads();  // every warpgroup is done with Q and dO
            if (threadIdx.x == 0 && item + 1 < n_items) fetch_rows(item + 1, after(at));
            if (idle) continue;
            mbarrier_wait(&barriers[1], item % 2);
        }
        const bool needs_mask = m0 + BLOCK_M > seqlen_q || key0 + 16 > seqlen_k ||
                                (CAUSAL && key0 + 15 > m0 + causal_offset);
        // lse and delta of this lane's query columns (2t, 2t + 1 of each 8), read first; P^T
        // and dS^T of every entry computed, then selected (visible_or_zero): no branch.
        float2 lse2[M_BLOCKS], delta2[M_BLOCKS];
#pragma unroll
        for (int j = 0; j < M_BLOCKS; ++j) {
            lse2[j] = *reinterpret_cast<const float2*>(lse_tile + j * 8 + 2 * t);
            delta2[j] = *reinterpret_cast<const float2*>(delta_tile + j * 8 + 2 * t);
        }
#pragma unroll
        for (int j = 0; j < M_BLOCKS; ++j)
#pragma unroll
            for (int e4 = 0; e4 < 4; ++e4) {
                const int key = key0 + g + (e4 / 2) * 8;
                const int row = m0 + j * 8 + 2 * t + e4 % 2;  // its query
                const float p = exp2f(sdp[0][j][e4] * scale_log2 - (e4 % 2 ? lse2[j].y : lse2[j].x));
                const float ds = p * (sdp[1][j][e4] - (e4 % 2 ? delta2[j].y : delta2[j].x));
                sdp[0][j][e4] = visible_or_zero(p, needs_mask, row, key, seqlen_q, seqlen_k, CAUSAL, causal_offset);
                sdp[1][j][e4] = visible_or_zero(ds, needs_mask, row, key, seqlen_q, seqlen_k, CAUSAL, causal_offset);
            }
        Tf32Words<PASSES, 4> a[2][M_BLOCKS];  // P^T and dS^T as register A operands
        a_words(a[0], sdp[0]);
        a_words(a[1], sdp[1]);
        if constexpr (L::RING) {
            regs_by_transposed<PASSES, 1, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(just_one(acc[0]), just_one(a[0]), {dot_addr},
                                                                         Q_PART * 4);
            // Every warpgroup that adds is done with dO^T (the idle ones, which skip dV and
            // dK, are the last: their keys come after the others'), so the next item's Q
            // may take its slot.
            if constexpr (PRODUCER) {
                ring_done(4 * item + 2);  // dO^T's slot (and its lse and delta): read
            } else {
                const int last_key = min(seqlen_k - 1, CAUSAL ? m0 + BLOCK_M - 1 + causal_offset : seqlen_k - 1);
                const int adding_key_wgs = min(BLOCK_N / 64, max(0, last_key - n0) / 64 + 1);
                leading_threads_barrier(5, adding_key_wgs * D_SPLIT * 128);
                if (threadIdx.x == 0 && item + 1 < n_items) ring_fetch(item + 1, after(at), 1);
            }
            ring_wait(item, 3);
            regs_by_transposed<PASSES, 1, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(just_one(acc[1]), just_one(a[1]), {qt_addr},
                                                                         Q_PART * 4);
            if constexpr (PRODUCER) ring_done(4 * item + 3);  // Q^T's slot: read
        } else if constexpr (!FUSED) {
            regs_by_transposed<PASSES, 2, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(acc, a, {dot_addr, qt_addr}, Q_PART * 4);
        } else {
            float* ds = reinterpret_cast<float*>(smem + L::ds_tiles + wg * L::DS_TILE);
            store_ds_tile<PASSES, BLOCK_M, M_BLOCKS>(ds, sdp[1], (warp % 4) * 16, lane);
            fence_proxy_async();
            warpgroup_barrier(wg);  // the warpgroup's dS is written (and visible to wgmma)
            const unsigned kt_addr = wg_smem_addr(smem + L::kt_tile) + wg * 16 * (D_PAD / 8) * 128;
            float dqt[D_PAD / 64][1][BLOCK_M / 8][4];
            if constexpr (PASSES == 1) {  // dV, dK and dQ^T issued together, one wait
                regs_by_transposed<PASSES, 2, CN, CHUNKS, M_BLOCKS, KG, D_PAD, true>(acc, a, {dot_addr, qt_addr},
                                                                                      Q_PART * 4);
                dq_of_keys<PASSES, D_PAD, BLOCK_M, BLOCK_N, true>(dqt, kt_addr, wg_smem_addr(ds));
                wgmma_commit();
                wgmma_wait<0>();
                fence_transposed_operands(acc, a);
#pragma unroll
                for (int i = 0; i < D_PAD / 64; ++i) fence_operand(dqt[i][0]);
            } else {
                regs_by_transposed<PASSES, 2, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(acc, a, {dot_addr, qt_addr},
                                                                                Q_PART * 4);
                dq_of_keys<PASSES, D_PAD, BLOCK_M, BLOCK_N, false>(dqt, kt_addr, wg_smem_addr(ds));
            }
            const int h_q = h_kv * group + at.head;
            add_dq_rows<D_PAD, BLOCK_M>(dq.dq + b * dq.sb + h_q * dq.sh + (long long)m0 * dq.ss, dq.ss, dqt, ds, scale,
                                        seqlen_q - m0, head_dim, wg, lane);
        }
    }

    const long long at_k = b * dk_sb + h_kv * dk_sh + key0 * dk_ss + col0;
    const long long at_v = b * dv_sb + h_kv * dv_sh + key0 * dv_ss + col0;
    store_wg_acc<CHUNKS, CN>(dk + at_k, dk_ss, acc[1], scale, seqlen_k - key0, head_dim - col0, lane);
    store_wg_acc<CHUNKS, CN>(dv + at_v, dv_ss, acc[0], 1.0f, seqlen_k - key0, head_dim_v - col0, lane);
}

#define CUPYATTN_DKDV_WGMMA_PARAMS                                                                              \
    const float *__restrict__ q, const float *__restrict__ k, const float *__restrict__ v,                     \
        const float *__restrict__ dout, const float *__restrict__ lse, const float *__restrict__ delta,        \
        float *__restrict__ dk, float *__restrict__ dv, long long q_sb, long long q_ss, long long q_sh,        \
        long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh,        \
        long long do_sb, long long do_ss, long long do_sh, long long dk_sb, long long dk_ss, long long dk_sh,  \
        long long dv_sb, long long dv_ss, long long dv_sh, int n_heads_q, int n_heads_kv, int seqlen_q,        \
        int seqlen_k, int head_dim, int head_dim_v, int num_n_tiles, float scale, float scale_log2,            \
        int causal_offset, const float *__restrict__ q_staged
#define CUPYATTN_DKDV_WGMMA_ARGS                                                                                \
    k, v, dk, dv, k_sb, k_ss, k_sh, v_sb, v_ss, v_sh, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, n_heads_q,     \
        n_heads_kv, seqlen_q, seqlen_k, head_dim, head_dim_v, num_n_tiles, scale, scale_log2, causal_offset,   \
        q_staged

// attn_bwd_dkdv_wgmma's producer warpgroup: where a pair of warpgroups shares 64 keys and
// the query tiles stream through the ring (plan.BwdDkdvWgmmaConfig.producer_warp), a third
// warpgroup issues the ring's copies as soon as every consumer warp has freed a slot, so
// that no consumer meets the others at a block barrier to free one or waits for the
// thread that issues a copy. 3xTF32 only: with it (and dQ's), "fp32" D=256 (16,64,8)
// -0.3..-1.2% not causal, -2.3..-4.2% causal in three A/Bs; "tf32" (32,64,8) +4.3..+5.3%
// not causal (twenty-third session).
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS>
__host__ __device__ constexpr bool dkdv_producer_warp() {
    return BwdDkdvWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>::RING && 16 * NUM_WARPS / BLOCK_N == 2 && Op::passes == 3;
}

// q, dout, lse and delta stay in the launch signature every dK/dV kernel shares (Q, dO,
// lse and delta come through q_staged).
template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void __launch_bounds__(NUM_WARPS * 32 + (dkdv_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>() ? 128 : 0), 1)
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

// attn_bwd_dq_wgmma's producer warpgroup: where a pair of warpgroups shares 64 rows and
// one stage fits (plan.BwdDqWgmmaConfig.producer_warp; "fp32" from head dim 184), a third
// warpgroup issues the copies of the next K and V and of K^T as soon as every consumer
// warp has arrived at that part's "free" barrier, so that no consumer meets the others at
// a block barrier to free a part or waits for the thread that issues a copy ("fp32"
// D=256 backward -0.5% / -0.6% with this one alone, twenty-third session).
template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS>
__host__ __device__ constexpr bool dq_producer_warp() {
    return BwdDqWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>::SPLIT_STAGE && 16 * NUM_WARPS / BLOCK_M == 2;
}

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
    constexpr int PASSES = Op::passes;
    constexpr bool PRODUCER = dq_producer_warp<Op, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS>();
    using L = BwdDqWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N, PRODUCER>;
    constexpr int THREADS = NUM_WARPS * 32;  // the consumers (a producer warpgroup comes after them)
    constexpr int K_STEPS = D_PAD / 8;
    constexpr int N_BLOCKS = BLOCK_N / 8;  // 8-key column blocks of S, the k-steps of dS K
    // D_SPLIT = 2: two warpgroups share 64 query rows, each with half of dQ's columns; the
    // first computes S, the second dP, and they swap them through shared memory
    // (plan.BwdDqWgmmaConfig.d_split: at head dims where one warpgroup a block is all
    // that fits, twice the warps to hide the split's and the adds' latency).
    constexpr int D_SPLIT = 16 * NUM_WARPS / BLOCK_M, D_WG = D_PAD / D_SPLIT;
    constexpr int CN = chunk_columns<PASSES, D_WG>();
    constexpr int CHUNKS = D_WG / CN;
    constexpr int KG = PASSES == 3 && N_BLOCKS > 4 ? 4 : N_BLOCKS;
    // As dK/dV's; at 144-160 of dQ's columns a warpgroup, 3 (4 took 248-255 registers);
    // above, 2 ((64,16,4) at 240-256 spilled 108-252 bytes at 3).
    constexpr int SCORE_DEPTH = PASSES == 3 && BLOCK_N == 16 ? (D_WG <= 128 ? 4 : D_WG <= 160 ? 3 : 2) : 2;
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_M * D_SPLIT == 16 * NUM_WARPS && (D_SPLIT == 1 || BLOCK_M == 64),
                  "each warpgroup owns 64 query rows, or a pair (the only one of its block) shares them");
    static_assert(D_WG % 16 == 0, "a warpgroup's columns");
    static_assert(BLOCK_N == 16 || BLOCK_N == 32 || BLOCK_N == 64, "wgmma.cuh has n16, n32, n64");
    static_assert(D_PAD % 16 == 0 && N_BLOCKS % KG == 0, "tile shape");
    constexpr int Q_PART = BLOCK_M * D_PAD, KV_PART = BLOCK_N * D_PAD;
    constexpr bool P_BEFORE_DP = D_SPLIT == 1 && PASSES == 3 && BLOCK_N == 64;  // (scores below)

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
    // K and V come through kv_staged (stage_keys_tf32<..., true>); k_*, v_* stay in the
    // launch signature every dQ kernel shares.
    const int n_kv_tiles = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(kv_staged) +
                                  (long long)(qb.b * n_heads_kv + qb.h_kv) * n_kv_tiles * L::STAGED_BYTES;

    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;
    // Thread 0 only: bytes [from, to) of key tile `tile` into its stage.
    auto copy = [&](int tile, int from, int to, unsigned long long* bar) {
        bulk_copy_to_shared(kv_tiles + tile % STAGES * L::STAGE_BYTES + from,
                            staged + (long long)tile * L::STAGED_BYTES + from, to - from, bar);
    };
    // One stage (L::SPLIT_STAGE): K and V land on barriers[0], K^T on barriers[1]. The next
    // tile's K and V copy once every warpgroup has S and dP, while this tile's dQ is
    // added; its K^T once that is done, while its S and dP are. Two stages: a whole
    // stage on its barrier, one tile ahead.
    auto fetch_kv = [&](int tile) { copy(tile, 0, L::KV_PART_BYTES, &barriers[0]); };
    auto fetch_kt = [&](int tile) { copy(tile, L::KV_PART_BYTES, L::STAGE_BYTES, &barriers[1]); };
    auto fetch = [&](int tile) { copy(tile, 0, L::STAGE_BYTES, &barriers[tile % STAGES]); };
    // PRODUCER: barriers[2] and [3] complete a phase when every consumer warp is done
    // with a tile's K and V (its S and dP swapped) and with its K^T (dQ added).
    unsigned long long* const kv_free = &barriers[2];
    unsigned long long* const kt_free = &barriers[3];
    init_mbarriers<PRODUCER ? 2 : L::BARRIER_COUNT, PRODUCER ? 2 : 0, NUM_WARPS>(barriers);
    if constexpr (PRODUCER) {
        // Registers move from the producer warpgroup, which issues every copy, to the
        // consumers (a 384-thread block gets 168 a thread at launch: 128 x 40 + 256 x 232
        // is the same register file). Split right after the barriers' setup, so that the
        // consumers' loads of Q and dO run with their 232 too.
        if (warp >= NUM_WARPS) {
            asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
            if (warp == NUM_WARPS) {
                if (lane == 0)  // tile t's parts once tile t - 1's are free
                    for (int tile = 0; tile < n_tiles; ++tile) {
                        if (tile > 0) mbarrier_wait(kv_free, (tile - 1) % 2);
                        fetch_kv(tile);
                        if (tile > 0) mbarrier_wait(kt_free, (tile - 1) % 2);
                        fetch_kt(tile);
                    }
            }
            return;
        }
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
    } else if (threadIdx.x == 0) {
        if constexpr (L::SPLIT_STAGE) {
            if (n_tiles > 0) {
                fetch_kv(0);
                fetch_kt(0);
            }
        } else {
            for (int tile = 0; tile < STAGES && tile < n_tiles; ++tile) fetch(tile);
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
    // The consumers meet: the whole block, or (PRODUCER) its first THREADS threads.
    auto consumers_barrier = [] {
        if constexpr (PRODUCER)
            leading_threads_barrier(6, THREADS);
        else
            __syncthreads();
    };
    fence_proxy_async();
    consumers_barrier();  // Q's and dO's TF32 tiles written (and visible to wgmma)

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % STAGES;
        const unsigned k_addr = wg_smem_addr(kv_tiles + stage * L::STAGE_BYTES);
        const unsigned v_addr = k_addr + L::TILE_N, kt_addr = k_addr + 2 * L::TILE_N;
        const int n0 = tile * BLOCK_N;
        if (!PRODUCER && tile > 0) {
            // Every warpgroup is done with the last tile's stage (one stage: its K^T).
            __syncthreads();
            if constexpr (L::SPLIT_STAGE) {
                if (threadIdx.x == 0) fetch_kt(tile);
            } else {
                if (threadIdx.x == 0 && tile - 1 + STAGES < n_tiles) fetch(tile - 1 + STAGES);
            }
        }
        mbarrier_wait(&barriers[L::SPLIT_STAGE ? 0 : stage], (tile / STAGES) % 2);
        const bool idle = CAUSAL && n0 > wg_row0 + 63 + causal_offset;  // uniform per warpgroup
        float sdp[2][N_BLOCKS][4];  // S (or P: P_BEFORE_DP), dP
        // P of a score in this lane's row `half` (g or g + 8 of its warp's 16).
        auto probability = [&](float s, int half) { return exp2f(s * scale_log2 - lse_log2[half]); };
        auto scores = [&] {
            if constexpr (D_SPLIT == 2) {
                // As dK/dV's pair: each computes one product, in the order one warpgroup
                // computes both, writes it over the tile only it has read (S over K's, dP
                // over V's) and reads the other's back. The caller's next barrier orders
                // these reads before the copies that refill the tiles.
                const int product = wg % 2;  // 0: S, 1: dP
                float own[N_BLOCKS][4];
                one_of_two_products<PASSES, L::Q_IN_REGISTERS, BLOCK_N, K_STEPS, BLOCK_M, BLOCK_N, SCORE_DEPTH,
                                    L::SCORE_PARTS_AS_ROWS>(
                    own, product, {q_words, do_words}, {q_addr, do_addr}, Q_PART * 4, {k_addr, v_addr}, KV_PART * 4);
                float4* const swap[2] = {reinterpret_cast<float4*>(kv_tiles + stage * L::STAGE_BYTES),
                                         reinterpret_cast<float4*>(kv_tiles + stage * L::STAGE_BYTES + L::TILE_N)};
                swap_pair_products<N_BLOCKS, PRODUCER ? THREADS : 0>(sdp, own, swap, product, warp % 4, lane);
            } else if constexpr (P_BEFORE_DP) {
                // 3xTF32 with 64-key tiles: S, P = exp2(S - lse), then dP (one product's
                // fresh accumulators at a time, as dK/dV's ring computes them), for the
                // registers. P before dP, not S and dP then P: with nothing between the
                // two products ptxas (NVRTC 13.5) compiled them as one at head dims up to
                // 48, dP's wgmmas and adds gone (empty HGMMAs in their place) and S used as
                // dP (dQ errors of 3-9, twenty-first session; test_compile checks the wgmma
                // kernels' SASS for empty HGMMAs).
                one_of_two_products<PASSES, L::Q_IN_REGISTERS, BLOCK_N, K_STEPS, BLOCK_M, BLOCK_N, 2, L::SCORE_PARTS_AS_ROWS>(
                    sdp[0], 0, {q_words, do_words}, {q_addr, do_addr}, Q_PART * 4, {k_addr, v_addr}, KV_PART * 4);
#pragma unroll
                for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                    for (int e4 = 0; e4 < 4; ++e4) sdp[0][j][e4] = probability(sdp[0][j][e4], e4 / 2);
                one_of_two_products<PASSES, L::Q_IN_REGISTERS, BLOCK_N, K_STEPS, BLOCK_M, BLOCK_N, 2, L::SCORE_PARTS_AS_ROWS>(
                    sdp[1], 1, {q_words, do_words}, {q_addr, do_addr}, Q_PART * 4, {k_addr, v_addr}, KV_PART * 4);
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
                mbarrier_arrive_warp(kv_free);  // this warp is done with K and V
            } else {
                __syncthreads();  // every warpgroup is done with K and V
                if (threadIdx.x == 0 && tile + 1 < n_tiles) fetch_kv(tile + 1);
            }
            mbarrier_wait(&barriers[1], tile % 2);
        }
        // A causal block's last tile may reach past every key its rows see (n_end; the
        // staging zero-fills past seqlen_k only): K^T is zeroed there, so that NaN or inf
        // in keys no row may see cannot reach dQ through 0 * NaN (S and dP select).
        if (CAUSAL && n0 + BLOCK_N > n_end && n_end < seqlen_k) {
            zero_transposed_rows<L::PARTS, BLOCK_N, D_PAD, THREADS>(
                reinterpret_cast<float*>(kv_tiles + stage * L::STAGE_BYTES + 2 * L::TILE_N), n_end - n0);
            fence_proxy_async();
            consumers_barrier();
        }
        if (idle) {
            if constexpr (PRODUCER) mbarrier_arrive_warp(kt_free);
            continue;
        }
        if constexpr (!L::SPLIT_STAGE) scores();
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
        Tf32Words<PASSES, 4> a[1][N_BLOCKS];  // dS as the register A operand
        a_words(a[0], sdp[1]);
        // 3xTF32: two fresh accumulators alternate (BUFS = 2), each chunk's add running while
        // the next chunk's products do (no spills at the planned tiles; 216 registers at 128).
        regs_by_transposed<PASSES, 1, CN, CHUNKS, N_BLOCKS, KG, D_PAD, false, 2>(dq_acc, a, {kt_addr + col_bytes},
                                                                              KV_PART * 4);
        if constexpr (PRODUCER) mbarrier_arrive_warp(kt_free);  // this warp is done with K^T
    }

    store_wg_acc<CHUNKS, CN>(dq + qb.b * dq_sb + qb.h * dq_sh + (long long)warp_row0 * dq_ss + col0, dq_ss, dq_acc[0],
                             scale, seqlen_q - warp_row0, head_dim - col0, lane);
}

}  // namespace cupyattn
