// TF32 operand tiles for wgmma (wgmma.cuh's core-matrix layout), built the same way by
// the wgmma kernels (the tiles a block keeps) and the staging launches (the tiles they
// stream, wgmma_staging.cuh), and the two product shapes of the backward. PASSES = 3:
// 3xTF32, every operand as big and small TF32 parts, stored PART words apart; PASSES =
// 1: one TF32 part.
//
//   load_then_store    a block's chunks of global rows, loaded several at a time
//   split_rows_global  float32 rows of global memory -> an R-row tile (the operand of
//                      A B^T)
//   (transposed tiles, R rows becoming the k dimension in the order a register A operand
//    takes them, come from the staging launches: wgmma_staging.cuh, stage_operand)
//   zero_transposed_rows  rows from some index on of a transposed tile, zeroed
//   transpose_core_tile   a tile's transpose, words moved within shared memory
//   a_words_global     float32 rows of global memory -> each lane's register A words of
//                      every k-step, float32 rounding-biased (mma.cuh, rounding_biased;
//                      split into TF32 parts as they are used, set_from_biased)
//   kept_tile_global   either of those two for a tile a block keeps (words or parts)
//   rows_by_rows       d = A B^T, A 64 rows and B N rows of such tiles, in shared memory
//   words_by_rows      the same (3xTF32), A from a_words_global's words through registers
//                      (B's parts as rows, PARTS_AS_ROWS: 16-wide products as n32 wgmmas)
//   one_of_two_products, swap_pair_products
//                      a d_split pair's share of two such products, and their swap
//   regs_by_transposed acc += A B, A in registers (from accumulators), B a transposed tile
//
// Register A operands come from m64nN accumulators: lane (g, t) holds columns 2t and
// 2t + 1 of every 8, where the A operand wants k t and t + 4, so within each 8 the k
// order is permuted: slot t holds column 2t, slot t + 4 column 2t + 1 (mma.cuh,
// MmaTf32). Transposed tiles hold their rows in that slot order.
#pragma once

#include "mma.cuh"
#include "wgmma.cuh"

