// Backward attention for float16 / bfloat16 inputs on Hopper (sm_90a): warpgroup MMA on
// 16-bit operands, tiles brought by the TMA into 128-byte-swizzled chunks (wgmma_half.cuh):
// the two passes of attn_bwd_mma.cuh (delta from its own launch), or up to head dim 128 one
// fused pass, the dK/dV pass that also computes dQ (attn_bwd_fused_wgmma_half, below).
//
// attn_bwd_dkdv_wgmma_half: a block owns BLOCK_N keys of one key/value head; K and V stay
//   in shared memory, Q and dO tiles of BLOCK_M query rows stream through STAGES stages over
//   every query head of the GQA group, from the last query tile down. Each consumer
//   warpgroup owns 64 keys and works key-major, so that P^T and dS^T go from accumulators
//   to A operands in registers:
//     S^T  = K Q^T,  dP^T = V dO^T                    (SS: both operands K-major)
//     P^T  = exp2(S^T scale log2 e - lse log2 e),  dS^T = P^T (dP^T - delta)
//     dV  += P^T dO,  dK += dS^T Q                    (RS: Q, dO read MN-major; fused past
//                                                      head dim 64, dK's dS^T from its tile)
//   D_SPLIT = 2 (SPLIT_SCORES): two warpgroups share 64 keys, each keeping half of dK's and
//   dV's columns and computing S^T and dP^T for half of the query tile; both halves of P^T and
//   dS^T meet in shared tiles, from which both read dV's and dK's A operands (SS).
// attn_bwd_dq_wgmma_half: a block owns BLOCK_M query rows (64 a consumer warpgroup); Q and
//   dO stay, K and V tiles stream through STAGES stages:
//     S = Q K^T, dP = dO V^T (SS), dS = P (dP - delta), dQ += dS K (RS: K read MN-major).
// Warp roles in both: a producer warpgroup past the consumers gives up its registers
// (setmaxnreg); its first thread issues every TMA copy, in dK/dV each query tile's lse
// (times log2 e) and delta rows too, from the padded rows attn_bwd_delta_wgmma_half writes.
// A stage is full when its copies have landed, free again once every consumer warp has
// arrived.
// Entries no row may see are selected to zero, never multiplied by zero; in dQ the key rows
// of a causal block's last tile past every key its rows see are zeroed, so that NaN or inf
// in keys no query may see cannot reach dQ through 0 * NaN (rows past the sequence ends
// are zeros from the TMA).
//
// Needs: head_dim == head_dim_v, head_dim % 8 == 0; q, k, v and dout describable by TMA
// maps (cupyattn/tma.py). Grid: as attn_bwd_dkdv_mma / attn_bwd_dq_mma.
//
// Shared memory, C = ceil(D_PAD / 64) chunks of 64 columns (same names and order as
// plan.BwdDkdvWgmmaHalfConfig.layout):
//   k_tile      [C][BLOCK_N][64]            T
//   v_tile      [C][BLOCK_N][64]            T
//   q_tiles     [STAGES][C][BLOCK_M][64]    T
//   do_tiles    [STAGES][C][BLOCK_M][64]    T
//   lse_tiles   [STAGES][BLOCK_M]           float  lse * log2(e), 0 past the end
//   delta_tiles [STAGES][BLOCK_M]           float
//   barriers    [kv_full, full[STAGES], empty[STAGES]]  mbarrier
// and D_SPLIT = 2 (plan.BwdDkdvWgmmaHalfConfig.split_scores) past those:
//   p_tiles     [2][BLOCK_N][BLOCK_M]       T      P^T, swizzled
//   ds_tiles    [2][BLOCK_N][BLOCK_M]       T      dS^T, swizzled
// and plan.BwdDqWgmmaHalfConfig.layout:
//   q_tile      [C][BLOCK_M][64]            T
//   do_tile     [C][BLOCK_M][64]            T
//   k_tiles     [STAGES][C][BLOCK_N][64]    T
//   v_tiles     [STAGES][C][BLOCK_N][64]    T
//   barriers    [q_full, k_full[STAGES], v_full[STAGES], empty[STAGES]]  mbarrier
// and plan.BwdFusedWgmmaHalfConfig.layout: the dK/dV pass's, then
//   ds_tiles    [2][BLOCK_N][BLOCK_M]       T      dS^T, swizzled
//   dq_tiles    [2][C][BLOCK_M][64]         float  in accumulator order (dq_tile_index)
//   dq_barriers [dq_full[2], dq_empty[2]]   mbarrier
#pragma once

#include "attn_bwd_simt.cuh"  // LOG2E
#include "simt_tiles.cuh"
#include "wgmma_half.cuh"

