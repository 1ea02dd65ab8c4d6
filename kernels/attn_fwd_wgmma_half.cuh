// Forward attention for float16 / bfloat16 inputs on Hopper (sm_90a): warpgroup MMA on
// 16-bit operands, tiles brought by the TMA, after FlashAttention-3.
//
// Algorithm (FlashAttention-2's online softmax): each consumer warpgroup (4 warps) owns
// 64 query rows; per K/V tile of BLOCK_N keys, S = Q K^T by wgmma with Q and K in shared
// memory, online softmax on the accumulators (base 2, scale folded in), P packed from the
// S accumulators into the register A operand of O += P V (wgmma, V in shared memory as it
// is in memory, read MN-major).
//
// Warp roles: a producer warpgroup past the consumers hands its registers to them
// (setmaxnreg) and one of its threads issues every TMA copy: Q once, then each key
// tile's K and V into STAGES pipeline stages, each stage refilled once every consumer
// warp has released it (mbarriers: a stage's K or V has landed; it is free again).
// PINGPONG (two consumer warpgroups): they take turns issuing their wgmmas (named
// barriers), so that one's softmax runs while the other's products do. Three consumer
// warpgroups (NUM_WARPS 12, 160 registers each) take no turns.
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0; q, k and v describable by TMA maps
// (16-byte aligned, strides multiples of 16 bytes: cupyattn/tma.py).
// Grid: as attn_fwd_mma (query_block). Block: NUM_WARPS consumer warps (BLOCK_M = 16 *
// NUM_WARPS) and a producer warpgroup of 4 more.
//
// Shared memory (FwdWgmmaHalfLayout; same names and order as plan.FwdWgmmaHalfConfig.layout),
// D_CHUNKS = ceil(D_PAD / 64) chunks of 64 columns, each 128-byte swizzled (wgmma_half.cuh):
//   q_tile   [D_CHUNKS][BLOCK_M][64]            T
//   k_tiles  [STAGES][D_CHUNKS][BLOCK_N][64]    T
//   v_tiles  [STAGES][D_CHUNKS][BLOCK_N][64]    T
//   barriers [q_full, k_full[STAGES], v_full[STAGES], k_empty[STAGES], v_empty[STAGES]]  mbarrier
// STAGES = 3 at head dims up to 64, else 2.
#pragma once

#include "simt_tiles.cuh"
#include "wgmma_half.cuh"