namespace cupyattn {

// 4 consecutive float32 values as TF32 parts: 16 bytes at word `at` of big (and small).
template <int PASSES>
__device__ __forceinline__ void store_parts(float* big, float* small, int at, float4 x) {
    Tf32Words<PASSES, 4> w;
    w.set(0, x.x);
    w.set(1, x.y);
    w.set(2, x.z);
    w.set(3, x.w);
    *reinterpret_cast<uint4*>(big + at) = make_uint4(w.big[0], w.big[1], w.big[2], w.big[3]);
    if constexpr (PASSES == 3)
        *reinterpret_cast<uint4*>(small + at) = make_uint4(w.small[0], w.small[1], w.small[2], w.small[3]);
}

// Chunks i = threadIdx.x, + THREADS, ... < TOTAL: x = load(i), then store(i, x), with
// BATCH loads issued before the first store. The tiles a block keeps are read from
// global memory before its main loop, one block an SM, where nothing hides a load's
// latency: one load in flight at a time (a loop that stores each chunk before loading
// the next) cost a round trip per chunk, 16-32 of them a block.
template <int TOTAL, int THREADS, int BATCH = 8, typename Load, typename Store>
__device__ __forceinline__ void load_then_store(Load load, Store store) {
#pragma unroll 1
    for (int first = threadIdx.x; first < TOTAL; first += BATCH * THREADS) {
        float4 x[BATCH];
#pragma unroll
        for (int j = 0; j < BATCH; ++j) x[j] = load(min(first + j * THREADS, TOTAL - 1));  // (no branch: as load_chunk)
#pragma unroll
        for (int j = 0; j < BATCH; ++j)
            if (first + j * THREADS < TOTAL) store(first + j * THREADS, x[j]);
    }
}

// *p (global memory that stays as it is for the whole launch) where ok, else zeros: a
// predicated load, not a branch. Around a plain load the compiler branched and moved
// the loaded value out of the branch's registers right after it, which waited for the
// load: one load in flight at a time however many load_then_store issued.
__device__ __forceinline__ float4 load_float4_if(const float* p, bool ok) {
    float4 x;
    asm("{\n\t.reg .pred ok;\n\tsetp.ne.b32 ok, %5, 0;\n\tmov.f32 %0, 0f00000000;\n\tmov.f32 %1, 0f00000000;\n\t"
        "mov.f32 %2, 0f00000000;\n\tmov.f32 %3, 0f00000000;\n\t@ok ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];\n}\n"
        : "=f"(x.x), "=f"(x.y), "=f"(x.z), "=f"(x.w)
        : "l"(p), "r"(int(ok)));
    return x;
}

// Row r, columns c..c+3 of global rows (row stride `stride` floats, 16-byte aligned),
// zeros from row valid_rows and column valid_cols on.
__device__ __forceinline__ float4 load_chunk(const float* src, long long stride, int r, int c, int valid_rows,
                                             int valid_cols) {
    return load_float4_if(src + r * stride + c, r < valid_rows && c < valid_cols);
}

// The R x D_PAD tile (parts PART words apart) from global rows (row stride `stride`
// floats, 16-byte aligned), zeros from row valid_rows and column valid_cols on.
// Chunk i (4 columns of one row) lands at word 4i, rows fastest within 8-row groups.
template <int PASSES, int R, int D_PAD, int THREADS>
__device__ __forceinline__ void split_rows_global(float* tile, int part, const float* src, long long stride,
                                                  int valid_rows, int valid_cols) {
    auto row = [](int i) { return (i / 8) % (R / 8) * 8 + i % 8; };
    load_then_store<R * D_PAD / 4, THREADS>(
        [&](int i) { return load_chunk(src, stride, row(i), i / R * 4, valid_rows, valid_cols); },
        [&](int i, float4 x) { store_parts<PASSES>(tile, tile + part, 4 * i, x); });
}

// Zero rows [from, R) of the R rows that a transposed tile (PARTS parts, stage_operand's
// slot order) holds as slots: the wgmma kernels' last key tile past every key a block sees.
template <int PARTS, int R, int D_PAD, int THREADS>
__device__ __forceinline__ void zero_transposed_rows(float* transposed, int from) {
#pragma unroll 1
    for (int i = threadIdx.x; i < PARTS * R * D_PAD; i += THREADS) {
        const int w = i % (R * D_PAD);  // core matrix (slot / 4, d / 8), then d % 8, slot % 4
        const int slot = w / 32 / (D_PAD / 8) * 4 + w % 4;
        const int s8 = slot % 8, row = slot - s8 + (s8 < 4 ? 2 * s8 : 2 * (s8 - 4) + 1);
        if (row >= from) transposed[i] = 0.0f;
    }
}

// The C x R transpose of an R x C core-matrix tile (PARTS parts, each R * C words):
// element (r, c) of src lands at (c, r) of dst, rows in natural order. A permutation of
// words, so TF32 parts stay exact.
template <int PARTS, int R, int C, int THREADS>
__device__ __forceinline__ void transpose_core_tile(float* dst, const float* src) {
#pragma unroll 1
    for (int i = threadIdx.x; i < PARTS * R * C; i += THREADS) {
        const int w = i % (R * C), core = w / 32;
        const int r = core % (R / 8) * 8 + w % 32 / 4, c = core / (R / 8) * 4 + w % 4;
        dst[i - w + core_offset<C>(c, r)] = src[i];
    }
}

// R global rows (row stride `stride`, 16-byte aligned; zeros from row valid_rows and
// column valid_cols on) as float32 in each lane's register A operand order: for each
// 16-row warp slice and k-step, a 16-byte word a lane, [warp][k-step][lane][4], with
// (row g, column t) at 0, (g + 8, t) at 1, (g, t + 4) at 2, (g + 8, t + 4) at 3 (wgmma.cuh's
// A layout). Reads are coalesced (a row's chunks in turn). Half the bytes of two TF32
// parts: 3xTF32 splits each word where it is used (words_by_rows), which takes two
// instructions a word because each is stored rounding-biased (mma.cuh, rounding_biased).
template <int K_STEPS>
__device__ __forceinline__ int a_word_at(int r, int c) {  // row r, columns c..c+3 (c % 4 == 0): first word
    return ((r / 16) * K_STEPS + c / 8) * 128 + (r % 8) * 16 + (r % 16) / 8 + (c % 8) / 4 * 2;
}

template <int R, int D_PAD, int THREADS>
__device__ __forceinline__ void a_words_global(float* tile, const float* src, long long stride, int valid_rows,
                                               int valid_cols) {
    constexpr int K_STEPS = D_PAD / 8, CHUNKS = D_PAD / 4;  // chunks a row
    load_then_store<R * CHUNKS, THREADS>(
        [&](int i) { return load_chunk(src, stride, i / CHUNKS, i % CHUNKS * 4, valid_rows, valid_cols); },
        [&](int i, float4 x) {
            const int at = a_word_at<K_STEPS>(i / CHUNKS, i % CHUNKS * 4);
            tile[at] = rounding_biased(x.x);  // lane g * 4 + t holds column t: 4 consecutive columns, 4 lanes
            tile[at + 4] = rounding_biased(x.y);
            tile[at + 8] = rounding_biased(x.z);
            tile[at + 12] = rounding_biased(x.w);
        });
}

// R global rows as the tile a block keeps for its whole life: float32 words in register
// A order (WORDS: a_words_global, split where they are used) or TF32 parts in
// core-matrix order, R * D_PAD words apart (split_rows_global).
template <bool WORDS, int PASSES, int R, int D_PAD, int THREADS>
__device__ __forceinline__ void kept_tile_global(float* tile, const float* src, long long stride, int valid_rows,
                                                 int valid_cols) {
    if constexpr (WORDS)
        a_words_global<R, D_PAD, THREADS>(tile, src, stride, valid_rows, valid_cols);
    else
        split_rows_global<PASSES, R, D_PAD, THREADS>(tile, R * D_PAD, src, stride, valid_rows, valid_cols);
}

template <int NB>
__device__ __forceinline__ void zero_acc(float (&d)[NB][4]) {
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[j][e] = 0.0f;
}

template <int NB>
__device__ __forceinline__ void add_acc(float (&d)[NB][4], const float (&x)[NB][4]) {  // d += x
#pragma unroll
    for (int j = 0; j < NB; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) d[j][e] += x[j][e];
}

// d[p] = A_p B_p^T for NP products of the same shape, over K_STEPS k-steps of 8: A_p the
// 64 rows at a_addr[p] of an A_ROWS-row tile, B_p an N-row tile at b_addr[p]; small parts
// A_PART / B_PART bytes after the big ones. All products go out before the first wait,
// so the tensor cores have NP chains to overlap.
// ISSUE_ONLY (one TF32 pass only): the products are issued, not committed or waited
// for, so that a caller issues more before one wait (and pins d itself, fence_operand).
// The tensor cores truncate their float32 sums, so long chains of them bias results
// toward zero (mma.cuh): 3xTF32 sums each k-step in a fresh accumulator and adds it to
// d with a rounded add, in k order. DEPTH accumulators rotate, so that DEPTH - 1 k-steps
// run while one is added (2 by default; more keep more short wgmmas in flight where a
// product is narrow, the same adds in the same order: the same bits). One TF32 pass
// accumulates straight into d.
template <int PASSES, int NP, int N, int K_STEPS, int A_ROWS, int B_ROWS, bool ISSUE_ONLY = false, int DEPTH = 2>
__device__ __forceinline__ void rows_by_rows(float (&d)[NP][N / 8][4], const unsigned (&a_addr)[NP], unsigned a_part,
                                             const unsigned (&b_addr)[NP], unsigned b_part) {
    using Wg = WgmmaTf32<N>;
    constexpr unsigned A_STEP = 2 * (A_ROWS / 8) * 128, B_STEP = 2 * (B_ROWS / 8) * 128;  // bytes per k-step
    static_assert(!ISSUE_ONLY || PASSES == 1, "3xTF32 waits between its k-steps");
    static_assert(DEPTH >= 2 && DEPTH <= 4, "k-steps in flight");
    if constexpr (PASSES == 3) {
#pragma unroll
        for (int p = 0; p < NP; ++p) zero_acc(d[p]);
        float step[DEPTH][NP][N / 8][4];
        auto add_step = [&](int done) {  // k-step `done`'s products, landed, into d
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                fence_operand(step[done % DEPTH][p]);
                add_acc(d[p], step[done % DEPTH][p]);
            }
        };
#pragma unroll
        for (int ks = 0; ks < K_STEPS; ++ks) {
            wgmma_fence();
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                const auto a_big = wgmma_desc<A_ROWS>(a_addr[p], ks * A_STEP);
                const auto a_small = wgmma_desc<A_ROWS>(a_addr[p], ks * A_STEP + a_part);
                const auto b_big = wgmma_desc<B_ROWS>(b_addr[p], ks * B_STEP);
                const auto b_small = wgmma_desc<B_ROWS>(b_addr[p], ks * B_STEP + b_part);
                Wg::template ss<false>(step[ks % DEPTH][p], a_small, b_big);
                Wg::template ss<true>(step[ks % DEPTH][p], a_big, b_small);
                Wg::template ss<true>(step[ks % DEPTH][p], a_big, b_big);
            }
            wgmma_commit();
            if (ks >= DEPTH - 1) {
                wgmma_wait<DEPTH - 1>();
                add_step(ks - (DEPTH - 1));
            }
        }
        wgmma_wait<0>();
#pragma unroll
        for (int done = K_STEPS > DEPTH - 1 ? K_STEPS - (DEPTH - 1) : 0; done < K_STEPS; ++done) add_step(done);
    } else {
        wgmma_fence();
#pragma unroll
        for (int p = 0; p < NP; ++p)
#pragma unroll
            for (int ks = 0; ks < K_STEPS; ++ks) {
                const auto a = wgmma_desc<A_ROWS>(a_addr[p], ks * A_STEP);
                const auto b = wgmma_desc<B_ROWS>(b_addr[p], ks * B_STEP);
                if (ks == 0)
                    Wg::template ss<false>(d[p], a, b);
                else
                    Wg::template ss<true>(d[p], a, b);
            }
        if constexpr (!ISSUE_ONLY) {
            wgmma_commit();
            wgmma_wait<0>();
#pragma unroll
            for (int p = 0; p < NP; ++p) fence_operand(d[p]);
        }
    }
}