namespace cupyattn {

constexpr int BWD_HALF_STAGES = 2;

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDkdvWgmmaHalfLayout {
    static constexpr int D_CHUNKS = (D_PAD + 63) / 64;
    static constexpr int STAGES = BWD_HALF_STAGES;
    static constexpr int KV_BYTES = D_CHUNKS * BLOCK_N * 128;  // K or V
    static constexpr int QD_BYTES = D_CHUNKS * BLOCK_M * 128;  // one stage of Q or of dO
    static constexpr int k_tile = 0;
    static constexpr int v_tile = k_tile + KV_BYTES;
    static constexpr int q_tiles = v_tile + KV_BYTES;
    static constexpr int do_tiles = q_tiles + STAGES * QD_BYTES;
    static constexpr int lse_tiles = do_tiles + STAGES * QD_BYTES;
    static constexpr int delta_tiles = lse_tiles + STAGES * BLOCK_M * 4;
    static constexpr int barriers = delta_tiles + STAGES * BLOCK_M * 4;
    static constexpr int total = barriers + (1 + 2 * STAGES) * 8;
    static constexpr int num_buffers = 7;
    static constexpr int offsets[num_buffers] = {k_tile, v_tile, q_tiles, do_tiles, lse_tiles, delta_tiles, barriers};
    static_assert(KV_BYTES % 1024 == 0 && QD_BYTES % 1024 == 0, "swizzled chunks");
};

// Consumer warpgroups of the dK/dV pass sharing each 64 keys (its D_SPLIT): 2 splits the scores.
__host__ __device__ constexpr int dkdv_d_split(int num_warps, int block_n) { return num_warps / 4 / (block_n / 64); }

// The dK/dV pass whose warpgroup pairs split the scores (D_SPLIT 2): P^T and dS^T of two query
// tiles, one pair written while the last item's products may still read the other.
template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDkdvSplitWgmmaHalfLayout : BwdDkdvWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N> {
    using Base = BwdDkdvWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>;
    static constexpr int DS_BYTES = BLOCK_N * BLOCK_M * 2;  // [BLOCK_N keys][BLOCK_M queries] T
    static constexpr int p_tiles = (Base::total + 1023) / 1024 * 1024;
    static constexpr int ds_tiles = p_tiles + 2 * DS_BYTES;
    static constexpr int total = ds_tiles + 2 * DS_BYTES;
    static constexpr int num_buffers = 9;
    static constexpr int offsets[num_buffers] = {Base::k_tile,   Base::v_tile,    Base::q_tiles,
                                                 Base::do_tiles, Base::lse_tiles, Base::delta_tiles,
                                                 Base::barriers, p_tiles,         ds_tiles};
};

// The fused pass's: the dK/dV pass's, then two dS^T tiles (one item's written while the last
// item's dQ may still read the other), two float32 dQ tiles (one written while the other is
// added to global memory) and their barriers.
template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdFusedWgmmaHalfLayout : BwdDkdvWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N> {
    using Base = BwdDkdvWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>;
    static constexpr int DS_BYTES = BLOCK_N * BLOCK_M * 2;  // [BLOCK_N keys][BLOCK_M queries] T
    static constexpr int DQ_BYTES = Base::D_CHUNKS * BLOCK_M * 64 * 4;  // [D_CHUNKS][64 x 64] float
    static constexpr int ds_tiles = (Base::total + 1023) / 1024 * 1024;
    static constexpr int dq_tiles = ds_tiles + 2 * DS_BYTES;
    static constexpr int dq_barriers = dq_tiles + 2 * DQ_BYTES;
    static constexpr int total = dq_barriers + 4 * 8;
    static constexpr int num_buffers = 10;
    static constexpr int offsets[num_buffers] = {Base::k_tile,    Base::v_tile,      Base::q_tiles,  Base::do_tiles,
                                                 Base::lse_tiles, Base::delta_tiles, Base::barriers, ds_tiles,
                                                 dq_tiles,        dq_barriers};
};

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N>
struct BwdDqWgmmaHalfLayout {
    static constexpr int D_CHUNKS = (D_PAD + 63) / 64;
    static constexpr int STAGES = BWD_HALF_STAGES;
    static constexpr int Q_BYTES = D_CHUNKS * BLOCK_M * 128;  // Q or dO
    static constexpr int KV_BYTES = D_CHUNKS * BLOCK_N * 128;  // one stage of K or of V
    static constexpr int q_tile = 0;
    static constexpr int do_tile = q_tile + Q_BYTES;
    static constexpr int k_tiles = do_tile + Q_BYTES;
    static constexpr int v_tiles = k_tiles + STAGES * KV_BYTES;
    static constexpr int barriers = v_tiles + STAGES * KV_BYTES;
    static constexpr int total = barriers + (1 + 3 * STAGES) * 8;
    static constexpr int num_buffers = 5;
    static constexpr int offsets[num_buffers] = {q_tile, do_tile, k_tiles, v_tiles, barriers};
    static_assert(KV_BYTES % 1024 == 0 && Q_BYTES % 1024 == 0, "swizzled chunks");
};

// Rows of lse * log2(e) and of delta that a (batch, query head) has in the dK/dV pass's copies:
// whole query tiles, so that each tile's rows are one bulk copy.
__host__ __device__ constexpr int padded_query_rows(int seqlen_q, int block_m) {
    return (seqlen_q + block_m - 1) / block_m * block_m;
}

// delta = rowsum(dO * O) (B, Hq, Sq) as attn_bwd_delta's, and for the dK/dV pass both rows
// per head padded with zeros to `rows` (padded_query_rows): rows_out [2][B * Hq * rows] holds
// lse * log2(e), then delta. A warp per ROWS_PER_WARP consecutive padded rows.
template <typename T, int NUM_WARPS, int ROWS_PER_WARP>
__global__ void
__launch_bounds__(NUM_WARPS * 32)
    attn_bwd_delta_wgmma_half(const T* __restrict__ dout, const T* __restrict__ out, const float* __restrict__ lse,
                              float* __restrict__ delta, float* __restrict__ rows_out, long long do_sb,
                              long long do_ss, long long do_sh, long long o_sb, long long o_ss, long long o_sh,
                              int n_heads_q, int seqlen_q, int head_dim_v, int rows, long long total_rows) {
    const long long row0 = ((long long)blockIdx.x * NUM_WARPS + threadIdx.x / 32) * ROWS_PER_WARP;
    if (row0 >= total_rows) return;
    const int lane = threadIdx.x % 32;
    const T* a[ROWS_PER_WARP];
    const T* c[ROWS_PER_WARP];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const long long row = min(row0 + r, total_rows - 1);
        const int i = min((int)(row % rows), seqlen_q - 1);  // padding: a row again, not stored
        delta_rows_at(dout, out, do_sb, do_ss, do_sh, o_sb, o_ss, o_sh, n_heads_q, row / rows, i, a[r], c[r]);
    }
    float sum[ROWS_PER_WARP];
    warp_row_dots<T, ROWS_PER_WARP>(a, c, head_dim_v, lane, sum);
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const float s = group_sum<32>(sum[r]);
        const long long row = row0 + r;
        if (lane != 0 || row >= total_rows) continue;
        const int i = (int)(row % rows);
        const long long unpadded = row / rows * seqlen_q + i;
        const bool ok = i < seqlen_q;
        rows_out[row] = ok ? lse[unpadded] * LOG2E : 0.0f;
        rows_out[total_rows + row] = ok ? s : 0.0f;
        if (ok) delta[unpadded] = s;
    }
}

// Named barriers of the fused pass (5: the consumers' own): dS^T tile i % 2 written; in the
// dK/dV pass with SPLIT_SCORES: both halves of P^T, then of dS^T, written.
constexpr int DS_READY = 6;

// f(r, c, x0, x1) for an m64 accumulator tile's warp rows r (g and g + 8, from row0) below
// valid_rows and its column pairs c, c + 1 (col0 + 8j + 2t) below valid_cols.
template <int N_BLOCKS, class F>
__device__ __forceinline__ void for_each_pair(const float (&acc)[N_BLOCKS][4], int row0, int valid_rows, int col0,
                                              int valid_cols, int lane, F&& f) {
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = row0 + g + half * 8;
        if (r >= valid_rows) continue;
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j) {
            const int c = col0 + j * 8 + 2 * t;  // head_dim % 8 == 0: c and c + 1 both in or both out
            if (c < valid_cols) f(r, c, acc[j][half * 2], acc[j][half * 2 + 1]);
        }
    }
}

// Write an m64 accumulator tile's warp rows (16) times `scale` to dst rows [0, valid_rows)
// (row stride dst_stride), columns [col0, col0 + N) below valid_cols.
template <typename T, int N_BLOCKS>
__device__ __forceinline__ void store_half_rows(T* dst, long long dst_stride, const float (&acc)[N_BLOCKS][4],
                                                float scale, int valid_rows, int col0, int valid_cols, int lane) {
    for_each_pair(acc, 0, valid_rows, col0, valid_cols, lane, [&](int r, int c, float x0, float x1) {
        *reinterpret_cast<unsigned*>(dst + r * dst_stride + c) = HalfOps<T>::pack(x0 * scale, x1 * scale);
    });
}

// The float32 dQ accumulator the fused pass adds into: per (batch, query head, 64-row query
// tile), D_CHUNKS chunks of 64 x 64 floats in accumulator order (dq_tile_index); ORDERED, one
// counter per tile: how many key blocks have added theirs, the next to add waits for its turn.
struct DqAccumulator {
    float* p;
    int* turns;
    int m_tiles;
};