namespace cupyattn {

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct FwdWgmmaHalfLayout {
    static constexpr int D_CHUNKS = (D_PAD + 63) / 64;
    static constexpr int STAGES = D_CHUNKS == 1 ? 3 : 2;
    static constexpr int Q_BYTES = D_CHUNKS * BLOCK_M * 128;
    static constexpr int KV_BYTES = D_CHUNKS * BLOCK_N * 128;  // one stage of K or of V
    static constexpr int q_tile = 0;
    static constexpr int k_tiles = q_tile + Q_BYTES;
    static constexpr int v_tiles = k_tiles + STAGES * KV_BYTES;
    static constexpr int barriers = v_tiles + STAGES * KV_BYTES;
    static constexpr int total = barriers + (1 + 4 * STAGES) * 8;
    static constexpr int num_buffers = 4;
    static constexpr int offsets[num_buffers] = {q_tile, k_tiles, v_tiles, barriers};
    static_assert(k_tiles % 1024 == 0 && v_tiles % 1024 == 0 && KV_BYTES % 1024 == 0, "swizzled chunks");
};

// The pipeline's mbarriers and the tile a stage holds.
template <class L>
struct HalfStages {
    unsigned long long* bars;  // L::barriers
    __device__ unsigned long long* q_full() const { return bars; }
    __device__ unsigned long long* k_full(int tile) const { return bars + 1 + tile % L::STAGES; }
    __device__ unsigned long long* v_full(int tile) const { return bars + 1 + L::STAGES + tile % L::STAGES; }
    __device__ unsigned long long* k_empty(int tile) const { return bars + 1 + 2 * L::STAGES + tile % L::STAGES; }
    __device__ unsigned long long* v_empty(int tile) const { return bars + 1 + 3 * L::STAGES + tile % L::STAGES; }
    // A full barrier's phase for `tile` (its round through the stages).
    __device__ static unsigned parity(int tile) { return (tile / L::STAGES) & 1; }
};

// PINGPONG: consumer warpgroup wg issues its wgmmas on its turn (named barrier
// FIRST_ID + wg, both warpgroups' 256 threads: it waits, the other arrives once done).
template <bool PINGPONG, int CONSUMERS>
struct Turns {
    static constexpr int FIRST_ID = 6;  // (5: the consumers' barrier below)
    __device__ static void start(int wg) {  // the first warpgroup takes the first turn
        if (PINGPONG && wg == 0) named_barrier_arrive(FIRST_ID, CONSUMERS);
    }
    __device__ static void wait(int wg) {
        if (PINGPONG) named_barrier_sync(FIRST_ID + wg, CONSUMERS);
    }
    __device__ static void pass(int wg) {
        if (PINGPONG) named_barrier_arrive(FIRST_ID + 1 - wg, CONSUMERS);
    }
    __device__ static void finish(int wg) {  // the second warpgroup's last turn handed back
        if (PINGPONG && wg == 0) named_barrier_sync(FIRST_ID, CONSUMERS);
    }
};

// Consumer warpgroup wg's 64 rows of the Q tile change sign in shared memory (16-bit floats:
// the sign bit), so that a negative scale's scores are |scale| (-Q) K^T: online_softmax takes
// row maxima of raw scores for a scale >= 0.
template <int D_CHUNKS, int BLOCK_M>
__device__ __forceinline__ void negate_q_rows(unsigned char* q_tile, int wg) {
#pragma unroll
    for (int c = 0; c < D_CHUNKS; ++c) {
        uint4* rows = reinterpret_cast<uint4*>(q_tile + c * BLOCK_M * 128 + wg * 64 * 128);
        for (int i = threadIdx.x % 128; i < 64 * 128 / 16; i += 128) {
            uint4 w = rows[i];
            w.x ^= 0x80008000u;
            w.y ^= 0x80008000u;
            w.z ^= 0x80008000u;
            w.w ^= 0x80008000u;
            rows[i] = w;
        }
    }
}

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL, bool PINGPONG>
__global__ void
__launch_bounds__(NUM_WARPS * 32 + 128, 1)
attn_fwd_wgmma_half(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v, T* __restrict__ out,
                    float* __restrict__ lse, long long q_sb, long long q_ss, long long q_sh, long long k_sb,
                    long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh, long long o_sb,
                    long long o_ss, long long o_sh, int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k,
                    int head_dim, int head_dim_v, int num_m_tiles, float scale_log2, int causal_offset,
                    const __grid_constant__ TmaMaps maps) {
    // (q, k, v and their strides: the forward's common launch; the TMA reads them through maps)
    using L = FwdWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int D_CHUNKS = L::D_CHUNKS;
    constexpr int DV = 64 * D_CHUNKS;  // O's columns: MN-major swizzled B operands come 64 wide
    constexpr int CONSUMERS = NUM_WARPS * 32;
    constexpr int N_BLOCKS = BLOCK_N / 8;  // 8-key column blocks of S
    constexpr int K_STEPS = D_PAD / 16;    // k-steps of Q K^T
    static_assert(same_type<T, __half> || same_type<T, __nv_bfloat16>, "16-bit inputs");
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_M == 16 * NUM_WARPS, "each consumer warpgroup owns 64 query rows");
    static_assert(D_PAD % 16 == 0 && BLOCK_N % 16 == 0, "tile shape");
    static_assert(!PINGPONG || NUM_WARPS == 8, "ping-pong between two consumer warpgroups");
    using Turn = Turns<PINGPONG, CONSUMERS>;
    // What the producer's 24 leave of the 64K registers, a multiple of 8: 240 for two
    // consumer warpgroups, 160 for three (plan.FwdWgmmaHalfConfig.consumer_registers).
    constexpr int CONSUMER_REGISTERS = (65536 - 128 * 24) / CONSUMERS / 8 * 8;
    using WgS = WgmmaHalf<T, BLOCK_N>;
    using WgO = WgmmaHalf<T, DV>;

    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned char* q_tile = smem + L::q_tile;
    unsigned char* k_tiles = smem + L::k_tiles;
    unsigned char* v_tiles = smem + L::v_tiles;
    const HalfStages<L> st{reinterpret_cast<unsigned long long*>(smem + L::barriers)};
    if (wg_smem_addr(smem) % 1024 != 0) __trap();  // the swizzle would disagree with the descriptors

    const int warp = warp_uniform_index();
    const int lane = threadIdx.x % 32;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;

    init_mbarriers<1 + 2 * L::STAGES, 2 * L::STAGES, NUM_WARPS>(st.bars);

