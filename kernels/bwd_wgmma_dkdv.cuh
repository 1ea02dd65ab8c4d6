// The wgmma backward's dK/dV main loop (attn_bwd_dkdv_wgmma, and attn_bwd_fused_wgmma,
// which also adds dQ): a block keeps its keys' K and V and streams the query tiles of
// every query head of the GQA group through a pipeline (bwd_wgmma_pipeline.cuh):
//   S^T  = K Q^T,  dP^T = V dO^T                 (both operands in shared memory)
//   P^T  = exp2(S^T * scale log2 e - lse log2 e),  dS^T = P^T * (dP^T - delta)
//   dV  += P^T dO,  dK += dS^T Q                 (A in registers, B = dO^T, Q^T tiles)
#pragma once

#include "attn_bwd_simt.cuh"  // LOG2E
#include "bwd_wgmma_epilogue.cuh"
#include "bwd_wgmma_layout.cuh"
#include "bwd_wgmma_pipeline.cuh"
#include "simt_tiles.cuh"

namespace cupyattn {

// P^T and dS^T of a warp's 16 keys x M_BLOCKS * 8 queries from S^T and dP^T (sdp[0],
// sdp[1], replaced), lse and delta of the queries read first, invisible entries selected
// to zero. Lane (g, t) holds keys g and g + 8, queries 2t and 2t + 1 of each 8.
template <int M_BLOCKS, bool CAUSAL>
__device__ __forceinline__ void dkdv_probabilities(float (&sdp)[2][M_BLOCKS][4], const float* lse_tile,
                                                   const float* delta_tile, float scale_log2, int key0, int m0,
                                                   int seqlen_q, int seqlen_k, int causal_offset, int g, int t) {
    constexpr int BLOCK_M = M_BLOCKS * 8;
    const bool needs_mask =
        m0 + BLOCK_M > seqlen_q || key0 + 16 > seqlen_k || (CAUSAL && key0 + 15 > m0 + causal_offset);
    float2 lse2[M_BLOCKS], delta2[M_BLOCKS];  // this lane's query columns 2t, 2t + 1 of each 8
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
}

// The dK/dV pass (FUSED = false), or with dQ added as it goes (FUSED: each warpgroup
// writes its dS to shared memory and adds dQ^T = K^T dS^T over its 64 keys to dq with
// atomics, so the dQ pass and its recomputed S and dP are not needed).
template <typename L, bool FUSED, typename Op, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__device__ __forceinline__ void dkdv_wgmma(const float* __restrict__ k, const float* __restrict__ v,
                                           float* __restrict__ dk, float* __restrict__ dv, long long k_sb,
                                           long long k_ss, long long k_sh, long long v_sb, long long v_ss,
                                           long long v_sh, long long dk_sb, long long dk_ss, long long dk_sh,
                                           long long dv_sb, long long dv_ss, long long dv_sh, int n_heads_q,
                                           int n_heads_kv, int seqlen_q, int seqlen_k, int head_dim, int head_dim_v,
                                           int num_n_tiles, float scale, float scale_log2, int causal_offset,
                                           const float* __restrict__ q_staged, DqAtomics dq) {
    constexpr int PASSES = Op::passes;
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int K_STEPS = D_PAD / 8;  // k-steps of K Q^T and V dO^T
    constexpr int M_BLOCKS = BLOCK_M / 8;  // 8-query column blocks of S^T, the k-steps of dV and dK
    // D_SPLIT warpgroups share 64 keys, each with its share of dK's and dV's columns
    // (S^T by one, dP^T by the other, swapped: plan.BwdDkdvWgmmaConfig.d_split).
    constexpr int D_SPLIT = 16 * NUM_WARPS / BLOCK_N, D_WG = D_PAD / D_SPLIT;
    constexpr int CN = chunk_columns<PASSES, D_WG>();
    constexpr int CHUNKS = D_WG / CN;
    constexpr int KG = PASSES == 3 && M_BLOCKS > 4 ? 4 : M_BLOCKS;
    // 3xTF32 score products 16 queries wide: 4 k-steps in flight (an n16 wgmma is too short
    // to cover the next one's latency two deep) where the registers allow it.
    constexpr int SCORE_DEPTH = PASSES == 3 && BLOCK_M == 16 && (D_SPLIT == 2 ? D_WG <= 128 : D_WG < 128) ? 4 : 2;
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_N % 64 == 0 && BLOCK_N * D_SPLIT == 16 * NUM_WARPS &&
                      (D_SPLIT == 1 || D_SPLIT == 2),
                  "each warpgroup owns 64 keys, one or two share them");
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

