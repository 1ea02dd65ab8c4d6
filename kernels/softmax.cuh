// Online softmax on a warp's 16 rows of score accumulators in the layout mma.sync's m16n8
// C tiles and wgmma's m64nN accumulators share: lane (g, t) holds s[j][e] = row g + 8 (e / 2),
// column 8j + 2t + e % 2. The forward kernels of every tensor-core family take their
// softmax from here.
#pragma once

#include "common.cuh"

namespace cupyattn {

// One online-softmax step for row `half` (lane row g, or g + 8) of a warp's 16 rows of the
// accumulator s, keys n0 on: scores scaled to base 2 (entries no row may see, where
// needs_mask, to -inf), exponentiated in place against the new running max, the running
// max and sum updated. Returns the factor the row's O accumulators take.
template <int N_BLOCKS, bool CAUSAL>
__device__ __forceinline__ float online_softmax_row(float (&s)[N_BLOCKS][4], int half, int row, int n0, int t,
                                                    bool needs_mask, int seqlen_k, int causal_offset, float scale_log2,
                                                    float& m_run, float& l_run) {
    float row_max = CUPYATTN_NEG_INF;
    // Two loops, not one with needs_mask in every select: most tiles need no mask, and a
    // loop that may mask costs them two instructions an entry.
    if (needs_mask) {
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[j][half * 2 + e];
                const int col = n0 + j * 8 + 2 * t + e;
                // (& and |, not && and ||: a select, not a branch an entry)
                const bool visible = (col < seqlen_k) & (!CAUSAL | (col <= row + causal_offset));
                x = visible ? x * scale_log2 : CUPYATTN_NEG_INF;
                row_max = fmaxf(row_max, x);
            }
    } else {
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float& x = s[j][half * 2 + e];
                x *= scale_log2;
                row_max = fmaxf(row_max, x);
            }
    }
    row_max = group_max<4>(row_max);
    const float m_new = fmaxf(m_run, row_max);
    const float base = m_new == CUPYATTN_NEG_INF ? 0.0f : m_new;
    const float alpha = exp2_ftz(m_run - base);
    float row_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            float& x = s[j][half * 2 + e];
            x = exp2_ftz(x - base);
            row_sum += x;
        }
    l_run = l_run * alpha + group_sum<4>(row_sum);
    m_run = m_new;
    return alpha;
}

// A row's running max moves only when a tile's max passes it by more than this (base 2):
// until then its probabilities reach at most 2^8 (exact all the same: O and the row sum are
// both relative to the same max), and O's accumulators skip the rescale.
constexpr float RESCALE_THRESHOLD = 8.0f;

// online_softmax_row's step for lane (g, t)'s two rows (row0 = the warp's row g, row0 + 8)
// at once, for a scale_log2 >= 0 (the caller flips Q's sign for a negative scale): row
// maxima of the raw scores, each entry 2^(x * scale_log2 - m) by one FMA and ex2, m the
// running max of the scaled scores, which moves only past RESCALE_THRESHOLD. Maxima and
// sums in two chains a row (even and odd column blocks), for latency. Returns, the same
// in the whole warp, whether O's accumulators take the factors alpha (else alpha is 1).
template <int N_BLOCKS, bool CAUSAL>
__device__ __forceinline__ bool online_softmax(float (&s)[N_BLOCKS][4], int row0, int n0, int t, bool needs_mask,
                                               int seqlen_k, int causal_offset, float scale_log2, float (&m_run)[2],
                                               float (&l_run)[2], float (&alpha)[2]) {
    float mx[2][2] = {{CUPYATTN_NEG_INF, CUPYATTN_NEG_INF}, {CUPYATTN_NEG_INF, CUPYATTN_NEG_INF}};
    // Two loops, not one with needs_mask in every select: most tiles need no mask. Masked,
    // entries no row may see become -inf before the maxima and 0 after the exp, each by one
    // compare of a constant column offset against the row's last visible column (from this
    // lane's first).
    auto last_seen = [&](int half) {
        return (CAUSAL ? min(seqlen_k - 1, row0 + half * 8 + causal_offset) : seqlen_k - 1) - n0 - 2 * t;
    };
    const int last[2] = {last_seen(0), last_seen(1)};
    if (needs_mask) {
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[j][i] = j * 8 + i % 2 <= last[i / 2] ? s[j][i] : CUPYATTN_NEG_INF;
                mx[i / 2][j % 2] = fmaxf(mx[i / 2][j % 2], s[j][i]);
            }
    } else {
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) mx[i / 2][j % 2] = fmaxf(mx[i / 2][j % 2], s[j][i]);
    }
    float m_tile[2];  // the largest scaled score each row sees in this tile
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const float r = fmaxf(mx[half][0], mx[half][1]);
        m_tile[half] = group_max<4>(r == CUPYATTN_NEG_INF ? r : r * scale_log2);  // (0 * -inf is NaN)
    }
    const bool rescale =
        __any_sync(FULL_MASK, (m_tile[0] > m_run[0] + RESCALE_THRESHOLD) | (m_tile[1] > m_run[1] + RESCALE_THRESHOLD));
    float neg_base[2];
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        alpha[half] = 1.0f;
        if (rescale) {
            const float m_new = fmaxf(m_run[half], m_tile[half]);
            alpha[half] = exp2_ftz(m_run[half] - (m_new == CUPYATTN_NEG_INF ? 0.0f : m_new));
            m_run[half] = m_new;
        }
        neg_base[half] = m_run[half] == CUPYATTN_NEG_INF ? 0.0f : -m_run[half];
    }
    float sum[2][2] = {{0.0f, 0.0f}, {0.0f, 0.0f}};
    if (needs_mask) {  // (a select: at a zero scale -inf * 0 is NaN)
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const float p = exp2_ftz(fmaf(s[j][i], scale_log2, neg_base[i / 2]));
                s[j][i] = j * 8 + i % 2 <= last[i / 2] ? p : 0.0f;
                sum[i / 2][j % 2] += s[j][i];
            }
    } else {
#pragma unroll
        for (int j = 0; j < N_BLOCKS; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                s[j][i] = exp2_ftz(fmaf(s[j][i], scale_log2, neg_base[i / 2]));
                sum[i / 2][j % 2] += s[j][i];
            }
    }
#pragma unroll
    for (int half = 0; half < 2; ++half)
        l_run[half] = l_run[half] * alpha[half] + group_sum<4>(sum[half][0] + sum[half][1]);
    return rescale;
}

}  // namespace cupyattn