// Where accumulator element e (0-3) of n-block j of thread tid of a consumer warpgroup goes in a
// 64 x 64 chunk of a dQ tile: each warp's stores of a float4 are 512 contiguous bytes.
__host__ __device__ constexpr int dq_tile_index(int j, int tid, int e) { return j * 512 + tid * 4 + e; }

// dS^T's (or P^T's) packed A operands (bf16 / f16 pairs; rows warp_row and warp_row + 8 of the
// warp's 16, 16 queries a k-step, from query 8 * unit0) into a swizzled [keys][64 queries] tile:
// dQ = dS K reads it MN-major, dK += dS^T Q and dV += P^T dO K-major. A k-step's four words are
// stmatrix's four 8 x 8 matrices (a_from_acc's word order): lane l gives the address of row l % 8
// of matrix l / 8, 16 bytes.
template <int KK>
__device__ __forceinline__ void store_ds_tile(unsigned char* tile, int warp_row, const unsigned (&a)[KK][4], int lane,
                                              int unit0 = 0) {
    const int m = lane / 8, r = warp_row + (m % 2) * 8 + lane % 8;
    const unsigned row_addr = wg_smem_addr(tile) + r * 128;
#pragma unroll
    for (int kk = 0; kk < KK; ++kk) {
        const int unit = unit0 + 2 * kk + m / 2;
        asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(
                         row_addr + ((unit ^ (r % 8)) * 16)),
                     "r"(a[kk][0]), "r"(a[kk][1]), "r"(a[kk][2]), "r"(a[kk][3])
                     : "memory");
    }
}

// A key block's work items in order (bwd_dkdv_wgmma_half): query tiles from the last down, the
// GQA group's query heads inner; `next` steps without a division (one an item cost each consumer
// warp about 20 instructions and a MUFU round trip on its way to the item's first products).
struct GroupItems {
    int first_hq, end_hq, m0;
    int hq = first_hq;
    __device__ __forceinline__ void next(int block_m) {
        if (++hq == end_hq) {
            hq = first_hq;
            m0 -= block_m;
        }
    }
};

// The dK/dV pass, and with FUSED dQ added into a float32 accumulator (the kernels below),
// ORDERED in the order of the key blocks.
template <class L, typename T, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL, bool FUSED,
          bool ORDERED = false>