    // (not warp_uniform_index in the fused pass, which then spilled at admitted tiles)
    const int warp = FUSED ? int(threadIdx.x / 32) : warp_uniform_index();
    const int wg = warp / 4;
    const int key_wg = wg / D_SPLIT, col0 = wg % D_SPLIT * D_WG;  // its 64 keys, its first dK/dV column
    const int lane = threadIdx.x % 32;
    const int g = lane / 4, t = lane % 4;
    const KeyBlock kb = key_block<CAUSAL, BLOCK_N>(num_n_tiles, n_heads_q, n_heads_kv);
    const long long b = kb.b;
    const int h_kv = kb.h_kv, group = kb.group, n0 = kb.n0;
    const int wg_key0 = n0 + key_wg * 64;  // this warpgroup's first key
    const int key0 = wg_key0 + (warp % 4) * 16;  // this warp's

    // Work items: (query head of the group, query tile), the query tiles that can see a
    // key of this block only (causal: from n0 - causal_offset on), item (head, m) at
    // staged tile head * n_q_tiles + m from the group's first head, tile m_begin.
    const int m_begin = first_query_tile<CAUSAL, BLOCK_M>(n0, causal_offset);
    const int m_tiles = m_begin < seqlen_q ? (seqlen_q - m_begin + BLOCK_M - 1) / BLOCK_M : 0;
    const int n_items = group * m_tiles;
    const int n_q_tiles = (seqlen_q + BLOCK_M - 1) / BLOCK_M;
    const unsigned char* staged = reinterpret_cast<const unsigned char*>(q_staged) +
                                  ((b * n_heads_q + h_kv * group) * n_q_tiles + m_begin / BLOCK_M) * L::STAGED_BYTES;
    const QueryItems items{m_tiles, n_q_tiles};
    const QueryStages<L> stages{q_tiles, staged, barriers};
    const QueryRing<L> ring{q_tiles, staged, barriers};
    init_mbarriers<PRODUCER ? L::RING_SLOTS : L::BARRIER_COUNT, PRODUCER ? L::RING_SLOTS : 0, NUM_WARPS>(barriers);
    ItemAt at = items.first(group);  // item's (item 0's)
    if constexpr (PRODUCER) {
        if (warp >= NUM_WARPS) {
            producer_gives_registers();
            if (warp == NUM_WARPS && lane == 0) ring.produce(items, at, n_items);
            return;
        }
        consumer_takes_registers();
    } else if (threadIdx.x == 0) {
        if constexpr (L::RING) {
            if (n_items > 0)
                for (int r = 0; r < 3; ++r) ring.fetch(0, at, r);
        } else if constexpr (L::SPLIT_STAGE) {
            if (n_items > 0) {
                stages.fetch_rows(0, at);
                stages.fetch_transposed(0, at);
            }
        } else {
            ItemAt first = at;
            for (int item = 0; item < STAGES && item < n_items; ++item, first = items.after(first))
                stages.fetch(item, first);
        }
    }

    // K and V, once, from global memory (zeros past the last key), while the first query
    // tiles copy: TF32 parts, or (L::KV_IN_REGISTERS) float32 words in register A order.
    // The fused pass zeroes K from the first key no query sees (causal) too, so that NaN
    // or inf there cannot reach dQ through K^T dS^T (0 * NaN).
    const int k_rows = FUSED && CAUSAL ? min(seqlen_k, max(0, seqlen_q + causal_offset)) : seqlen_k;
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
    // One of S^T (0) and dP^T (1), or both (rows_by_rows / words_by_rows into sdp).
    auto score_product = [&](float (&d)[M_BLOCKS][4], int product, unsigned q_addr, unsigned do_addr) {
        one_of_two_products<PASSES, L::KV_IN_REGISTERS, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, SCORE_DEPTH,
                            L::SCORE_PARTS_AS_ROWS>(d, product, {k_words, v_words}, {k_addr, v_addr}, KV_PART * 4,
                                                    {q_addr, do_addr}, Q_PART * 4);
    };
    fence_proxy_async();
    consumers_barrier<PRODUCER, THREADS>();  // K's and V's TF32 tiles (and K^T) written (and visible to wgmma)

