// Forward attention for float32 inputs on Hopper's warpgroup MMA (sm_90a), TF32
// operands: Op = MmaTf32<3> (3xTF32, float32 accuracy) or MmaTf32<1> (one TF32 pass).
//
// Algorithm (FlashAttention-2, as attn_fwd_mma): each warpgroup (4 warps) owns 64
// query rows; per K/V tile of BLOCK_N keys, S = Q K^T by wgmma with both operands in
// shared memory, online softmax on the accumulators (base 2, scale folded in), P
// from the S accumulators as the register A operand of O += P V (wgmma, V from
// shared memory). TF32 B operands must be K-major, so V is stored transposed.
//
// 3xTF32: every operand is split once per block into big = tf32(x) and small = x -
// big, stored apart in shared memory; a product is small*big + big*small + big*big.
// The tensor cores truncate their float32 sums, so long chains of them bias results
// toward zero (mma.cuh): each k-step of S = Q K^T goes to a fresh accumulator that is
// added to S with a rounded add (two accumulators alternate so the next k-step runs
// during the add), and P V sums at most 4 k-steps (12 products) per fresh accumulator
// before its rounded add to O (scripts/tf32_error_model.py, its wgmma column: 0.6-1.0x
// a float32 NumPy reference's error at head dims 64-256; a chain of 3 * D / 8 products
// through S, 3.4-4.7x). One TF32 pass accumulates straight into S and O.
//
// K and V are split once per call, not once per query block: stage_keys_tf32 (wgmma_staging.cuh) writes every
// BLOCK_N-key tile as this kernel's shared memory holds it (K's TF32 parts, then V^T's,
// in core-matrix order), and the forward copies each tile whole with one bulk copy
// (cp.async.bulk) per operand, counted by an mbarrier; one thread issues the copies,
// STAGES tiles ahead, so that no query block splits a key tile itself. With one stage (where two do not
// fit) the next tile's K comes in once every warpgroup is done with S = Q K^T, its V
// once P V is done.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0, 16-byte aligned rows.
// Grid: as attn_fwd_mma. Block: NUM_WARPS = 4 * warpgroups, BLOCK_M = 64 * warpgroups.
//
// Shared memory (FwdWgmmaLayout; same names and order as plan.FwdWgmmaConfig.layout),
// PARTS = 2 (big, small) for 3xTF32, else 1; TF32 tiles in wgmma.cuh's core-matrix order:
//   q_tile   [PARTS][BLOCK_M x D_PAD]                         float
//   kv_tiles [STAGES][K: PARTS][BLOCK_N x D_PAD],
//                    [V^T: PARTS][D_PAD x BLOCK_N]            float  V^T's keys permuted within 8 (below)
//   barriers [STAGES][K, V]                                   mbarrier (8 bytes)
// STAGES = 2 where that fits in sm_90's 232448 bytes, else 1.
#pragma once

#include "mma.cuh"
#include "simt_tiles.cuh"
#include "wgmma.cuh"
#include "wgmma_staging.cuh"
#include "wgmma_tiles.cuh"

