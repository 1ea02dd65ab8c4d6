// TF32 tiles staged once per call for the wgmma kernels (sm_90a): every tile a kernel
// streams (key tiles for the forward and dQ, query tiles for dK/dV) written to global
// memory exactly as that kernel's shared memory holds one pipeline stage, so that the
// kernel copies it whole (cp.async.bulk) instead of every block splitting every tile
// again (attn_fwd_wgmma.cuh says what that cost). Tiles of R rows: the row tile
// (split_rows_global order) and, where a product reduces over the rows, the transposed tile
// (slots permuted within 8 for a register A operand: wgmma_tiles.cuh), TF32
// parts PART words apart, zeros past the sequence and the head dim.
//
//   stage_keys_tf32<Op, D_PAD, BLOCK_N, DQ, TRANSPOSED, PARTS_AS_ROWS>: per (batch, kv head,
//     key tile), tiles of a head consecutive: the forward's [K | V^T], dQ's (DQ) [K | V | K^T].
//   stage_queries_tf32<Op, D_PAD, BLOCK_M, TRANSPOSED, PARTS_AS_ROWS>: per (batch, query head, query
//     tile), dK/dV's [Q | dO | Q^T | dO^T | lse * log2(e) | delta] (BLOCK_M floats each, 0
//     past the end); delta = rowsum(dO * O) computed here and written to delta too (the dQ
//     pass reads it).
// TRANSPOSED is always true (the transposed tiles are staged): it stays a parameter of both
// kernels only because the planner's names of the PARTS_AS_ROWS launches spell it.
// PARTS_AS_ROWS (3xTF32, the backward's 16-row tiles whose row tiles are the B operands of
// words_by_rows' score products): each row tile's big part as its first R rows and its
// small part as the next R of one 2R-row core-matrix tile, so that one wgmma reads both
// parts as one B operand twice as wide (the same bytes; transposed tiles as before).
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
// check_layout for a kernel fed by staged tiles, which also pins the bytes of one staged
// tile in global memory (plan.StagingConfig.tile_bytes: what the planner allocates and
// the staging launch writes) to those the kernel steps by (Layout::STAGED_BYTES).
// The staged row tiles' parts as rows or apart (PARTS_AS_ROWS) are pinned the same way.
template <class Layout, int STAGED_BYTES, bool PARTS_AS_ROWS, int TOTAL, int... OFFSETS>
__global__ void check_staged_layout() {
    static_assert(LayoutAgrees<Layout, TOTAL, OFFSETS...>::value, "");
    static_assert(Layout::STAGED_BYTES == STAGED_BYTES, "planner and kernel disagree on the bytes of a staged tile");
    static_assert(Layout::SCORE_PARTS_AS_ROWS == PARTS_AS_ROWS,
                  "planner and kernel disagree on where a staged row tile's small part is");
}

constexpr int STAGING_THREADS = 128;
constexpr int STAGING_PIECE = 16;  // rows per transposed piece: the transposed tile is 8-row groups in order