    if (warp >= NUM_WARPS) {  // the producer warpgroup
        setmaxnreg_dec<24>();
        if (warp == NUM_WARPS && lane == 0) {
            const int b = (int)qb.b;
            prefetch_tma_map(&maps.q);
            prefetch_tma_map(&maps.k);
            prefetch_tma_map(&maps.v);
            mbarrier_expect_tx(st.q_full(), L::Q_BYTES);
            for (int c = 0; c < D_CHUNKS; ++c)
                tma_load_4d(q_tile + c * BLOCK_M * 128, &maps.q, c * 64, m0, qb.h, b, st.q_full());
            for (int tile = 0; tile < n_tiles; ++tile) {
                const int round = tile / L::STAGES, n0 = tile * BLOCK_N;
                unsigned char* k_stage = k_tiles + tile % L::STAGES * L::KV_BYTES;
                unsigned char* v_stage = v_tiles + tile % L::STAGES * L::KV_BYTES;
                if (round > 0) mbarrier_wait(st.k_empty(tile), (round - 1) & 1);
                mbarrier_expect_tx(st.k_full(tile), L::KV_BYTES);
                for (int c = 0; c < D_CHUNKS; ++c)
                    tma_load_4d(k_stage + c * BLOCK_N * 128, &maps.k, c * 64, n0, qb.h_kv, b, st.k_full(tile));
                if (round > 0) mbarrier_wait(st.v_empty(tile), (round - 1) & 1);
                mbarrier_expect_tx(st.v_full(tile), L::KV_BYTES);
                for (int c = 0; c < D_CHUNKS; ++c)
                    tma_load_4d(v_stage + c * BLOCK_N * 128, &maps.v, c * 64, n0, qb.h_kv, b, st.v_full(tile));
            }
        }
        return;
    }
    setmaxnreg_inc<CONSUMER_REGISTERS>();

    const int wg = warp / 4;
    const int g = lane / 4, t = lane % 4;
    const int wg_row0 = m0 + wg * 64;
    const int warp_row0 = wg_row0 + (warp % 4) * 16;
    const unsigned q_addr = wg_smem_addr(q_tile) + wg * 64 * 128;  // the warpgroup's 64 rows of each chunk

    float o_acc[DV / 8][4];
#pragma unroll
    for (int j = 0; j < DV / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) o_acc[j][e] = 0.0f;
    float m_run[2] = {CUPYATTN_NEG_INF, CUPYATTN_NEG_INF}, l_run[2] = {0.0f, 0.0f};  // rows g, g + 8

    // Causal: this warpgroup computes the key tiles up to its last row's diagonal (n_mine);
    // it still waits for every tile, takes its turns and releases each stage, so that its
    // arrivals count toward each tile's phase and the turns stay in step.
    const int last_key = wg_row0 + 63 + causal_offset;
    const int n_mine = !CAUSAL ? n_tiles : last_key < 0 ? 0 : min(n_tiles, last_key / BLOCK_N + 1);