namespace cupyattn {

template <typename Op, int D_PAD, int BLOCK_M, int BLOCK_N>
struct FwdWgmmaLayout {
    static constexpr int PARTS = Op::passes == 3 ? 2 : 1;
    // 3xTF32 from head dim 128: Q kept once as float32 in each lane's A-register order
    // and split per k-step in registers (Q_IN_REGISTERS below), half the bytes of two
    // parts, so that larger key tiles or a second stage fit beside it.
    static constexpr bool Q_IN_REGISTERS = Op::passes == 3 && D_PAD >= 128;
    static constexpr int Q_BYTES = (Q_IN_REGISTERS ? 1 : PARTS) * BLOCK_M * D_PAD * 4;
    static constexpr int K_BYTES = PARTS * BLOCK_N * D_PAD * 4;  // one operand of a staged key tile (K or V^T)
    static constexpr int TILE_BYTES = 2 * K_BYTES;
    static constexpr int STAGED_BYTES = TILE_BYTES;  // global, a tile (stage_keys_tf32)
    static constexpr bool SCORE_PARTS_AS_ROWS = false;  // (the backward's: wgmma_staging.cuh, PARTS_AS_ROWS)
    static constexpr int STAGES = stages_that_fit(Q_BYTES, TILE_BYTES, 2);  // barriers: K, V^T
    static constexpr int q_tile = 0;
    static constexpr int kv_tiles = Q_BYTES;
    static constexpr int barriers = kv_tiles + STAGES * TILE_BYTES;
    static constexpr int total = barriers + STAGES * 2 * 8;
    static constexpr int num_buffers = 3;
    static constexpr int offsets[num_buffers] = {q_tile, kv_tiles, barriers};
};

template <typename T, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32, 1)
attn_fwd_wgmma(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
               float* __restrict__ out, float* __restrict__ lse,
               long long q_sb, long long q_ss, long long q_sh,
               long long k_sb, long long k_ss, long long k_sh,
               long long v_sb, long long v_ss, long long v_sh,
               long long o_sb, long long o_ss, long long o_sh,
               int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
               int head_dim, int head_dim_v, int num_m_tiles,
               float scale_log2, int causal_offset, const float* __restrict__ kv_staged) {
    static_assert(same_type<T, float>, "float32 inputs (T is there to name kernels as attn_fwd_mma does)");
    constexpr int PASSES = Op::passes;
    using L = FwdWgmmaLayout<Op, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int N_BLOCKS = BLOCK_N / 8;  // 8-key column blocks of S, the k-steps of P V
    constexpr int K_STEPS = D_PAD / 8;     // k-steps of Q K^T
    // O columns per wgmma of P V: the widest that divides the head dim; 3xTF32 sums
    // into a fresh accumulator of at most 64 columns, one TF32 pass straight into O.
    constexpr int CN_MAX = PASSES == 3 ? 64 : 128;
    constexpr int CN = D_PAD % CN_MAX == 0 ? CN_MAX : D_PAD % 64 == 0 ? 64 : D_PAD % 32 == 0 ? 32 : 16;
    constexpr int O_CHUNKS = D_PAD / CN;
    constexpr int KG = PASSES == 3 && N_BLOCKS > 4 ? 4 : N_BLOCKS;  // k-steps per fresh P V accumulator
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_M == 16 * NUM_WARPS, "each warpgroup owns 64 query rows");
    static_assert(BLOCK_N == 16 || BLOCK_N == 32 || BLOCK_N == 64, "wgmma.cuh has n16, n32, n64");
    static_assert(D_PAD % 16 == 0 && N_BLOCKS % KG == 0, "tile shape");
    using WgS = WgmmaTf32<BLOCK_N>;
    using WgO = WgmmaTf32<CN>;

    constexpr int STAGES = L::STAGES, PARTS = L::PARTS;

    extern __shared__ __align__(128) unsigned char smem[];
    float* q_tile = reinterpret_cast<float*>(smem + L::q_tile);
    unsigned char* kv_tiles = smem + L::kv_tiles;
    unsigned long long* barriers = reinterpret_cast<unsigned long long*>(smem + L::barriers);  // [stage][K, V]
    constexpr int Q_PART = BLOCK_M * D_PAD, KV_PART = BLOCK_N * D_PAD;  // words per TF32 part

    const int warp = warp_uniform_index(), wg = warp / 4;
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    q += qb.b * q_sb + qb.h * q_sh + m0 * q_ss;
    out += qb.b * o_sb + qb.h * o_sh + m0 * o_ss;
    lse += (qb.b * n_heads_q + qb.h) * (long long)seqlen_q + m0;
    // k and v are read through kv_staged (stage_keys_tf32); k_*, v_* stay in the launch
    // signature every forward kernel shares.
    const int n_kv_tiles = (seqlen_k + BLOCK_N - 1) / BLOCK_N;
    const unsigned char* staged =
        reinterpret_cast<const unsigned char*>(kv_staged) + (long long)(qb.b * n_heads_kv + qb.h_kv) * n_kv_tiles * L::STAGED_BYTES;

    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;

    // Thread 0 only: key tile `tile`'s K (which = 0) or V^T (1) into its stage.
    auto fetch = [&](int tile, int which) {
        const int stage = tile % STAGES;
        bulk_copy_to_shared(kv_tiles + stage * L::TILE_BYTES + which * L::K_BYTES,
                            staged + (long long)tile * L::STAGED_BYTES + which * L::K_BYTES, L::K_BYTES,
                            &barriers[2 * stage + which]);
    };
    init_mbarriers<2 * STAGES>(barriers);
    if (threadIdx.x == 0)
        for (int tile = 0; tile < STAGES && tile < n_tiles; ++tile) {
            fetch(tile, 0);
            fetch(tile, 1);
        }

    // Q, once, zeros outside the problem (while the first key tiles copy): TF32 parts in
    // core-matrix order, or (Q_IN_REGISTERS) float32 words in register A order.
    kept_tile_global<L::Q_IN_REGISTERS, PASSES, BLOCK_M, D_PAD, THREADS>(q_tile, q, q_ss, seqlen_q - m0, head_dim);

    float o_acc[O_CHUNKS][CN / 8][4];