// One operand's R global rows (row stride `stride`, zeros from row valid_rows and
// column valid_cols on) as its row tile (ROWS: split_rows_global's order) and / or its
// transposed tile (TRANSPOSED: split_transposed's order, rows as slots permuted within 8),
// 16 rows at a time: each piece lands in shared memory with coalesced 16-byte cp.async
// (the next one in flight while this one is written out), and both tiles are written
// from it as 16-byte words, consecutive threads at consecutive words. The operand is
// read from global memory once whichever tiles it gives. PARTS_AS_ROWS: the row tile's
// small part as rows R..2R-1 of one 2R-row tile (its first R rows the big part).
template <int PASSES, int R, int D_PAD, bool ROWS, bool TRANSPOSED, bool PARTS_AS_ROWS = false>
__device__ __forceinline__ void stage_operand(float* rows_out, float* transposed_out, int part, const float* src,
                                              long long stride, int valid_rows, int valid_cols,
                                              float (&raw)[2][STAGING_PIECE * (D_PAD + 4)]) {
    constexpr int P = STAGING_PIECE, RAW_STRIDE = D_PAD + 4, PIECES = R / P, THREADS = STAGING_THREADS;
    static_assert(R % P == 0 && D_PAD % 16 == 0, "tiles of 16-row pieces");
    static_assert(!PARTS_AS_ROWS || PASSES == 3, "two parts");
    constexpr int ROW_TILE_ROWS = PARTS_AS_ROWS ? 2 * R : R;
    auto load = [&](int piece) {
        cp_async_tile<float, P, D_PAD, RAW_STRIDE, THREADS>(raw[piece % 2], src + piece * P * stride, stride,
                                                            valid_rows - piece * P, valid_cols);
        cp_async_commit();
    };
    load(0);
#pragma unroll 1
    for (int piece = 0; piece < PIECES; ++piece) {
        if (piece + 1 < PIECES) {
            load(piece + 1);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();  // the piece has landed
        const float* x = raw[piece % 2];
        if constexpr (ROWS) {
            // Row r, columns c..c+3 at core_offset<R>(r, c): a 4-column chunk's 16 rows are
            // 16 consecutive words (PARTS_AS_ROWS: core_offset<2R>, small R rows on).
            float* const small_out = rows_out + (PARTS_AS_ROWS ? (R / 8) * 32 : part);
#pragma unroll 1
            for (int n = threadIdx.x; n < P * D_PAD / 4; n += THREADS) {
                const int j = n % P, c = n / P * 4;
                const float4 v = *reinterpret_cast<const float4*>(x + j * RAW_STRIDE + c);
                store_parts<PASSES>(rows_out, small_out, core_offset<ROW_TILE_ROWS>(piece * P + j, c), v);
            }
        }
        if constexpr (TRANSPOSED) {
            // Slots 4q..4q+3 of column d at core_offset<D_PAD>(d, 4q): the piece's 16 slots
            // are 4 runs of D_PAD words. Slot s of each 8 holds row 2s (s < 4) or 2(s - 4) + 1.
#pragma unroll 1
            for (int n = threadIdx.x; n < P * D_PAD / 4; n += THREADS) {
                const int d = n % D_PAD, q = n / D_PAD;
                const float* col = x + (q / 2 * 8 + q % 2) * RAW_STRIDE + d;  // rows q%2, +2, +4, +6 of 8
                const float4 v = make_float4(col[0], col[2 * RAW_STRIDE], col[4 * RAW_STRIDE], col[6 * RAW_STRIDE]);
                store_parts<PASSES>(transposed_out, transposed_out + part, core_offset<D_PAD>(d, piece * P + 4 * q), v);
            }
        }
        __syncthreads();  // the piece is read before load(piece + 2) overwrites its buffer
    }
}

template <typename Op, int D_PAD, int BLOCK_N, bool DQ, bool TRANSPOSED = true, bool PARTS_AS_ROWS = false>
__global__ void
__launch_bounds__(STAGING_THREADS)
stage_keys_tf32(const float* __restrict__ k, const float* __restrict__ v, float* __restrict__ staged,
                long long k_sb, long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh,
                int n_heads_kv, int seqlen_k, int head_dim, int n_tiles) {
    constexpr int PASSES = Op::passes, PARTS = PASSES == 3 ? 2 : 1;
    constexpr int PART = BLOCK_N * D_PAD;  // words per TF32 part
    constexpr int TILES = DQ ? 3 : 2;
    static_assert(TRANSPOSED, "the transposed tiles are staged");
    static_assert(DQ || !PARTS_AS_ROWS, "the forward's K tile: parts apart");
    __shared__ __align__(16) float raw[2][STAGING_PIECE * (D_PAD + 4)];
    const int tile = blockIdx.x % n_tiles, bh = blockIdx.x / n_tiles;
    const int b = bh / n_heads_kv, h = bh % n_heads_kv, n0 = tile * BLOCK_N;
    float* out = staged + (long long)blockIdx.x * TILES * PARTS * PART;
    k += b * k_sb + h * k_sh + n0 * k_ss;
    v += b * v_sb + h * v_sh + n0 * v_ss;
    const int rows = seqlen_k - n0;
    if constexpr (DQ) {  // [K | V | K^T]
        stage_operand<PASSES, BLOCK_N, D_PAD, true, true, PARTS_AS_ROWS>(out, out + 2 * PARTS * PART, PART, k,
                                                                               k_ss, rows, head_dim, raw);
        stage_operand<PASSES, BLOCK_N, D_PAD, true, false, PARTS_AS_ROWS>(out + PARTS * PART, nullptr, PART, v, v_ss,
                                                                          rows, head_dim, raw);
    } else {  // [K | V^T]
        stage_operand<PASSES, BLOCK_N, D_PAD, true, false>(out, nullptr, PART, k, k_ss, rows, head_dim, raw);
        stage_operand<PASSES, BLOCK_N, D_PAD, false, true>(nullptr, out + PARTS * PART, PART, v, v_ss, rows, head_dim,
                                                           raw);
    }
}

template <typename Op, int D_PAD, int BLOCK_M, bool TRANSPOSED = true, bool PARTS_AS_ROWS = false>
__global__ void __launch_bounds__(STAGING_THREADS)
stage_queries_tf32(const float* __restrict__ q, const float* __restrict__ dout, const float* __restrict__ o,
                   const float* __restrict__ lse, float* __restrict__ delta, float* __restrict__ staged,
                   long long q_sb, long long q_ss, long long q_sh, long long do_sb, long long do_ss, long long do_sh,
                   long long o_sb, long long o_ss, long long o_sh, int n_heads_q, int seqlen_q, int head_dim,
                   int n_tiles) {
    constexpr int PASSES = Op::passes, PARTS = PASSES == 3 ? 2 : 1;
    constexpr int PART = BLOCK_M * D_PAD;
    constexpr int WARPS = STAGING_THREADS / 32, WARP_ROWS = BLOCK_M / WARPS;
    static_assert(BLOCK_M % WARPS == 0, "rows of delta: as many a warp");
    static_assert(TRANSPOSED, "the transposed tiles are staged");
    __shared__ __align__(16) float raw[2][STAGING_PIECE * (D_PAD + 4)];
    const int tile = blockIdx.x % n_tiles, bh = blockIdx.x / n_tiles;
    const int b = bh / n_heads_q, h = bh % n_heads_q, m0 = tile * BLOCK_M;
    constexpr int TILES = 4;  // [Q | dO | Q^T | dO^T]
    float* out = staged + (long long)blockIdx.x * (TILES * PARTS * PART + 2 * BLOCK_M);
    q += b * q_sb + h * q_sh + m0 * q_ss;
    dout += b * do_sb + h * do_sh + m0 * do_ss;
    o += b * o_sb + h * o_sh + m0 * o_ss;
    const int rows = seqlen_q - m0;
    stage_operand<PASSES, BLOCK_M, D_PAD, true, true, PARTS_AS_ROWS>(out, out + 2 * PARTS * PART, PART, q, q_ss,
                                                                           rows, head_dim, raw);
    stage_operand<PASSES, BLOCK_M, D_PAD, true, true, PARTS_AS_ROWS>(out + PARTS * PART, out + 3 * PARTS * PART,
                                                                           PART, dout, do_ss, rows, head_dim, raw);
    float* rowwise = out + TILES * PARTS * PART;
    const long long at = (long long)bh * seqlen_q + m0;
    for (int i = threadIdx.x; i < BLOCK_M; i += STAGING_THREADS) rowwise[i] = i < rows ? lse[at + i] * LOG2E : 0.0f;
    // delta = rowsum(dO * O) of the tile's rows (dO just read: from L2), for the dQ pass and
    // beside lse for dK/dV, so that no launch of its own reads dO again. Summed as
    // attn_bwd_delta sums a row (lane l adds columns l, l + 32, ..., then the warp's sum):
    // the same bits. A warp's rows i = warp + WARPS r, their loads issued together.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float sum[WARP_ROWS];
#pragma unroll
    for (int r = 0; r < WARP_ROWS; ++r) sum[r] = 0.0f;
#pragma unroll
    for (int d0 = 0; d0 < D_PAD; d0 += 32) {
        const int d = d0 + lane;
#pragma unroll
        for (int r = 0; r < WARP_ROWS; ++r) {
            const int i = warp + WARPS * r;
            if (i < rows && d < head_dim) sum[r] = fmaf(dout[i * do_ss + d], o[i * o_ss + d], sum[r]);
        }
    }
#pragma unroll
    for (int r = 0; r < WARP_ROWS; ++r) {
        const int i = warp + WARPS * r;
        const float s = group_sum<32>(sum[r]);
        if (lane == 0) {
            rowwise[BLOCK_M + i] = i < rows ? s : 0.0f;
            if (i < rows) delta[at + i] = s;
        }
    }
}

}  // namespace cupyattn