// The register A operand of the k-step at accumulator block kb (slot order above).
// rows_by_rows in 3xTF32 with each A_p from this warp's words of a_words_global's
// tile (a_words[p]: this lane's word of k-step 0; k-step ks at a_words[p][ks * 32]),
// split into TF32 parts per k-step in registers (set_from_biased: store_parts' parts,
// but where x's rounding carries into the next power of two, small within one
// float32 unit of x), so the products, their order and the adds are rows_by_rows's.
// DEPTH sets of split words rotate, as the accumulators, and each k-step's words are
// read from shared memory one group ahead, before the wait for the last products: the
// wait's memory clobber keeps a load after it, where the split would stall on its
// latency.
// GROUP k-steps go out as one commit group, their products interleaved (each pass of
// every k-step, then the next pass), so that no two wgmmas in a row add into the same
// accumulator; DEPTH / GROUP groups are in flight. Each accumulator takes the same
// products in the same order and is added in k order: the same bits for any GROUP (4
// deep, two at a time: the "fp32" D=256 score products, n16).
//
// PARTS_AS_ROWS: each B tile holds its parts as rows, B_ROWS big then B_ROWS small
// (stage_operand's PARTS_AS_ROWS: one 2 B_ROWS-row core-matrix tile). Where 16 columns
// wide, two k-steps a group, 4 deep (WIDE: the "fp32" backward's score products, e.g.
// at D=256), a k-step's big·big and big·small products are one n32 wgmma (A big, B big
// | small) into its group's fresh accumulator, and its small·big one n16 wgmma: four
// wgmmas a group where six n16 ran (n32 runs at the full rate, n16 does not). A group's left (big·big) and right
// (big·small) 16 columns are added to d with rounded adds, as many a group as before; its big·big chain of two products
// truncates as often as one k-step's chain of three did, so the sums are as accurate (scripts/tf32_error_model.py
// --wide). The small·big products (2^-11 of the big ones) chain in one n16 accumulator over all k-steps, added to d
// last. Not the same bits as without it. Elsewhere the same algorithm, its descriptors stepping over the parts.
template <int NP, int N, int K_STEPS, int B_ROWS, bool PARTS_AS_ROWS = false, int DEPTH = 2,
          int GROUP = (DEPTH == 4 ? 2 : 1)>