#pragma unroll
    for (int c = 0; c < O_CHUNKS; ++c)
#pragma unroll
        for (int j = 0; j < CN / 8; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) o_acc[c][j][e] = 0.0f;
    float m_run[2] = {CUPYATTN_NEG_INF, CUPYATTN_NEG_INF}, l_run[2] = {0.0f, 0.0f};  // rows g, g + 8
    const int wg_row0 = m0 + wg * 64;
    const int warp_row0 = wg_row0 + (warp % 4) * 16;
    const unsigned q_addr = wg_smem_addr(q_tile) + wg * 8 * 128;  // the warpgroup's 8 row groups
    const float4* q_words = reinterpret_cast<const float4*>(q_tile) + warp * K_STEPS * 32 + lane;  // Q_IN_REGISTERS
    const unsigned top19 = L::Q_IN_REGISTERS ? biased_split_mask() : 0u;  // (Tf32Words::set_from_biased)

    fence_proxy_async();
    __syncthreads();  // Q's TF32 tiles written (and visible to wgmma)

    for (int tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % STAGES;
        const unsigned parity = (tile / STAGES) % 2;
        const unsigned k_addr = wg_smem_addr(kv_tiles + stage * L::TILE_BYTES), vt_addr = k_addr + L::K_BYTES;
        const int n0 = tile * BLOCK_N;
        if (tile > 0) {
            __syncthreads();  // every warpgroup is done with the last tile's stage
            if (threadIdx.x == 0 && tile - 1 + STAGES < n_tiles) {
                if (STAGES == 2) fetch(tile - 1 + STAGES, 0);  // with one stage, K came in after S
                fetch(tile - 1 + STAGES, 1);
            }
        }
        // A causal block's last tile may reach past every key its rows see (n_end, which
        // ends the tiles; the staging zero-fills past seqlen_k only): V^T is zeroed there,
        // so that NaN or inf in keys no row may see cannot reach O through 0 * NaN.
        if (CAUSAL && n0 + BLOCK_N > n_end && n_end < seqlen_k) {
            mbarrier_wait(&barriers[2 * stage + 1], parity);
            zero_transposed_rows<PARTS, BLOCK_N, D_PAD, THREADS>(
                reinterpret_cast<float*>(kv_tiles + stage * L::TILE_BYTES + L::K_BYTES), n_end - n0);
            fence_proxy_async();
            __syncthreads();
        }
        // Thread 0 only, one stage: once every warpgroup is done with K, the next tile's K.
        auto release_k = [&] {
            if constexpr (STAGES == 1) {
                __syncthreads();
                if (threadIdx.x == 0 && tile + 1 < n_tiles) fetch(tile + 1, 0);
            }
        };
        // Causal: a warpgroup whose last row precedes this tile's first key has nothing to
        // add (but meets the others at the block barriers).
        if (CAUSAL && n0 > wg_row0 + 63 + causal_offset) {
            release_k();
            continue;
        }

        // S = Q K^T.
        mbarrier_wait(&barriers[2 * stage], parity);
        float s[N_BLOCKS][4];
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) s[j][e] = 0.0f;
        if constexpr (PASSES == 3) {
            float step[2][N_BLOCKS][4];  // k-steps alternate between two fresh accumulators
            Tf32Words<3, 4> q_regs[2];   // Q_IN_REGISTERS: the k-step's A operand, likewise
            // Q_IN_REGISTERS: the next k-step's words, read one k-step ahead (before the wait
            // for the last products, as words_by_rows reads them).
            float4 q_next = L::Q_IN_REGISTERS ? q_words[0] : float4{};
#pragma unroll
            for (int ks = 0; ks < K_STEPS; ++ks) {
                const unsigned ka = ks * 2 * (BLOCK_N / 8) * 128;  // the k-step's bytes on from K's
                const auto k_big = wgmma_desc<BLOCK_N>(k_addr, ka);
                const auto k_small = wgmma_desc<BLOCK_N>(k_addr, ka + KV_PART * 4);
                if constexpr (L::Q_IN_REGISTERS) {
                    // The parts store_parts makes (set_from_biased from the kept
                    // rounding-biased words), so the products are the shared-memory path's.
                    q_regs[ks % 2].set_from_biased(0, q_next.x, top19);
                    q_regs[ks % 2].set_from_biased(1, q_next.y, top19);
                    q_regs[ks % 2].set_from_biased(2, q_next.z, top19);
                    q_regs[ks % 2].set_from_biased(3, q_next.w, top19);
                    if (ks + 1 < K_STEPS) q_next = q_words[(ks + 1) * 32];
                    wgmma_fence();
                    WgS::template rs<false>(step[ks % 2], q_regs[ks % 2].small, k_big);
                    WgS::template rs<true>(step[ks % 2], q_regs[ks % 2].big, k_small);
                    WgS::template rs<true>(step[ks % 2], q_regs[ks % 2].big, k_big);
                } else {
                    const unsigned qa = ks * 2 * (BLOCK_M / 8) * 128;
                    const auto q_big = wgmma_desc<BLOCK_M>(q_addr, qa);
                    const auto q_small = wgmma_desc<BLOCK_M>(q_addr, qa + Q_PART * 4);
                    wgmma_fence();
                    WgS::template ss<false>(step[ks % 2], q_small, k_big);
                    WgS::template ss<true>(step[ks % 2], q_big, k_small);
                    WgS::template ss<true>(step[ks % 2], q_big, k_big);
                }
                wgmma_commit();
                if (ks > 0) {
                    wgmma_wait<1>();
                    fence_operand(step[(ks + 1) % 2]);
                    if constexpr (L::Q_IN_REGISTERS) {  // the last k-step's A words, read by now
                        fence_operand(q_regs[(ks + 1) % 2].big);
                        fence_operand(q_regs[(ks + 1) % 2].small);
                    }
#pragma unroll
                    for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) s[j][e] += step[(ks + 1) % 2][j][e];
                }
            }
            wgmma_wait<0>();
            fence_operand(step[(K_STEPS - 1) % 2]);
            if constexpr (L::Q_IN_REGISTERS) {
                fence_operand(q_regs[(K_STEPS - 1) % 2].big);
                fence_operand(q_regs[(K_STEPS - 1) % 2].small);
            }
