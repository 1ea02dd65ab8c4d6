// Warp-level building blocks of the SIMT kernels (forward, dK/dV, dQ).
//
// A warp owns ROWS "rows" (query rows in the forward and dQ, keys in dK/dV)
// whose vectors it reads from shared memory by broadcast, and a tile of NCOLS
// "columns" (keys, or query rows in dK/dV) read by lane from padded rows:
//   column c lives in lane c % COL_LANES, slot c / COL_LANES; lanes that share a
//   column (D_SPLIT of them when NCOLS < 32) split the head dim and combine.
// Products go back through shuffles: a column's coefficient comes from its lane.
#pragma once

#include "common.cuh"

namespace cupyattn {

// Copy a [rows][cols] tile from global memory (row stride src_stride elements,
// contiguous columns) to shared memory (row stride DST_STRIDE), zero-filling rows
// >= valid_rows and columns >= valid_cols so padding never changes a result.
template <typename T, int ROWS, int COLS, int DST_STRIDE, int THREADS>
__device__ __forceinline__ void load_tile(T* dst, const T* src, long long src_stride, int valid_rows, int valid_cols) {
    for (int i = threadIdx.x; i < ROWS * COLS; i += THREADS) {
        const int r = i / COLS, c = i % COLS;
        dst[r * DST_STRIDE + c] = (r < valid_rows && c < valid_cols) ? src[r * src_stride + c] : Elem<T>::zero();
    }
}

// The slot grid.x gives a block: `rank` (0 = the tile with the most work) and `bh`
// (batch * heads + head), for a grid of num_tiles * heads blocks (api._launch).
// Not causal (every block the same work): rank fastest, so the blocks of one head run
// together and share its K and V in L2. Causal (a block's work falls with its rank):
// groups of heads in turn, each handing out its tiles heaviest first, heads fastest.
// With rank fastest over the whole grid the last head's heaviest tile starts near the
// end and runs alone. A group spans about 256 blocks (one head for 256 tiles or more,
// at most 32 heads): more heads at once stream more K and V through L2.
template <bool CAUSAL>
__device__ __forceinline__ void grid_slot(int num_tiles, int& rank, long long& bh) {
    const long long block = blockIdx.x;
    if (!CAUSAL) {
        rank = (int)(block % num_tiles);
        bh = block / num_tiles;
        return;
    }
    const long long heads = gridDim.x / num_tiles;
    const int group_heads = max(1, min(32, 256 / num_tiles));
    const long long first = block / ((long long)group_heads * num_tiles) * group_heads;
    const int group = (int)min((long long)group_heads, heads - first);  // the last group may be short
    const int within = (int)(block - first * num_tiles);
    rank = within / group;
    bh = first + within % group;
}

// Which (batch, query head, query tile) a block of the forward or dQ grid owns (rank 0
// is the last tile: causal rows there see the most keys).
struct QueryBlock {
    long long b;
    int h, h_kv, m0;
};

template <bool CAUSAL, int BLOCK_M>
__device__ __forceinline__ QueryBlock query_block(int num_m_tiles, int n_heads_q, int n_heads_kv) {
    int rank;
    long long bh;
    grid_slot<CAUSAL>(num_m_tiles, rank, bh);
    const int m_tile = num_m_tiles - 1 - rank;
    const int h = (int)(bh % n_heads_q);
    return {bh / n_heads_q, h, h / (n_heads_q / n_heads_kv), m_tile * BLOCK_M};
}

// Which (batch, key/value head, key tile) a block of the dK/dV grid owns (rank 0 is the
// first tile: causal queries see it most); `group` query heads share the head.
struct KeyBlock {
    long long b;
    int h_kv, group, n0;
};

template <bool CAUSAL, int BLOCK_N>
__device__ __forceinline__ KeyBlock key_block(int num_n_tiles, int n_heads_q, int n_heads_kv) {
    int rank;
    long long bh;
    grid_slot<CAUSAL>(num_n_tiles, rank, bh);
    return {bh / n_heads_kv, (int)(bh % n_heads_kv), n_heads_q / n_heads_kv, rank * BLOCK_N};
}

// The first query tile (a multiple of BLOCK_M) with a row that can see a key from n0
// on: causal rows see keys up to row + causal_offset.
template <bool CAUSAL, int BLOCK_M>
__device__ __forceinline__ int first_query_tile(int n0, int causal_offset) {
    return CAUSAL ? max(0, n0 - causal_offset) / BLOCK_M * BLOCK_M : 0;
}

// One past the last key a block of query rows [m0, m0 + BLOCK_M) can see: all of
// them, or up to the causal boundary of its last row (0 if that row sees none).
// The forward and dQ kernels load K/V only up to here and zero-fill the rest of the
// last tile: keys no row of the block may see are never read, so NaN or inf there
// cannot reach an output through 0 * NaN.
template <bool CAUSAL, int BLOCK_M>
__device__ __forceinline__ int key_end(int m0, int seqlen_q, int seqlen_k, int causal_offset) {
    if (!CAUSAL) return seqlen_k;
    const int last_row = min(m0 + BLOCK_M, seqlen_q) - 1;
    return max(0, min(seqlen_k, last_row + causal_offset + 1));
}

template <typename T, int ROWS, int NCOLS>
struct WarpTile {
    using E = Elem<T>;
    using Word = typename E::Word;
    static constexpr int VEC = E::VEC;
    static constexpr int COL_LANES = NCOLS < 32 ? NCOLS : 32;
    static constexpr int D_SPLIT = 32 / COL_LANES;
    static constexpr int CPL = NCOLS / COL_LANES;  // columns per lane
    static_assert(32 % COL_LANES == 0 && NCOLS % COL_LANES == 0, "NCOLS must be a power of two");