__device__ __forceinline__ void bwd_dkdv_wgmma_half(const float* __restrict__ lse_log2, const float* __restrict__ delta,
                                                    T* __restrict__ dk, T* __restrict__ dv, long long dk_sb,
                                                    long long dk_ss, long long dk_sh, long long dv_sb, long long dv_ss,
                                                    long long dv_sh, int n_heads_q, int n_heads_kv, int seqlen_q,
                                                    int seqlen_k, int head_dim, int head_dim_v, int num_n_tiles,
                                                    float scale, float scale_log2, int causal_offset,
                                                    const BwdTmaMaps& maps, DqAccumulator dq_accum) {
    constexpr int D_CHUNKS = L::D_CHUNKS, STAGES = L::STAGES;
    constexpr int CONSUMERS = NUM_WARPS * 32;
    constexpr int KEY_WGS = BLOCK_N / 64;  // warpgroups with distinct keys
    constexpr int D_SPLIT = dkdv_d_split(NUM_WARPS, BLOCK_N);  // warpgroups sharing 64 keys
    constexpr int PART_CHUNKS = D_CHUNKS / D_SPLIT;  // chunks of dK, dV a warpgroup keeps
    constexpr int D_PART = 64 * PART_CHUNKS;
    // A pair sharing keys splits each query tile's scores (S_QUERIES each) rather than
    // computing them twice; P^T and dS^T go through shared tiles of 64 queries.
    constexpr bool SPLIT_SCORES = D_SPLIT == 2;
    constexpr int S_QUERIES = BLOCK_M / D_SPLIT;  // the query columns of a warpgroup's S^T
    constexpr int M_BLOCKS = S_QUERIES / 8;  // 8-query column blocks of S^T
    constexpr int K_STEPS = D_PAD / 16;
    static_assert(same_type<T, __half> || same_type<T, __nv_bfloat16>, "16-bit inputs");
    static_assert(BLOCK_N % 64 == 0 && NUM_WARPS % 4 == 0 && (NUM_WARPS / 4) % KEY_WGS == 0, "64 keys a warpgroup");
    static_assert(D_SPLIT * PART_CHUNKS == D_CHUNKS, "warpgroups sharing keys split whole chunks");
    static_assert(D_PAD % 16 == 0 && BLOCK_M % 16 == 0, "tile shape");
    static_assert(!FUSED || (BLOCK_M == 64 && KEY_WGS == 2 && D_SPLIT == 1 && D_CHUNKS <= 2),
                  "fused: a 64-query dS^T tile of two warpgroups' keys, at most one dQ chunk each");
    static_assert(D_SPLIT <= 2 && (!SPLIT_SCORES || (!FUSED && KEY_WGS == 1 && BLOCK_M == 64)),
                  "split scores: one pair of warpgroups, 64-query P^T and dS^T tiles");
    using WgS = WgmmaHalf<T, S_QUERIES>;
    using WgD = WgmmaHalf<T, D_PART>;
    using WgQ = WgmmaHalf<T, 64>;

    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + L::barriers);
    unsigned long long* kv_full = bars;
    unsigned long long* full = bars + 1;  // [STAGES]: Q, dO, lse and delta landed
    unsigned long long* empty = bars + 1 + STAGES;  // [STAGES]: every consumer warp done with it
    float* lse_tiles = reinterpret_cast<float*>(smem + L::lse_tiles);
    float* delta_tiles = reinterpret_cast<float*>(smem + L::delta_tiles);
    if (wg_smem_addr(smem) % 1024 != 0) __trap();  // the swizzle would disagree with the descriptors

    const int warp = warp_uniform_index();
    const int lane = threadIdx.x % 32;
    const KeyBlock kb = key_block<CAUSAL, BLOCK_N>(num_n_tiles, n_heads_q, n_heads_kv);
    const int b = (int)kb.b, h_kv = kb.h_kv, n0 = kb.n0;
    // Work items (query head of the group, query tile): the tiles with a row that sees a key
    // of this block.
    const int m_begin = first_query_tile<CAUSAL, BLOCK_M>(n0, causal_offset);
    const int m_tiles = m_begin < seqlen_q ? (seqlen_q - m_begin + BLOCK_M - 1) / BLOCK_M : 0;
    const int n_items = kb.group * m_tiles;
    // Items run from the last query tile down, the group's query heads inner: the blocks that run
    // together read the same Q and dO tiles about together, and ORDERED, one key block's turn at a
    // tile comes right after the block before it has been there (heads outer, causal, each block
    // would wait for the extra tiles of every head before it).
    const GroupItems first_item{h_kv * kb.group, h_kv * kb.group + kb.group, m_begin + (m_tiles - 1) * BLOCK_M};

    // Fused: dq_full[2] (a dQ tile written: each consumer warp writing one arrives), dq_empty[2]
    // (added to global memory: the dQ warp's arrival).
    constexpr int DQ_WARPS = 4 * (D_CHUNKS < 2 ? D_CHUNKS : 2);  // (at most 2 chunks when FUSED)
    unsigned long long* dq_full = nullptr;
    unsigned long long* dq_empty = nullptr;
    if constexpr (FUSED) {
        dq_full = reinterpret_cast<unsigned long long*>(smem + L::dq_barriers);
        dq_empty = dq_full + 2;
        if (threadIdx.x == 0)
            for (int i = 0; i < 2; ++i) {
                mbarrier_init(&dq_full[i], DQ_WARPS);
                mbarrier_init(&dq_empty[i], 1);
            }
    }
    init_mbarriers<1 + STAGES, STAGES, NUM_WARPS>(bars);

    if (warp >= NUM_WARPS) {  // the producer warpgroup
        setmaxnreg_dec<24>();
        if (warp == NUM_WARPS && lane == 0) {
            prefetch_tma_map(&maps.q);
            prefetch_tma_map(&maps.k);
            prefetch_tma_map(&maps.v);
            prefetch_tma_map(&maps.dout);
            mbarrier_expect_tx(kv_full, 2 * L::KV_BYTES);
            for (int c = 0; c < D_CHUNKS; ++c) {
                tma_load_4d(smem + L::k_tile + c * BLOCK_N * 128, &maps.k, c * 64, n0, h_kv, b, kv_full);
                tma_load_4d(smem + L::v_tile + c * BLOCK_N * 128, &maps.v, c * 64, n0, h_kv, b, kv_full);
            }
            const int rows = padded_query_rows(seqlen_q, BLOCK_M);
            GroupItems it = first_item;
            for (int item = 0; item < n_items; ++item, it.next(BLOCK_M)) {
                const int stage = item % STAGES, round = item / STAGES;
                const int hq = it.hq, m0 = it.m0;
                if (round > 0) mbarrier_wait(&empty[stage], (round - 1) & 1);
                mbarrier_expect_tx(&full[stage], 2 * L::QD_BYTES + 2 * BLOCK_M * 4);
                unsigned char* qs = smem + L::q_tiles + stage * L::QD_BYTES;
                unsigned char* dos = smem + L::do_tiles + stage * L::QD_BYTES;
                for (int c = 0; c < D_CHUNKS; ++c) {
                    tma_load_4d(qs + c * BLOCK_M * 128, &maps.q, c * 64, m0, hq, b, &full[stage]);
                    tma_load_4d(dos + c * BLOCK_M * 128, &maps.dout, c * 64, m0, hq, b, &full[stage]);
                }
                const long long row = ((long long)b * n_heads_q + hq) * rows + m0;
                bulk_load(lse_tiles + stage * BLOCK_M, lse_log2 + row, BLOCK_M * 4, &full[stage]);
                bulk_load(delta_tiles + stage * BLOCK_M, delta + row, BLOCK_M * 4, &full[stage]);
            }
        } else if (FUSED && warp == NUM_WARPS + 1 && lane == 0) {
            if constexpr (FUSED) {
                // The dQ warp: each item's dQ tile added to the accumulator by the TMA, ORDERED
                // after the key blocks before this one have added theirs.
                GroupItems it = first_item;
                for (int item = 0; item < n_items; ++item, it.next(BLOCK_M)) {
                    const int buf = item % 2;
                    const long long tile = (kb.b * n_heads_q + it.hq) * dq_accum.m_tiles + it.m0 / BLOCK_M;
                    mbarrier_wait(&dq_full[buf], (item / 2) & 1);
                    if constexpr (ORDERED)
                        while (load_acquire(dq_accum.turns + tile) != n0 / BLOCK_N) {
                        }
                    bulk_reduce_add_f32(dq_accum.p + tile * (L::DQ_BYTES / 4), smem + L::dq_tiles + buf * L::DQ_BYTES,
                                        L::DQ_BYTES);
                    bulk_commit();
                    if constexpr (ORDERED) {
                        bulk_wait<0, false>();
                        red_release_add(dq_accum.turns + tile, 1);
                    } else {
                        bulk_wait<0, true>();
                    }
                    mbarrier_arrive(&dq_empty[buf]);
                }
                bulk_wait<0, false>();
            }
        }
        return;
    }
    setmaxnreg_inc<240>();

    const int wg = warp / 4;
    const int key_wg = wg % KEY_WGS, d_part = wg / KEY_WGS;
    const int g = lane / 4, t = lane % 4;
    const int wg_key0 = n0 + key_wg * 64;
    const int warp_key0 = wg_key0 + (warp % 4) * 16;
    const unsigned k_addr = wg_smem_addr(smem + L::k_tile) + key_wg * 64 * 128;  // the warpgroup's 64 rows
    const unsigned v_addr = wg_smem_addr(smem + L::v_tile) + key_wg * 64 * 128;

    float dk_acc[D_PART / 8][4], dv_acc[D_PART / 8][4];