__device__ __forceinline__ void words_by_rows(float (&d)[NP][N / 8][4], const float4* const (&a_words)[NP],
                                              const unsigned (&b_addr)[NP], unsigned b_part) {
    using Wg = WgmmaTf32<N>;
    constexpr int B_TILE_ROWS = PARTS_AS_ROWS ? 2 * B_ROWS : B_ROWS;  // rows of a B tile's core matrices
    constexpr unsigned B_STEP = 2 * (B_TILE_ROWS / 8) * 128;  // bytes per k-step
    // Where B's small part starts: B_ROWS rows on, or b_part bytes on.
    const unsigned b_small_at = PARTS_AS_ROWS ? (B_ROWS / 8) * 128 : b_part;
    constexpr int IN_FLIGHT = DEPTH / GROUP;  // commit groups
    constexpr bool WIDE = PARTS_AS_ROWS && N == 16 && GROUP == 2;
    static_assert(DEPTH >= 2 && DEPTH <= 4 && DEPTH % GROUP == 0 && K_STEPS % GROUP == 0 && IN_FLIGHT >= 2,
                  "k-steps in flight");
#pragma unroll
    for (int p = 0; p < NP; ++p) zero_acc(d[p]);
    float step[WIDE ? 1 : DEPTH][NP][N / 8][4];
    float wide[WIDE ? IN_FLIGHT : 1][NP][4][4];  // WIDE: a group's big·big | big·small
    float small_big[NP][2][4];  // WIDE: every k-step's small·big
#pragma unroll
    for (int p = 0; p < NP; ++p) zero_acc(small_big[p]);
    Tf32Words<3, 4> a[DEPTH][NP];  // a k-step's A words stay until its products land
    float4 words[GROUP][NP];  // the next group's
    const unsigned top19 = biased_split_mask();
    // WIDE: B's address anew at each call (an asm ptxas cannot hoist), so that its
    // descriptors, loop-invariant where one stage is reused (dQ's), are not hoisted out
    // of the caller's loop into registers and spilled (192 bytes, dQ at D=256).
    unsigned b_base[NP];
#pragma unroll
    for (int p = 0; p < NP; ++p) {
        b_base[p] = b_addr[p];
        if constexpr (WIDE) asm volatile("mov.b32 %0, %0;\n" : "+r"(b_base[p]));
    }
    auto add_step = [&](int done) {  // k-step `done`'s products, landed, into d
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            fence_operand(a[done % DEPTH][p].big);  // its A words, read by now
            fence_operand(a[done % DEPTH][p].small);
            if constexpr (WIDE) {
                if (done % 2 == 0) continue;  // a group's sums are added once, after its last k-step
                float (&sums)[4][4] = wide[done / 2 % IN_FLIGHT][p];
                fence_operand(sums);
#pragma unroll
                for (int j = 0; j < 2; ++j)
#pragma unroll
                    for (int e = 0; e < 4; ++e) d[p][j][e] += sums[j][e] + sums[j + 2][e];
            } else {
                fence_operand(step[done % DEPTH][p]);
                add_acc(d[p], step[done % DEPTH][p]);
            }
        }
    };