#pragma unroll
            for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) s[j][e] += step[(K_STEPS - 1) % 2][j][e];
        } else {
            wgmma_fence();
#pragma unroll
            for (int ks = 0; ks < K_STEPS; ++ks) {
                const auto qa = wgmma_desc<BLOCK_M>(q_addr, ks * 2 * (BLOCK_M / 8) * 128);
                const auto kb = wgmma_desc<BLOCK_N>(k_addr, ks * 2 * (BLOCK_N / 8) * 128);
                if (ks == 0)
                    WgS::template ss<false>(s, qa, kb);
                else
                    WgS::template ss<true>(s, qa, kb);
            }
            wgmma_commit();
            wgmma_wait<0>();
            fence_operand(s);
        }
        release_k();

        // Online softmax, as attn_fwd_mma; masks only where the tile reaches past the
        // sequence end or the warp's causal diagonal.
        const bool needs_mask = n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const float alpha =
                online_softmax_row<N_BLOCKS, CAUSAL>(s, half, warp_row0 + g + half * 8, n0, t, needs_mask, seqlen_k,
                                                     causal_offset, scale_log2, m_run[half], l_run[half]);
#pragma unroll
            for (int c = 0; c < O_CHUNKS; ++c)
#pragma unroll
                for (int j = 0; j < CN / 8; ++j) {
                    o_acc[c][j][half * 2] *= alpha;
                    o_acc[c][j][half * 2 + 1] *= alpha;
                }
        }

        mbarrier_wait(&barriers[2 * stage + 1], parity);
        // O += P V: P's register A operand per 8-key k-step (keys permuted as V^T's slots).
        Tf32Words<PASSES, 4> p[N_BLOCKS];