#pragma unroll
    for (int j = 0; j < D_PART / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dk_acc[j][e] = dv_acc[j][e] = 0.0f;

    // DEFER: the last item's dV and dK products run on into the next item, whose S^T wait
    // sees them completed and releases their stage (pending). Where ptxas has the registers
    // for it (up to 160 accumulators a thread): past that it serializes every wgmma instead.
    // Fused, past that dK reads dS^T from its shared tile (DK_FROM_TILE), so that no register
    // operand outlives an item and its dK product may still run on; not causal, where the
    // registers' serialized products measured faster (docs/bench/evidence.md).
    constexpr bool DK_FROM_TILE = FUSED && !CAUSAL && D_PART + BLOCK_M > 160;
    static_assert(!DK_FROM_TILE || D_CHUNKS == 2, "every item takes a dQ chunk (after the dS^T barrier)");
    // SPLIT_SCORES: no register operands.
    constexpr bool DEFER = DK_FROM_TILE || SPLIT_SCORES || D_PART + BLOCK_M <= 160;
    unsigned pa[M_BLOCKS / 2][4], dsa[M_BLOCKS / 2][4];
    // The register A operands an item's last products may still read (none with DK_FROM_TILE:
    // there dV has completed before the item's end, every item taking a dQ chunk).
    auto fence_register_operands = [&] {
        if constexpr (!DK_FROM_TILE && !SPLIT_SCORES) {
#pragma unroll
            for (int kk = 0; kk < M_BLOCKS / 2; ++kk) {
                fence_operand(pa[kk]);
                fence_operand(dsa[kk]);
            }
        }
    };
    int pending = -1;
    mbarrier_wait(kv_full, 0);
    if constexpr (FUSED) {
        // Keys no query sees (causal) may hold NaN or inf: dQ = dS K would multiply their zero
        // dS by them, so their K rows are zeroed (rows past seqlen_k are zeros from the TMA).
        const int unseen = seqlen_q + causal_offset;  // the first key no query sees
        if (CAUSAL && unseen < n0 + BLOCK_N && unseen < seqlen_k) {
            zero_rows_from<D_CHUNKS, BLOCK_N, CONSUMERS>(smem + L::k_tile, max(unseen - n0, 0));
            fence_proxy_async();
            named_barrier_sync(5, CONSUMERS);
        }
    }
    GroupItems it = first_item;
    for (int item = 0; item < n_items; ++item, it.next(BLOCK_M)) {
        const int stage = item % STAGES;
        const int m0 = it.m0;
        const unsigned q_addr = wg_smem_addr(smem + L::q_tiles + stage * L::QD_BYTES);
        const unsigned do_addr = wg_smem_addr(smem + L::do_tiles + stage * L::QD_BYTES);
        const int q0 = SPLIT_SCORES ? d_part * S_QUERIES : 0;  // the first query of this warpgroup's S^T
        const float* lse_s = lse_tiles + stage * BLOCK_M + q0;
        const float* delta_s = delta_tiles + stage * BLOCK_M + q0;
        // Causal: no row of this tile sees the warpgroup's first key (it still waits for the
        // stage before it releases it, so that its arrival counts toward this round's phase).
        // Fused, both warpgroups' dS^T (zeros there) make the dQ tile.
        const bool skip = !FUSED && (wg_key0 >= seqlen_k || (CAUSAL && wg_key0 > m0 + BLOCK_M - 1 + causal_offset));
        mbarrier_wait(&full[stage], (item / STAGES) & 1);
        if (!skip) {
            float s[M_BLOCKS][4], dp[M_BLOCKS][4];
            wgmma_fence();
            wgmma_kmajor<WgS, K_STEPS, true>(s, k_addr, BLOCK_N, q_addr + q0 * 128, BLOCK_M);
            wgmma_commit();
            wgmma_kmajor<WgS, K_STEPS, true>(dp, v_addr, BLOCK_N, do_addr + q0 * 128, BLOCK_M);
            wgmma_commit();

            const int mq0 = m0 + q0;
            const bool needs_mask = mq0 + S_QUERIES > seqlen_q || warp_key0 + 16 > seqlen_k ||
                                    (CAUSAL && warp_key0 + 15 > mq0 + causal_offset);
            // P^T while dP^T runs (the last item's dV and dK have completed before S^T).
            wgmma_wait<1>();
            fence_operand(s);
            if (DEFER && pending >= 0) {
                fence_register_operands();
                mbarrier_arrive_warp(&empty[pending]);
            }
            // Two loops, not one with needs_mask in every select: most tiles need no mask.
            if (needs_mask) {
#pragma unroll
                for (int j = 0; j < M_BLOCKS; ++j) {
                    const float2 l2 = *reinterpret_cast<const float2*>(lse_s + j * 8 + 2 * t);
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int key = warp_key0 + g + (e / 2) * 8;
                        const int row = mq0 + j * 8 + 2 * t + e % 2;
                        const bool visible =
                            (row < seqlen_q) & (key < seqlen_k) & (!CAUSAL | (key <= row + causal_offset));
                        const float p = exp2_ftz(fmaf(s[j][e], scale_log2, -(e % 2 ? l2.y : l2.x)));
                        s[j][e] = visible ? p : 0.0f;
                    }
                }
            } else {
#pragma unroll
                for (int j = 0; j < M_BLOCKS; ++j) {
                    const float2 l2 = *reinterpret_cast<const float2*>(lse_s + j * 8 + 2 * t);
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[j][e] = exp2_ftz(fmaf(s[j][e], scale_log2, -(e % 2 ? l2.y : l2.x)));
                }
            }
            pack_a_operands<T>(pa, s);
            const unsigned do_part = do_addr + d_part * PART_CHUNKS * BLOCK_M * 128;
            // SPLIT_SCORES: this item's P^T and dS^T tiles; each warpgroup writes its queries' half,
            // then the pair meets.
            unsigned char* p_tile = nullptr;
            unsigned char* ds_half = nullptr;
            auto share_half = [&](unsigned char* tile, const unsigned(&a)[M_BLOCKS / 2][4]) {
                store_ds_tile(tile, (warp % 4) * 16, a, lane, q0 / 8);
                fence_proxy_async();
                named_barrier_sync(DS_READY, CONSUMERS);
            };
            if constexpr (SPLIT_SCORES) {
                p_tile = smem + L::p_tiles + item % 2 * L::DS_BYTES;
                ds_half = smem + L::ds_tiles + item % 2 * L::DS_BYTES;
                share_half(p_tile, pa);
            }
            wgmma_fence();
            const unsigned long long do_desc = desc_sw128(do_part, BLOCK_M * 128);
#pragma unroll
            for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                const auto b = desc_plus(do_desc, kk * 2048);
                if constexpr (SPLIT_SCORES)
                    WgD::template ss<true, false, true>(dv_acc, kmajor_step(wg_smem_addr(p_tile), BLOCK_N, kk), b);
                else
                    WgD::template rs<true>(dv_acc, pa[kk], b);
            }
            wgmma_commit();

            // dS^T while dV runs.
            wgmma_wait<1>();
            fence_operand(dp);
            // A select where a mask was needed: dP^T of keys no row sees may be NaN.
            if (needs_mask) {
#pragma unroll
                for (int j = 0; j < M_BLOCKS; ++j) {
                    const float2 d2 = *reinterpret_cast<const float2*>(delta_s + j * 8 + 2 * t);
#pragma unroll
                    for (int e = 0; e < 4; ++e)
                        dp[j][e] = s[j][e] != 0.0f ? s[j][e] * (dp[j][e] - (e % 2 ? d2.y : d2.x)) : 0.0f;
                }
            } else {
#pragma unroll
                for (int j = 0; j < M_BLOCKS; ++j) {
                    const float2 d2 = *reinterpret_cast<const float2*>(delta_s + j * 8 + 2 * t);
#pragma unroll
                    for (int e = 0; e < 4; ++e) dp[j][e] = s[j][e] * (dp[j][e] - (e % 2 ? d2.y : d2.x));
                }
            }
            pack_a_operands<T>(dsa, dp);
            const unsigned q_part = q_addr + d_part * PART_CHUNKS * BLOCK_M * 128;
            unsigned char* ds_tile = nullptr;  // (fused: this item's dS^T tile)
            if constexpr (FUSED) ds_tile = smem + L::ds_tiles + item % 2 * L::DS_BYTES;
            // dK += dS^T Q; DK_FROM_TILE: dS^T from the warpgroup's 64 rows of ds_tile, K-major (one
            // 64-query chunk: a k-step is 32 bytes into each 128-byte row).
            auto issue_dk = [&] {
                wgmma_fence();
                const unsigned long long q_desc = desc_sw128(q_part, BLOCK_M * 128);
#pragma unroll
                for (int kk = 0; kk < BLOCK_M / 16; ++kk) {
                    const auto b = desc_plus(q_desc, kk * 2048);
                    if constexpr (DK_FROM_TILE)
                        WgD::template ss<true, false, true>(
                            dk_acc, kmajor_step(wg_smem_addr(ds_tile) + key_wg * 64 * 128, BLOCK_N, kk), b);
                    else if constexpr (SPLIT_SCORES)
                        WgD::template ss<true, false, true>(dk_acc, kmajor_step(wg_smem_addr(ds_half), BLOCK_N, kk), b);
                    else
                        WgD::template rs<true>(dk_acc, dsa[kk], b);
                }
                wgmma_commit();
            };
            if constexpr (FUSED) {
                // dS^T into this item's tile; once both warpgroups' halves are there, one
                // 64-column chunk of dQ = dS K a warpgroup (D_CHUNKS 1: every other item),
                // added to dq_accum while dK's products run. (Each branch issues and waits
                // whole: ptxas serializes wgmmas across one.)
                store_ds_tile(ds_tile, key_wg * 64 + (warp % 4) * 16, dsa, lane);
                fence_proxy_async();
                const int dq_chunk = (wg + item) % 2;
                if (dq_chunk < D_CHUNKS) {
                    named_barrier_sync(DS_READY + item % 2, CONSUMERS);
                    const unsigned ds_addr = wg_smem_addr(ds_tile);
                    const unsigned kc_addr = wg_smem_addr(smem + L::k_tile) + dq_chunk * BLOCK_N * 128;
                    float dq_acc[8][4];
                    wgmma_fence();
                    const unsigned long long ds_desc = desc_sw128(ds_addr, BLOCK_N * 128);
                    const unsigned long long kc_desc = desc_sw128(kc_addr, BLOCK_N * 128);
#pragma unroll
                    for (int kk = 0; kk < BLOCK_N / 16; ++kk) {
                        const auto a = desc_plus(ds_desc, kk * 2048), b = desc_plus(kc_desc, kk * 2048);
                        if (kk == 0)
                            WgQ::template ss<false, true>(dq_acc, a, b);
                        else
                            WgQ::template ss<true, true>(dq_acc, a, b);
                    }
                    wgmma_commit();
                    issue_dk();
                    wgmma_wait<1>();
                    fence_operand(dq_acc);
                    // Into dQ tile item % 2 once the dQ warp has added what was there.
                    const int buf = item % 2;
                    if (item >= 2) mbarrier_wait(&dq_empty[buf], (item / 2 - 1) & 1);
                    float* dq_tile = reinterpret_cast<float*>(smem + L::dq_tiles + buf * L::DQ_BYTES) + dq_chunk * 4096;
                    const int tid = threadIdx.x % 128;
#pragma unroll
                    for (int j = 0; j < 8; ++j)
                        *reinterpret_cast<float4*>(dq_tile + dq_tile_index(j, tid, 0)) =
                            make_float4(dq_acc[j][0], dq_acc[j][1], dq_acc[j][2], dq_acc[j][3]);
                    fence_proxy_async();
                    mbarrier_arrive_warp(&dq_full[buf]);
                } else {
                    named_barrier_arrive(DS_READY + item % 2, CONSUMERS);  // (D_CHUNKS 1: dK from registers)
                    issue_dk();
                }
            } else {
                if constexpr (SPLIT_SCORES) share_half(ds_half, dsa);
                issue_dk();
            }
            if (DEFER) {
                pending = stage;
                continue;
            }
        }
        if (!DEFER || pending >= 0) {  // (a skipped item after one whose products still run)
            wgmma_wait<0>();
            fence_register_operands();
            if (DEFER) mbarrier_arrive_warp(&empty[pending]);
            pending = -1;
        }
        mbarrier_arrive_warp(&empty[stage]);
    }
    wgmma_wait<0>();
    fence_register_operands();
    fence_operand(dv_acc);
    fence_operand(dk_acc);
    if (pending >= 0) mbarrier_arrive_warp(&empty[pending]);

    const int d0 = d_part * D_PART;
    store_half_rows<T>(dk + kb.b * dk_sb + h_kv * dk_sh + (long long)warp_key0 * dk_ss, dk_ss, dk_acc, scale,
                       seqlen_k - warp_key0, d0, head_dim, lane);
    store_half_rows<T>(dv + kb.b * dv_sb + h_kv * dv_sh + (long long)warp_key0 * dv_ss, dv_ss, dv_acc, 1.0f,
                       seqlen_k - warp_key0, d0, head_dim_v, lane);
}