    __device__ static int col_of(int lane, int slot) { return lane % COL_LANES + slot * COL_LANES; }

    // acc[r][c] = <rows[r], cols[col_of(lane, c)]> over NW words; every lane of a
    // column ends with the full sum. Row r starts at rows + r * ROW_STRIDE (words).
    template <int NW, int ROW_STRIDE, int COL_STRIDE>
    __device__ static void dots(const Word* rows, const Word* cols, float (&acc)[ROWS][CPL], int lane) {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int c = 0; c < CPL; ++c) acc[r][c] = 0.0f;
#pragma unroll 2
        for (int w = lane / COL_LANES; w < NW; w += D_SPLIT) {
            float cf[CPL][VEC];
#pragma unroll
            for (int c = 0; c < CPL; ++c) E::unpack(cols[col_of(lane, c) * COL_STRIDE + w], cf[c]);
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                float rf[VEC];
                E::unpack(rows[r * ROW_STRIDE + w], rf);
#pragma unroll
                for (int c = 0; c < CPL; ++c)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) acc[r][c] = fmaf(rf[e], cf[c][e], acc[r][c]);
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
#pragma unroll
            for (int c = 0; c < CPL; ++c) acc[r][c] = warp_sum_from<COL_LANES>(acc[r][c]);
    }

    // Accumulators for an NW-word output row: lane owns words lane + 32 * t.
    template <int NW>
    struct Out {
        static constexpr int WORDS_PER_LANE = (NW + 31) / 32;
        float v[ROWS][WORDS_PER_LANE][VEC];

        __device__ void zero() {
#pragma unroll
            for (int r = 0; r < ROWS; ++r)
#pragma unroll
                for (int t = 0; t < WORDS_PER_LANE; ++t)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) v[r][t][e] = 0.0f;
        }

        __device__ void scale_row(int r, float alpha) {
#pragma unroll
            for (int t = 0; t < WORDS_PER_LANE; ++t)
#pragma unroll
                for (int e = 0; e < VEC; ++e) v[r][t][e] *= alpha;
        }

        // v[r] += sum_c coef[r][c] * mat[c] over the tile's NCOLS columns, where
        // coef is laid out like dots()' result and mat row c starts at c * STRIDE.
        template <int STRIDE>
        __device__ void accumulate(const float (&coef)[ROWS][CPL], const Word* mat, int lane) {
#pragma unroll
            for (int c = 0; c < NCOLS; ++c) {
                float k[ROWS];
#pragma unroll
                for (int r = 0; r < ROWS; ++r) k[r] = __shfl_sync(FULL_MASK, coef[r][c / COL_LANES], c % COL_LANES);
#pragma unroll
                for (int t = 0; t < WORDS_PER_LANE; ++t) {
                    const int w = lane + 32 * t;
                    if (w < NW) {
                        float mf[VEC];
                        E::unpack(mat[c * STRIDE + w], mf);
#pragma unroll
                        for (int r = 0; r < ROWS; ++r)
#pragma unroll
                            for (int e = 0; e < VEC; ++e) v[r][t][e] = fmaf(k[r], mf[e], v[r][t][e]);
                    }
                }
            }
        }

        // out[r * row_stride + d] = v[r][d] * factor[r] for rows < valid_rows, d < dim.
        __device__ void store(T* out, long long row_stride, int valid_rows, int dim, const float (&factor)[ROWS],
                              int lane) const {
#pragma unroll
            for (int r = 0; r < ROWS; ++r) {
                if (r >= valid_rows) break;
#pragma unroll
                for (int t = 0; t < WORDS_PER_LANE; ++t)
#pragma unroll
                    for (int e = 0; e < VEC; ++e) {
                        const int d = (lane + 32 * t) * VEC + e;
                        if (d < dim) out[r * row_stride + d] = E::from_float(v[r][t][e] * factor[r]);
                    }
            }
        }
    };
};

}  // namespace cupyattn