#pragma unroll
        for (int kb = 0; kb < N_BLOCKS; ++kb) {
            p[kb].set(0, s[kb][0]);
            p[kb].set(1, s[kb][2]);
            p[kb].set(2, s[kb][1]);
            p[kb].set(3, s[kb][3]);
        }
        if constexpr (PASSES == 3) {
#pragma unroll
            for (int c = 0; c < O_CHUNKS; ++c)
#pragma unroll
                for (int k0 = 0; k0 < N_BLOCKS; k0 += KG) {
                    float part[CN / 8][4];
                    wgmma_fence();
#pragma unroll
                    for (int kb = k0; kb < k0 + KG; ++kb) {
                        // V^T core matrix (slot kb * 8 / 4, row c * CN / 8): bytes on from V^T's start.
                        const unsigned va = ((kb * 2) * (D_PAD / 8) + c * CN / 8) * 128;
                        const auto v_big = wgmma_desc<D_PAD>(vt_addr, va);
                        const auto v_small = wgmma_desc<D_PAD>(vt_addr, va + KV_PART * 4);
                        if (kb == k0)
                            WgO::template rs<false>(part, p[kb].small, v_big);
                        else
                            WgO::template rs<true>(part, p[kb].small, v_big);
                        WgO::template rs<true>(part, p[kb].big, v_small);
                        WgO::template rs<true>(part, p[kb].big, v_big);
                    }
                    wgmma_commit();
                    wgmma_wait<0>();
#pragma unroll
                    for (int kb = k0; kb < k0 + KG; ++kb) {
                        fence_operand(p[kb].big);
                        fence_operand(p[kb].small);
                    }
                    fence_operand(part);
#pragma unroll
                    for (int j = 0; j < CN / 8; ++j)
#pragma unroll
                        for (int e = 0; e < 4; ++e) o_acc[c][j][e] += part[j][e];
                }
        } else {  // one pass: the tensor cores add into O (already scaled by alpha)
            wgmma_fence();
#pragma unroll
            for (int c = 0; c < O_CHUNKS; ++c)
#pragma unroll
                for (int kb = 0; kb < N_BLOCKS; ++kb)
                    WgO::template rs<true>(o_acc[c], p[kb].big,
                                           wgmma_desc<D_PAD>(vt_addr, ((kb * 2) * (D_PAD / 8) + c * CN / 8) * 128));
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int kb = 0; kb < N_BLOCKS; ++kb) fence_operand(p[kb].big);
#pragma unroll
            for (int c = 0; c < O_CHUNKS; ++c) fence_operand(o_acc[c]);
        }
    }

    // O /= l; rows that saw no key get O = 0 and lse = -inf.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = wg * 64 + (warp % 4) * 16 + g + half * 8;
        if (m0 + r >= seqlen_q) continue;
        const float l = l_run[half];
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int c = 0; c < O_CHUNKS; ++c)
#pragma unroll
            for (int j = 0; j < CN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int d = c * CN + j * 8 + 2 * t + e;
                    if (d < head_dim_v) out[r * o_ss + d] = o_acc[c][j][half * 2 + e] * inv_l;
                }
        if (t == 0) lse[r] = l > 0.0f ? (m_run[half] + log2f(l)) * LN2 : CUPYATTN_NEG_INF;
    }
}

}  // namespace cupyattn