#pragma unroll
    for (int g = 0; g < GROUP; ++g)
#pragma unroll
        for (int p = 0; p < NP; ++p) words[g][p] = a_words[p][g * 32];
#pragma unroll
    for (int ks0 = 0; ks0 < K_STEPS; ks0 += GROUP) {
#pragma unroll
        for (int g = 0; g < GROUP; ++g)
#pragma unroll
            for (int p = 0; p < NP; ++p) {
                Tf32Words<3, 4>& w = a[(ks0 + g) % DEPTH][p];
                w.set_from_biased(0, words[g][p].x, top19);
                w.set_from_biased(1, words[g][p].y, top19);
                w.set_from_biased(2, words[g][p].z, top19);
                w.set_from_biased(3, words[g][p].w, top19);
                if (ks0 + GROUP + g < K_STEPS) words[g][p] = a_words[p][(ks0 + GROUP + g) * 32];
            }
        wgmma_fence();
        if constexpr (WIDE) {
            // Per product: n32 big x (big | small) of each k-step into the group's fresh
            // accumulator, each followed by its n16 small x big, so that no wgmma adds into
            // the accumulator of the one just issued.
#pragma unroll
            for (int p = 0; p < NP; ++p)
#pragma unroll
                for (int g = 0; g < GROUP; ++g) {
                    const int ks = ks0 + g;
                    const Tf32Words<3, 4>& w = a[ks % DEPTH][p];
                    const auto b_both = wgmma_desc<B_TILE_ROWS>(b_base[p], ks * B_STEP);  // big rows first
                    float (&sums)[4][4] = wide[ks0 / GROUP % IN_FLIGHT][p];
                    if (g == 0)
                        WgmmaTf32<32>::template rs<false>(sums, w.big, b_both);
                    else
                        WgmmaTf32<32>::template rs<true>(sums, w.big, b_both);
                    WgmmaTf32<16>::template rs<true>(small_big[p], w.small, b_both);
                }
        } else {
#pragma unroll
            for (int p = 0; p < NP; ++p)
#pragma unroll
                for (int pass = 0; pass < 3; ++pass)
#pragma unroll
                    for (int g = 0; g < GROUP; ++g) {
                        const int ks = ks0 + g;
                        const Tf32Words<3, 4>& w = a[ks % DEPTH][p];
                        const auto b_big = wgmma_desc<B_TILE_ROWS>(b_addr[p], ks * B_STEP);
                        const auto b_small = wgmma_desc<B_TILE_ROWS>(b_addr[p], ks * B_STEP + b_small_at);
                        if (pass == 0)
                            Wg::template rs<false>(step[ks % DEPTH][p], w.small, b_big);
                        else if (pass == 1)
                            Wg::template rs<true>(step[ks % DEPTH][p], w.big, b_small);
                        else
                            Wg::template rs<true>(step[ks % DEPTH][p], w.big, b_big);
                    }
        }
        wgmma_commit();
        if (ks0 / GROUP >= IN_FLIGHT - 1) {
            wgmma_wait<IN_FLIGHT - 1>();
#pragma unroll
            for (int g = 0; g < GROUP; ++g) add_step(ks0 - (IN_FLIGHT - 1) * GROUP + g);
        }
    }
    wgmma_wait<0>();