// (q, k, v, dout and their strides: the backward's common launch; the TMA reads them through
// maps)
#define CUPYATTN_BWD_DKDV_WGMMA_HALF_PARAMS                                                                            \
    const T *__restrict__ q, const T *__restrict__ k, const T *__restrict__ v, const T *__restrict__ dout,             \
        const float *__restrict__ lse_log2, const float *__restrict__ delta, T *__restrict__ dk, T *__restrict__ dv,   \
        long long q_sb, long long q_ss, long long q_sh, long long k_sb, long long k_ss, long long k_sh,                \
        long long v_sb, long long v_ss, long long v_sh, long long do_sb, long long do_ss, long long do_sh,             \
        long long dk_sb, long long dk_ss, long long dk_sh, long long dv_sb, long long dv_ss, long long dv_sh,          \
        int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k, int head_dim, int head_dim_v, int num_n_tiles,      \
        float scale, float scale_log2, int causal_offset, const __grid_constant__ BwdTmaMaps maps
#define CUPYATTN_BWD_DKDV_WGMMA_HALF_ARGS                                                                              \
    lse_log2, delta, dk, dv, dk_sb, dk_ss, dk_sh, dv_sb, dv_ss, dv_sh, n_heads_q, n_heads_kv, seqlen_q, seqlen_k,      \
        head_dim, head_dim_v, num_n_tiles, scale, scale_log2, causal_offset, maps

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32 + 128, 1)
    attn_bwd_dkdv_wgmma_half(CUPYATTN_BWD_DKDV_WGMMA_HALF_PARAMS) {
    using L = select_type<dkdv_d_split(NUM_WARPS, BLOCK_N) == 2, BwdDkdvSplitWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>,
                          BwdDkdvWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>>;
    bwd_dkdv_wgmma_half<L, T, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS, CAUSAL, false>(CUPYATTN_BWD_DKDV_WGMMA_HALF_ARGS,
                                                                                 DqAccumulator{});
}

// dK, dV and dQ in one pass: each query tile's dQ products added to dq_accum (zeros, tiles of
// DqAccumulator's order, m_tiles 64-row tiles a head) by the TMA; ORDERED (bitwise
// reproducible), in the order of the key blocks, counted in dq_turns (zeros, one a tile), else
// in whatever order blocks get there. attn_bwd_dq_convert then scales and rounds it into dq.
template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL, bool ORDERED>
__global__ void __launch_bounds__(NUM_WARPS * 32 + 128, 1)
    attn_bwd_fused_wgmma_half(CUPYATTN_BWD_DKDV_WGMMA_HALF_PARAMS, float* __restrict__ dq_accum,
                              int* __restrict__ dq_turns, int m_tiles) {
    using L = BwdFusedWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>;
    bwd_dkdv_wgmma_half<L, T, D_PAD, BLOCK_M, BLOCK_N, NUM_WARPS, CAUSAL, true, ORDERED>(
        CUPYATTN_BWD_DKDV_WGMMA_HALF_ARGS, DqAccumulator{dq_accum, dq_turns, m_tiles});
}