    for (int item = 0; item < n_items; ++item) {
        if (item > 0) at = items.after(at);  // (inside the block below, the fused kernels' SASS changed)
        if (!PRODUCER && item > 0) {
            // Every warpgroup is done with the last item's stage (one stage: its second
            // half) and its dS.
            __syncthreads();
            if constexpr (L::RING) {
                if (threadIdx.x == 0) ring.fetch(item, at, 2);
            } else if constexpr (L::SPLIT_STAGE) {
                if (threadIdx.x == 0) stages.fetch_transposed(item, at);
            } else {
                static_assert(STAGES == 2 || L::RING || L::SPLIT_STAGE, "two stages: item + 1 is fetched here");
                if (threadIdx.x == 0 && item - 1 + STAGES < n_items) stages.fetch(item - 1 + STAGES, items.after(at));
            }
        }
        const int m0 = m_begin + at.m * BLOCK_M;
        // A warpgroup whose keys are all past the end or after every query's diagonal has
        // nothing to add (uniform per warpgroup, as wgmma needs). With one stage it computes
        // S^T and dP^T all the same and meets the others at the barrier below (skipping the
        // products there cost registers and spills). The first warpgroup always adds: every
        // item sees the block's first key, so each copy is waited for before the next is issued.
        const bool idle = wg_key0 >= seqlen_k || (CAUSAL && wg_key0 > m0 + BLOCK_M - 1 + causal_offset);
        if (!L::SPLIT_STAGE && !L::RING && idle) continue;
        unsigned char* tiles = stages.stage(item);
        unsigned q_addr = wg_smem_addr(tiles), do_addr = q_addr + L::TILE_M;
        unsigned qt_addr = q_addr + 2 * L::TILE_M + col_bytes, dot_addr = q_addr + 3 * L::TILE_M + col_bytes;
        const float* lse_tile = reinterpret_cast<const float*>(tiles + 4 * L::TILE_M);
        if constexpr (L::RING) {
            do_addr = wg_smem_addr(ring.tile(item, 0));
            q_addr = wg_smem_addr(ring.tile(item, 1));
            dot_addr = wg_smem_addr(ring.tile(item, 2)) + col_bytes;
            qt_addr = wg_smem_addr(ring.tile(item, 3)) + col_bytes;
            lse_tile = reinterpret_cast<const float*>(ring.tile(item, 2) + L::TILE_M);
        }
        const float* delta_tile = lse_tile + BLOCK_M;

        // S^T and dP^T. The ring's tiles are fetched in the order they are used: dP^T's dO
        // first (Q lands while it runs), then Q; Q^T and the next item's dO once both are
        // read; dO^T (dV) before Q^T (dK).
        float sdp[2][M_BLOCKS][4];  // S^T, dP^T
        if constexpr (D_SPLIT == 2) {
            // The pair's first warpgroup computes S^T, the second dP^T, each writes its
            // product over the operand tile it has just used (Q's, dO's) and reads the
            // other's back.
            const int product = wg % 2;  // 0: S^T, 1: dP^T
            float own[M_BLOCKS][4];
            float4* const swap[2] = {reinterpret_cast<float4*>(L::RING ? ring.tile(item, 1) : tiles),
                                     reinterpret_cast<float4*>(L::RING ? ring.tile(item, 0) : tiles + L::TILE_M)};
            if constexpr (L::RING) {
                // Each warpgroup waits for its operand's tile only; its next wait on the
                // other's barrier comes after the barrier below, so after that tile's phase
                // has completed (a parity wait must not skip a phase).
                ring.wait(item, product == 0 ? 1 : 0);
            } else {
                stages.wait(item);
            }
            score_product(own, product, q_addr, do_addr);
            swap_pair_products<M_BLOCKS, PRODUCER ? THREADS : 0>(sdp, own, swap, product, warp % 4, lane);
            if constexpr (PRODUCER) {
                ring.release(item, 0);  // dO's and Q's slots (the swap's too): read
                ring.release(item, 1);
            } else if constexpr (L::RING || L::SPLIT_STAGE) {
                __syncthreads();  // (with two stages, the next item's first barrier orders them)
            }
            if constexpr (PRODUCER) {
                ring.wait(item, 2);
            } else if constexpr (L::RING) {
                if (threadIdx.x == 0) {
                    ring.fetch(item, at, 3);
                    if (item + 1 < n_items) ring.fetch(item + 1, items.after(at), 0);
                }
                ring.wait(item, 2);
            }
        } else if constexpr (L::RING) {
            // S^T and dP^T one after the other, which leaves the registers for wider tiles.
            ring.wait(item, 0);
            score_product(sdp[1], 1, q_addr, do_addr);
            ring.wait(item, 1);
            score_product(sdp[0], 0, q_addr, do_addr);
            __syncthreads();  // every warpgroup is done with dO and Q
            if (threadIdx.x == 0) {
                ring.fetch(item, at, 3);
                if (item + 1 < n_items) ring.fetch(item + 1, items.after(at), 0);
            }
            if (idle) continue;
            ring.wait(item, 2);
        } else {
            stages.wait(item);
            if constexpr (L::KV_IN_REGISTERS)
                words_by_rows<2, BLOCK_M, K_STEPS, BLOCK_M, L::SCORE_PARTS_AS_ROWS, SCORE_DEPTH>(
                    sdp, {k_words, v_words}, {q_addr, do_addr}, Q_PART * 4);
            else
                rows_by_rows<PASSES, 2, BLOCK_M, K_STEPS, BLOCK_N, BLOCK_M, false, SCORE_DEPTH>(
                    sdp, {k_addr, v_addr}, KV_PART * 4, {q_addr, do_addr}, Q_PART * 4);
        }
        if constexpr (L::SPLIT_STAGE) {
            if constexpr (D_SPLIT == 1) __syncthreads();  // every warpgroup is done with Q and dO
            if (threadIdx.x == 0 && item + 1 < n_items) stages.fetch_rows(item + 1, items.after(at));
            if (idle) continue;
            stages.wait_transposed(item);
        }

        // P^T and dS^T, as register A operands.
        dkdv_probabilities<M_BLOCKS, CAUSAL>(sdp, lse_tile, delta_tile, scale_log2, key0, m0, seqlen_q, seqlen_k,
                                             causal_offset, g, t);
        Tf32Words<PASSES, 4> a[2][M_BLOCKS];
        a_words(a[0], sdp[0]);
        a_words(a[1], sdp[1]);

        // dV += P^T dO, dK += dS^T Q (the fused pass: and dQ^T = K^T dS^T, added to dq).
        if constexpr (L::RING) {
            regs_by_transposed<PASSES, 1, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(just_one(acc[0]), just_one(a[0]), {dot_addr},
                                                                           Q_PART * 4);
            // Every warpgroup that adds is done with dO^T (the idle ones, which skip dV and
            // dK, are the last: their keys come after the others'), so the next item's Q
            // may take its slot.
            if constexpr (PRODUCER) {
                ring.release(item, 2);  // dO^T's slot (and its lse and delta): read
            } else {
                const int last_key = min(seqlen_k - 1, CAUSAL ? m0 + BLOCK_M - 1 + causal_offset : seqlen_k - 1);
                const int adding_key_wgs = min(BLOCK_N / 64, max(0, last_key - n0) / 64 + 1);
                leading_threads_barrier(5, adding_key_wgs * D_SPLIT * 128);
                if (threadIdx.x == 0 && item + 1 < n_items) ring.fetch(item + 1, items.after(at), 1);
            }
            ring.wait(item, 3);
            regs_by_transposed<PASSES, 1, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(just_one(acc[1]), just_one(a[1]), {qt_addr},
                                                                           Q_PART * 4);
            if constexpr (PRODUCER) ring.release(item, 3);  // Q^T's slot: read
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
                regs_by_transposed<PASSES, 2, CN, CHUNKS, M_BLOCKS, KG, D_PAD>(acc, a, {dot_addr, qt_addr}, Q_PART * 4);
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

}  // namespace cupyattn