#pragma unroll
    for (int done = K_STEPS > DEPTH - GROUP ? K_STEPS - (DEPTH - GROUP) : 0; done < K_STEPS; ++done) add_step(done);
    if constexpr (WIDE) {
#pragma unroll
        for (int p = 0; p < NP; ++p) {
            fence_operand(small_big[p]);
            add_acc(d[p], small_big[p]);
        }
    }
}

// x as an array of one (a product of NP = 1 out of an array of NP = 2).
template <typename T>
__device__ __forceinline__ T (&just_one(T& x))[1] {
    return reinterpret_cast<T(&)[1]>(x);
}

// d = product `which` of two of the same shape, as words_by_rows (WORDS: A from kept
// float32 words) or rows_by_rows (A from TF32 parts at a_addr) compute it among NP = 2:
// a d_split pair's share, each warpgroup one product, in the same order.
template <int PASSES, bool WORDS, int N, int K_STEPS, int A_ROWS, int B_ROWS, int DEPTH = 2, bool PARTS_AS_ROWS = false>
__device__ __forceinline__ void one_of_two_products(float (&d)[N / 8][4], int which, const float4* const (&a_words)[2],
                                                    const unsigned (&a_addr)[2], unsigned a_part,
                                                    const unsigned (&b_addr)[2], unsigned b_part) {
    static_assert(WORDS || !PARTS_AS_ROWS, "B's parts as rows: A from words (words_by_rows)");
    if constexpr (WORDS)
        words_by_rows<1, N, K_STEPS, B_ROWS, PARTS_AS_ROWS, DEPTH>(just_one(d), {which == 0 ? a_words[0] : a_words[1]},
                                                                   {which == 0 ? b_addr[0] : b_addr[1]}, b_part);
    else
        rows_by_rows<PASSES, 1, N, K_STEPS, A_ROWS, B_ROWS, false, DEPTH>(
            just_one(d), {which == 0 ? a_addr[0] : a_addr[1]}, a_part, {which == 0 ? b_addr[0] : b_addr[1]}, b_part);
}