#undef CUPYATTN_BWD_DKDV_WGMMA_HALF_PARAMS
#undef CUPYATTN_BWD_DKDV_WGMMA_HALF_ARGS

// dq = scale * dq_accum rounded to T: dq_accum the fused pass's float32 tiles (B, Hq, m_tiles,
// d_chunks, 64 x 64 in dq_tile_index order), dq (b, s, h) strided with its last dimension
// contiguous. A block a 64-row tile: read whole into shared memory (a float4 a thread, in the
// accumulator's order), then written row by row, eight columns a thread (one 16-byte store
// where dq's rows allow it), so that both the reads and the writes are whole sectors.
template <typename T, int NUM_WARPS>
__global__ void __launch_bounds__(NUM_WARPS * 32)
    attn_bwd_dq_convert(const float* __restrict__ dq_accum, T* __restrict__ dq, long long dq_sb, long long dq_ss,
                        long long dq_sh, int n_heads_q, int seqlen_q, int head_dim, int d_chunks, float scale) {
    constexpr int THREADS = NUM_WARPS * 32;
    // Floats a row (at most two chunks), +8: a half-warp's float2 stores fall in distinct banks.
    constexpr int STRIDE = 2 * 64 + 8;
    __shared__ __align__(16) float rows[64 * STRIDE];
    const int m_tiles = (seqlen_q + 63) / 64;
    const long long tile = blockIdx.x, bh = tile / m_tiles;
    const int m0 = (int)(tile - bh * m_tiles) * 64;
    const float4* src = reinterpret_cast<const float4*>(dq_accum + tile * d_chunks * 4096);
    for (int i = threadIdx.x; i < d_chunks * 1024; i += THREADS) {  // i = dq_tile_index(j, tid, 0) / 4
        const int chunk = i / 1024, j = i % 1024 / 128, tid = i % 128, lane = tid % 32;
        const int r = tid / 32 * 16 + lane / 4, c = chunk * 64 + j * 8 + 2 * (lane % 4);
        const float4 x = src[i];
        *reinterpret_cast<float2*>(&rows[r * STRIDE + c]) = make_float2(x.x, x.y);
        *reinterpret_cast<float2*>(&rows[(r + 8) * STRIDE + c]) = make_float2(x.z, x.w);
    }
    __syncthreads();
    T* out = dq + bh / n_heads_q * dq_sb + bh % n_heads_q * dq_sh;
    const bool whole = reinterpret_cast<unsigned long long>(out) % 16 == 0 && dq_ss % 8 == 0;
    const int units = head_dim / 8;  // (head_dim % 8 == 0)
    for (int i = threadIdx.x; i < 64 * units; i += THREADS) {
        const int r = i / units, u = i % units;
        if (m0 + r >= seqlen_q) break;  // (rows in order: the rest are past the end too)
        const float* x = &rows[r * STRIDE + u * 8];
        unsigned w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e) w[e] = HalfOps<T>::pack(x[2 * e] * scale, x[2 * e + 1] * scale);
        T* dst = out + (long long)(m0 + r) * dq_ss + u * 8;
        if (whole) {
            *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
        } else {
#pragma unroll
            for (int e = 0; e < 4; ++e) reinterpret_cast<unsigned*>(dst)[e] = w[e];
        }
    }
}

template <typename T, int D_PAD, int BLOCK_M, int BLOCK_N, int NUM_WARPS, bool CAUSAL>
__global__ void
__launch_bounds__(NUM_WARPS * 32 + 128, 1)
attn_bwd_dq_wgmma_half(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                       const T* __restrict__ dout, const float* __restrict__ lse, const float* __restrict__ delta,
                       T* __restrict__ dq, long long q_sb, long long q_ss, long long q_sh, long long k_sb,
                       long long k_ss, long long k_sh, long long v_sb, long long v_ss, long long v_sh,
                       long long do_sb, long long do_ss, long long do_sh, long long dq_sb, long long dq_ss,
                       long long dq_sh, int n_heads_q, int n_heads_kv, int seqlen_q, int seqlen_k, int head_dim,
                       int head_dim_v, int num_m_tiles, float scale, float scale_log2, int causal_offset,
                       const __grid_constant__ BwdTmaMaps maps) {
    using L = BwdDqWgmmaHalfLayout<T, D_PAD, BLOCK_M, BLOCK_N>;
    constexpr int D_CHUNKS = L::D_CHUNKS, STAGES = L::STAGES;
    constexpr int DQ_COLS = 64 * D_CHUNKS;  // MN-major swizzled B operands come 64 wide
    constexpr int CONSUMERS = NUM_WARPS * 32;
    constexpr int N_BLOCKS = BLOCK_N / 8;
    constexpr int K_STEPS = D_PAD / 16;
    static_assert(same_type<T, __half> || same_type<T, __nv_bfloat16>, "16-bit inputs");
    static_assert(NUM_WARPS % 4 == 0 && BLOCK_M == 16 * NUM_WARPS, "each consumer warpgroup owns 64 query rows");
    static_assert(D_PAD % 16 == 0 && BLOCK_N % 16 == 0, "tile shape");
    using WgS = WgmmaHalf<T, BLOCK_N>;
    using WgQ = WgmmaHalf<T, DQ_COLS>;

    extern __shared__ __align__(1024) unsigned char smem[];
    unsigned long long* bars = reinterpret_cast<unsigned long long*>(smem + L::barriers);
    unsigned long long* q_full = bars;
    unsigned long long* k_full = bars + 1;                 // [STAGES]
    unsigned long long* v_full = bars + 1 + STAGES;        // [STAGES]
    unsigned long long* empty = bars + 1 + 2 * STAGES;     // [STAGES]: K and V free again
    if (wg_smem_addr(smem) % 1024 != 0) __trap();

    const int warp = warp_uniform_index();
    const int lane = threadIdx.x % 32;
    const QueryBlock qb = query_block<CAUSAL, BLOCK_M>(num_m_tiles, n_heads_q, n_heads_kv);
    const int m0 = qb.m0;
    const int n_end = key_end<CAUSAL, BLOCK_M>(m0, seqlen_q, seqlen_k, causal_offset);
    const int n_tiles = (n_end + BLOCK_N - 1) / BLOCK_N;

    init_mbarriers<1 + 2 * STAGES, STAGES, NUM_WARPS>(bars);

    if (warp >= NUM_WARPS) {
        setmaxnreg_dec<24>();
        if (warp == NUM_WARPS && lane == 0) {
            const int b = (int)qb.b;
            prefetch_tma_map(&maps.q);
            prefetch_tma_map(&maps.k);
            prefetch_tma_map(&maps.v);
            prefetch_tma_map(&maps.dout);
            mbarrier_expect_tx(q_full, 2 * L::Q_BYTES);
            for (int c = 0; c < D_CHUNKS; ++c) {
                tma_load_4d(smem + L::q_tile + c * BLOCK_M * 128, &maps.q, c * 64, m0, qb.h, b, q_full);
                tma_load_4d(smem + L::do_tile + c * BLOCK_M * 128, &maps.dout, c * 64, m0, qb.h, b, q_full);
            }
            for (int tile = 0; tile < n_tiles; ++tile) {
                const int stage = tile % STAGES, round = tile / STAGES, n0 = tile * BLOCK_N;
                if (round > 0) mbarrier_wait(&empty[stage], (round - 1) & 1);
                unsigned char* ks = smem + L::k_tiles + stage * L::KV_BYTES;
                unsigned char* vs = smem + L::v_tiles + stage * L::KV_BYTES;
                mbarrier_expect_tx(&k_full[stage], L::KV_BYTES);
                for (int c = 0; c < D_CHUNKS; ++c)
                    tma_load_4d(ks + c * BLOCK_N * 128, &maps.k, c * 64, n0, qb.h_kv, b, &k_full[stage]);
                mbarrier_expect_tx(&v_full[stage], L::KV_BYTES);
                for (int c = 0; c < D_CHUNKS; ++c)
                    tma_load_4d(vs + c * BLOCK_N * 128, &maps.v, c * 64, n0, qb.h_kv, b, &v_full[stage]);
            }
        }
        return;
    }
    setmaxnreg_inc<240>();

    const int wg = warp / 4;
    const int g = lane / 4, t = lane % 4;
    const int wg_row0 = m0 + wg * 64;
    const int warp_row0 = wg_row0 + (warp % 4) * 16;
    const unsigned q_addr = wg_smem_addr(smem + L::q_tile) + wg * 64 * 128;
    const unsigned do_addr = wg_smem_addr(smem + L::do_tile) + wg * 64 * 128;

    // This thread's rows (g and g + 8 of the warp): lse (base 2) and delta.
    float lse_log2[2], dlt[2];
    const long long row_base = (qb.b * n_heads_q + qb.h) * (long long)seqlen_q;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int row = warp_row0 + g + half * 8;
        lse_log2[half] = row < seqlen_q ? lse[row_base + row] * LOG2E : 0.0f;
        dlt[half] = row < seqlen_q ? delta[row_base + row] : 0.0f;
    }

    float dq_acc[DQ_COLS / 8][4];