    // S = Q K^T of a key tile, issued.
    auto issue_s = [&](float (&s)[N_BLOCKS][4], int tile) {
        const unsigned k_addr = wg_smem_addr(k_tiles + tile % L::STAGES * L::KV_BYTES);
        wgmma_kmajor<WgS, K_STEPS>(s, q_addr, BLOCK_M, k_addr, BLOCK_N);
    };
    // O += P V of a key tile, issued.
    auto issue_pv = [&](const unsigned (&p)[BLOCK_N / 16][4], int tile) {
        const unsigned v_addr = wg_smem_addr(v_tiles + tile % L::STAGES * L::KV_BYTES);
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk)
            WgO::template rs<true>(o_acc, p[kk], desc_sw128(v_addr, BLOCK_N * 128, kk * 2048));
    };
    // Online softmax of a tile's scores, as attn_fwd_mma (S becomes P); returns whether O
    // takes the factors alpha. Masks only where the tile reaches past the sequence end or the
    // warp's causal diagonal.
    auto softmax = [&](float (&s)[N_BLOCKS][4], int tile, float (&alpha)[2]) {
        const int n0 = tile * BLOCK_N;
        const bool needs_mask =
            n0 + BLOCK_N > seqlen_k || (CAUSAL && n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
        return online_softmax<N_BLOCKS, CAUSAL>(s, warp_row0 + g, n0, t, needs_mask, seqlen_k, causal_offset,
                                                fabsf(scale_log2), m_run, l_run, alpha);
    };

    // Each step issues this tile's S = Q K^T together with the previous tile's O += P V,
    // so that this tile's softmax runs while the tensor cores do the previous tile's P V.
    float s[N_BLOCKS][4];
    unsigned p[BLOCK_N / 16][4];  // the previous tile's P, the A operand of its P V
    // O += P V of this warpgroup's last tile, alone on its turn, waited for.
    auto last_pv = [&](int tile) {
        wgmma_fence();
        issue_pv(p, tile);
        wgmma_commit();
        Turn::pass(wg);
        wgmma_wait<0>();
#pragma unroll
        for (int kk = 0; kk < BLOCK_N / 16; ++kk) fence_operand(p[kk]);
        fence_operand(o_acc);
    };
    Turn::start(wg);
    mbarrier_wait(st.q_full(), 0);
    if (scale_log2 < 0.0f) {
        negate_q_rows<D_CHUNKS, BLOCK_M>(q_tile, wg);
        fence_proxy_async();  // (before the warpgroup's wgmmas read them)
        warpgroup_barrier(wg);
    }
    if (n_tiles > 0) {
        mbarrier_wait(st.k_full(0), 0);
        Turn::wait(wg);  // (a warpgroup with nothing to add still takes its turns)
        if (n_mine > 0) {
            wgmma_fence();
            issue_s(s, 0);
            wgmma_commit();
            Turn::pass(wg);  // (in the same branch as the wait: ptxas serializes wgmmas across one)
            wgmma_wait<0>();
            fence_operand(s);
        } else {
            Turn::pass(wg);
        }
        mbarrier_arrive_warp(st.k_empty(0));
        if (n_mine > 0) {
            float alpha[2];  // (O is still zero)
            softmax(s, 0, alpha);
            pack_a_operands<T>(p, s);
        }
    }
    for (int tile = 1; tile < n_tiles; ++tile) {
        mbarrier_wait(st.k_full(tile), HalfStages<L>::parity(tile));
        mbarrier_wait(st.v_full(tile - 1), HalfStages<L>::parity(tile - 1));
        Turn::wait(wg);
        if (tile < n_mine) {
            wgmma_fence();
            issue_s(s, tile);
            wgmma_commit();
            issue_pv(p, tile - 1);
            wgmma_commit();
            Turn::pass(wg);
            wgmma_wait<1>();
            fence_operand(s);
            mbarrier_arrive_warp(st.k_empty(tile));
            float alpha[2];
            const bool rescale = softmax(s, tile, alpha);
            wgmma_wait<0>();
#pragma unroll
            for (int kk = 0; kk < BLOCK_N / 16; ++kk) fence_operand(p[kk]);
            fence_operand(o_acc);
            mbarrier_arrive_warp(st.v_empty(tile - 1));
            if (rescale)
#pragma unroll
                for (int j = 0; j < DV / 8; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) o_acc[j][e] *= alpha[e / 2];
            pack_a_operands<T>(p, s);
        } else if (tile == n_mine) {  // the previous tile was this warpgroup's last
            last_pv(tile - 1);
            mbarrier_arrive_warp(st.k_empty(tile));
            mbarrier_arrive_warp(st.v_empty(tile - 1));
        } else {
            Turn::pass(wg);
            mbarrier_arrive_warp(st.k_empty(tile));
            mbarrier_arrive_warp(st.v_empty(tile - 1));
        }
    }
    if (n_tiles > 0) {
        const int last = n_tiles - 1, n0 = last * BLOCK_N;
        unsigned char* v_stage = v_tiles + last % L::STAGES * L::KV_BYTES;
        mbarrier_wait(st.v_full(last), HalfStages<L>::parity(last));
        // A causal block's last tile may reach past every key its rows see (n_end): those V
        // rows are zeroed (the TMA zero-fills past seqlen_k only), so that NaN or inf in keys
        // no row may see cannot reach O through 0 * NaN. Both warpgroups, then they meet.
        if (CAUSAL && n0 + BLOCK_N > n_end && n_end < seqlen_k) {
            zero_rows_from<D_CHUNKS, BLOCK_N, CONSUMERS>(v_stage, n_end - n0);
            fence_proxy_async();
            named_barrier_sync(5, CONSUMERS);
        }
        Turn::wait(wg);
        if (n_mine == n_tiles) {
            last_pv(last);
        } else {
            Turn::pass(wg);
        }
        mbarrier_arrive_warp(st.v_empty(last));
    }
    Turn::finish(wg);

    // O /= l; rows that saw no key get O = 0 and lse = -inf.
    T* o_rows = out + qb.b * o_sb + qb.h * o_sh + m0 * o_ss;
    float* lse_rows = lse + (qb.b * n_heads_q + qb.h) * (long long)seqlen_q + m0;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = wg * 64 + (warp % 4) * 16 + g + half * 8;
        if (m0 + r >= seqlen_q) continue;
        const float l = l_run[half];
        const float inv_l = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
        for (int j = 0; j < DV / 8; ++j) {
            const int d = j * 8 + 2 * t;  // head_dim % 8 == 0: d and d + 1 both in or both out
            if (d < head_dim_v)
                *reinterpret_cast<unsigned*>(o_rows + r * o_ss + d) =
                    HalfOps<T>::pack(o_acc[j][half * 2] * inv_l, o_acc[j][half * 2 + 1] * inv_l);
        }
        if (t == 0) lse_rows[r] = l > 0.0f ? (m_run[half] + log2f(l)) * LN2 : CUPYATTN_NEG_INF;
    }
}

}  // namespace cupyattn