// A pair of warpgroups that split two products of the same shape (d_split tiles: one
// computes S or S^T, the other dP or dP^T) swap them through shared memory: each writes
// its product (`own`, product `mine`) over swap[mine], a tile only it has read, and after
// a block barrier both read both into `both`. Lane-contiguous float4s, a warp's 16 rows
// at a time (warp_in_wg), so no bank conflicts. The caller's next block barrier orders
// these reads before copies that refill the tiles (the fence here: generic-proxy reads
// before the async proxy's writes).
// BARRIER_THREADS: 0, the whole block meets (__syncthreads); else that many leading
// threads, on named barrier 6 (a block with a producer warpgroup past them).
template <int NB, int BARRIER_THREADS = 0>
__device__ __forceinline__ void swap_pair_products(float (&both)[2][NB][4], const float (&own)[NB][4],
                                                   float4* const (&swap)[2], int mine, int warp_in_wg, int lane) {
    const int at = warp_in_wg * NB * 32 + lane;
    float4* own_swap = (mine == 0 ? swap[0] : swap[1]) + at;
#pragma unroll
    for (int j = 0; j < NB; ++j) own_swap[j * 32] = make_float4(own[j][0], own[j][1], own[j][2], own[j][3]);
    if constexpr (BARRIER_THREADS == 0)
        __syncthreads();  // both products written
    else
        leading_threads_barrier(6, BARRIER_THREADS);
#pragma unroll
    for (int p = 0; p < 2; ++p)
#pragma unroll
        for (int j = 0; j < NB; ++j) {
            const float4 x = swap[p][at + j * 32];
            both[p][j][0] = x.x, both[p][j][1] = x.y, both[p][j][2] = x.z, both[p][j][3] = x.w;
        }
    fence_proxy_async();
}

template <int PASSES, int NB>
__device__ __forceinline__ void a_words(Tf32Words<PASSES, 4> (&a)[NB], const float (&x)[NB][4]) {
#pragma unroll
    for (int kb = 0; kb < NB; ++kb) {
        a[kb].set(0, x[kb][0]);
        a[kb].set(1, x[kb][2]);
        a[kb].set(2, x[kb][1]);
        a[kb].set(3, x[kb][3]);
    }
}

// After the wait for one TF32 pass of regs_by_transposed's products: its register
// operands and accumulators pinned, so that no use moves above the wait.
template <int PASSES, int NP, int CHUNKS, int J, int K_BLOCKS>
__device__ __forceinline__ void fence_transposed_operands(float (&acc)[NP][CHUNKS][J][4],
                                                          Tf32Words<PASSES, 4> (&a)[NP][K_BLOCKS]) {
#pragma unroll
    for (int p = 0; p < NP; ++p) {
#pragma unroll
        for (int kb = 0; kb < K_BLOCKS; ++kb) fence_operand(a[p][kb].big);
#pragma unroll
        for (int c = 0; c < CHUNKS; ++c) fence_operand(acc[p][c]);
    }
}

// acc[p][c] (CHUNKS chunks of CN columns) += A_p B_p for NP products: A_p from
// registers (K_BLOCKS k-steps of 8, a_words), B_p the transposed tile at bt_addr[p]
// (D_PAD rows = the output columns, small part B_PART bytes on). 3xTF32 sums at most KG
// k-steps (3 KG products) per fresh accumulator before its rounded add to acc
// (scripts/tf32_error_model.py, wgmma column), one commit group per (chunk, KG k-steps,
// product) in that order; with BUFS = 2 fresh accumulators alternate, so that each
// group's add runs while the next group is on the tensor cores (two products: the same
// registers as one accumulator each; one product: CN / 2 more a lane). Every acc[p][c]
// takes its sums in k-step order either way, so the results are the same bit for bit.
// One TF32 pass adds straight into acc, all products issued together (ISSUE_ONLY as
// for rows_by_rows; the caller then pins with fence_transposed_operands).
template <int PASSES, int NP, int CN, int CHUNKS, int K_BLOCKS, int KG, int D_PAD, bool ISSUE_ONLY = false,
          int BUFS = NP>