#pragma unroll
    for (int j = 0; j < DQ_COLS / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) dq_acc[j][e] = 0.0f;

    // DEFER: as in dK/dV, the last tile's dQ product runs on into the next tile, whose S wait
    // sees it completed and releases its stage (pending), where ptxas has the registers.
    constexpr bool DEFER = DQ_COLS / 2 + BLOCK_N <= 160;
    unsigned dsa[N_BLOCKS / 2][4];
    int pending = -1;
    mbarrier_wait(q_full, 0);
    for (int tile = 0; tile < n_tiles; ++tile) {
        const int stage = tile % STAGES, n0 = tile * BLOCK_N;
        const unsigned parity = (tile / STAGES) & 1;
        unsigned char* k_stage = smem + L::k_tiles + stage * L::KV_BYTES;
        const unsigned k_addr = wg_smem_addr(k_stage);
        const unsigned v_addr = wg_smem_addr(smem + L::v_tiles + stage * L::KV_BYTES);
        const bool skip = CAUSAL && n0 > wg_row0 + 63 + causal_offset;

        mbarrier_wait(&k_full[stage], parity);
        // A causal block's last tile may reach past every key its rows see (n_end): those K
        // rows (dQ's B operand) are zeroed before any product reads them. Both warpgroups,
        // then they meet.
        if (CAUSAL && n0 + BLOCK_N > n_end && n_end < seqlen_k) {
            zero_rows_from<D_CHUNKS, BLOCK_N, CONSUMERS>(k_stage, n_end - n0);
            fence_proxy_async();
            named_barrier_sync(5, CONSUMERS);
        }
        mbarrier_wait(&v_full[stage], parity);
        if (!skip) {
            float s[N_BLOCKS][4], dp[N_BLOCKS][4];
            wgmma_fence();
            wgmma_kmajor<WgS, K_STEPS>(s, q_addr, BLOCK_M, k_addr, BLOCK_N);
            wgmma_commit();
            wgmma_kmajor<WgS, K_STEPS>(dp, do_addr, BLOCK_M, v_addr, BLOCK_N);
            wgmma_commit();

            const bool needs_mask = warp_row0 + 16 > seqlen_q || n0 + BLOCK_N > seqlen_k ||
                                    (CAUSAL && n0 + BLOCK_N - 1 > warp_row0 + causal_offset);
            wgmma_wait<1>();  // P while dP runs (the last tile's dQ has completed before S)
            fence_operand(s);
            if (DEFER && pending >= 0) {
#pragma unroll
                for (int kk = 0; kk < N_BLOCKS / 2; ++kk) fence_operand(dsa[kk]);
                mbarrier_arrive_warp(&empty[pending]);
            }
            if (needs_mask) {  // (two loops, as in dK/dV)
#pragma unroll
                for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        const int row = warp_row0 + g + (e / 2) * 8;
                        const int key = n0 + j * 8 + 2 * t + e % 2;
                        const bool visible =
                            (row < seqlen_q) & (key < seqlen_k) & (!CAUSAL | (key <= row + causal_offset));
                        const float p = exp2_ftz(fmaf(s[j][e], scale_log2, -lse_log2[e / 2]));
                        s[j][e] = visible ? p : 0.0f;
                    }
            } else {
#pragma unroll
                for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) s[j][e] = exp2_ftz(fmaf(s[j][e], scale_log2, -lse_log2[e / 2]));
            }
            wgmma_wait<0>();
            fence_operand(dp);
#pragma unroll
            for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e)  // (a select: dP of keys no row sees may be NaN)
                    dp[j][e] = s[j][e] != 0.0f ? s[j][e] * (dp[j][e] - dlt[e / 2]) : 0.0f;
            pack_a_operands<T>(dsa, dp);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < N_BLOCKS / 2; ++kk)
                WgQ::template rs<true>(dq_acc, dsa[kk], desc_sw128(k_addr, BLOCK_N * 128, kk * 2048));
            wgmma_commit();
            if (DEFER) {
                pending = stage;
                continue;
            }
        }
        if (!DEFER || pending >= 0) {  // (a skipped tile after one whose product still runs)
            wgmma_wait<0>();
#pragma unroll
            for (int kk = 0; kk < N_BLOCKS / 2; ++kk) fence_operand(dsa[kk]);
            if (DEFER) mbarrier_arrive_warp(&empty[pending]);
            pending = -1;
        }
        mbarrier_arrive_warp(&empty[stage]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int kk = 0; kk < N_BLOCKS / 2; ++kk) fence_operand(dsa[kk]);
    fence_operand(dq_acc);
    if (pending >= 0) mbarrier_arrive_warp(&empty[pending]);

    store_half_rows<T>(dq + qb.b * dq_sb + qb.h * dq_sh + (long long)warp_row0 * dq_ss, dq_ss, dq_acc, scale,
                       seqlen_q - warp_row0, 0, head_dim, lane);
}

}  // namespace cupyattn