__device__ __forceinline__ void regs_by_transposed(float (&acc)[NP][CHUNKS][CN / 8][4],
                                                   Tf32Words<PASSES, 4> (&a)[NP][K_BLOCKS],
                                                   const unsigned (&bt_addr)[NP], unsigned b_part) {
    using Wg = WgmmaTf32<CN>;
    static_assert(K_BLOCKS % KG == 0, "whole groups of k-steps");
    static_assert(!ISSUE_ONLY || PASSES == 1, "3xTF32 waits between its groups of k-steps");
    static_assert(BUFS == 1 || BUFS == 2, "one fresh accumulator, or two alternating");
    // Core matrix (slot kb * 8 / 4, row c * CN / 8) of a transposed tile: bytes on from its start.
    auto b_at = [](int kb, int c) { return unsigned((kb * 2) * (D_PAD / 8) + c * CN / 8) * 128; };
    if constexpr (PASSES == 3) {
        constexpr int K_GROUPS = K_BLOCKS / KG, GROUPS = CHUNKS * K_GROUPS * NP;
        float part[BUFS][CN / 8][4];
        // Group i's add, once it is done (BUFS - 1 later groups may still run).
        auto add_group = [&](int i) {
            const int p = i % NP, k0 = i / NP % K_GROUPS * KG, c = i / NP / K_GROUPS;
#pragma unroll
            for (int kb = k0; kb < k0 + KG; ++kb) {
                fence_operand(a[p][kb].big);
                fence_operand(a[p][kb].small);
            }
            fence_operand(part[i % BUFS]);
#pragma unroll
            for (int j = 0; j < CN / 8; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[p][c][j][e] += part[i % BUFS][j][e];
        };
#pragma unroll
        for (int i = 0; i < GROUPS; ++i) {
            const int p = i % NP, k0 = i / NP % K_GROUPS * KG, c = i / NP / K_GROUPS;
            wgmma_fence();
#pragma unroll
            for (int kb = k0; kb < k0 + KG; ++kb) {
                const auto b_big = wgmma_desc<D_PAD>(bt_addr[p], b_at(kb, c));
                const auto b_small = wgmma_desc<D_PAD>(bt_addr[p], b_at(kb, c) + b_part);
                if (kb == k0)
                    Wg::template rs<false>(part[i % BUFS], a[p][kb].small, b_big);
                else
                    Wg::template rs<true>(part[i % BUFS], a[p][kb].small, b_big);
                Wg::template rs<true>(part[i % BUFS], a[p][kb].big, b_small);
                Wg::template rs<true>(part[i % BUFS], a[p][kb].big, b_big);
            }
            wgmma_commit();
            if constexpr (BUFS == 1) {
                wgmma_wait<0>();
                add_group(i);
            } else if (i > 0) {
                wgmma_wait<1>();
                add_group(i - 1);
            }
        }
        if constexpr (BUFS == 2) {
            wgmma_wait<0>();
            add_group(GROUPS - 1);
        }
    } else {
        wgmma_fence();
#pragma unroll
        for (int p = 0; p < NP; ++p)
#pragma unroll
            for (int c = 0; c < CHUNKS; ++c)
#pragma unroll
                for (int kb = 0; kb < K_BLOCKS; ++kb)
                    Wg::template rs<true>(acc[p][c], a[p][kb].big, wgmma_desc<D_PAD>(bt_addr[p], b_at(kb, c)));
        if constexpr (!ISSUE_ONLY) {
            wgmma_commit();
            wgmma_wait<0>();
            fence_transposed_operands(acc, a);
        }
    }
}

// Output columns per wgmma of a product into a D_PAD-column accumulator: the widest
// that divides the head dim; 3xTF32 sums into a fresh accumulator of at most 64.
template <int PASSES, int D_PAD>
__host__ __device__ constexpr int chunk_columns() {
    constexpr int MAX = PASSES == 3 ? 64 : 128;
    return D_PAD % MAX == 0 ? MAX : D_PAD % 64 == 0 ? 64 : D_PAD % 32 == 0 ? 32 : 16;
}

}  // namespace cupyattn
