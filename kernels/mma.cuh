// Tensor-core building blocks for sm_80 and newer: cp.async, ldmatrix and
// mma.sync (float32 accumulate): m16n8k16 for __half and __nv_bfloat16 operands,
// m16n8k8 for TF32 (one pass, or 3xTF32 for float32 accuracy); tile loaders
// that copy (cp.async) or convert float32 to a half type on the way in.
//
// Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k16"), with
// g = lane / 4 and t = lane % 4:
//   A 16x16 (row-major), 4 registers of 2 elements:
//     a0 (row g,   cols 2t, 2t+1)   a1 (row g+8, cols 2t, 2t+1)
//     a2 (row g,   cols 2t+8, +9)   a3 (row g+8, cols 2t+8, +9)
//   B 16x8 ("col"), 2 registers:  b0 (rows 2t, 2t+1, col g)  b1 (rows 2t+8, +9, col g)
//   C 16x8 float: c0, c1 (row g, cols 2t, 2t+1)  c2, c3 (row g+8, cols 2t, 2t+1)
// Two neighbouring C tiles (n-blocks 2s and 2s+1) hold exactly the A fragment
// of a 16x16 tile, so P goes from the S accumulators to the P V product
// without leaving registers.
#pragma once

#include "common.cuh"

namespace cupyattn {

__device__ __forceinline__ unsigned smem_addr(const void* p) {
    return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8x8 b16 matrices; lane l gives the row address of matrix l / 8, row l % 8,
// as a 32-bit shared-memory address (smem_addr): one register instead of a
// 64-bit generic pointer's two, which the 32-row tiles need. On 32-bit data each
// 8x8 b16 matrix is an 8x4 matrix of words, and lane l receives word (l / 4, l % 4).
__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

__device__ __forceinline__ void ldmatrix_x4_trans(unsigned (&r)[4], unsigned row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(row_addr));
}

__device__ __forceinline__ unsigned lds32(unsigned addr) {
    unsigned r;
    asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(r) : "r"(addr));
    return r;
}

// Operand policies: how tiles are held in shared memory (Smem) and multiplied.
// Every policy reduces 32 bytes of a shared-memory row per mma k-step (K_STEP
// elements), so the ldmatrix row addresses of the "rows by rows" products
// (A rows x B rows, S = Q K^T) are the same in bytes for all of them.
//
// A fragments of such products come from ldmatrix_x4 at lane address
//   row (l % 8) + 8 * ((l / 8) & 1), byte column 16 * (l / 16)       (a_lane_offset)
// and B fragments of two 8-column blocks j, j + 1 at
//   row (l % 8) + 8 * (l / 16),      byte column 16 * ((l / 8) & 1)  (b_lane_offset).
// "Accumulator by k-major" products (O += P V, dV += P^T dO, ...) take A from
// float accumulators and B (k rows x n columns, row-major) through
// load_b_kmajor at kmajor_lane_offset.
//
// MmaHalf<S>: S = __half or __nv_bfloat16, mma.m16n8k16; B k-major by ldmatrix.trans.
// MmaTf32<PASSES>: S = float, mma.m16n8k8.tf32. PASSES = 1 rounds each operand to
//   TF32 (10 mantissa bits). PASSES = 3 splits each operand x into big = tf32(x)
//   and small = x - big (Tf32Words) and adds small*big + big*small + big*big
//   (3xTF32): about 21 bits per operand, float32-level results. B k-major by plain 32-bit
//   loads: the accumulator tile of 8 keys holds keys 2t, 2t + 1 in lane t of a
//   quad, where the m16n8k8 A layout wants keys t, t + 4, so the k order inside
//   each 8-key step is permuted (k' = 2t + e) and B is read in the same order.
template <typename S>
struct MmaHalf;

template <typename S>
struct HalfOps;
template <>
struct HalfOps<__half> {
    __device__ static unsigned pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <>
struct HalfOps<__nv_bfloat16> {
    __device__ static unsigned pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<unsigned*>(&h);
    }
    __device__ static void mma(float (&c)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
        asm volatile(
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
            "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
            : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
            : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <typename S>
struct MmaHalf {
    using Smem = S;
    static constexpr int K_STEP = 16;
    struct A {
        unsigned r[4];
    };  // 16 x 16
    struct B {
        unsigned r[4];
    };  // 16 x 8 for two column blocks: r[0..1] block j, r[2..3] block j + 1

    __device__ static void load_a(A& a, unsigned addr) { ldmatrix_x4(a.r, addr); }
    __device__ static void load_b(B& b, unsigned addr) { ldmatrix_x4(b.r, addr); }
    // A of the k-step that starts at accumulator block kb: blocks kb and kb + 1 (16 keys).
    template <int N>
    __device__ static void a_from_acc(A& a, const float (&x)[N][4], int kb) {
        a.r[0] = HalfOps<S>::pack(x[kb][0], x[kb][1]);
        a.r[1] = HalfOps<S>::pack(x[kb][2], x[kb][3]);
        a.r[2] = HalfOps<S>::pack(x[kb + 1][0], x[kb + 1][1]);
        a.r[3] = HalfOps<S>::pack(x[kb + 1][2], x[kb + 1][3]);
    }
    __device__ static int kmajor_lane_offset(int lane, int stride) {  // elements
        const int mi = lane / 8, rr = lane % 8;
        return ((mi & 1) * 8 + rr) * stride + (mi >> 1) * 8;
    }
    __device__ static void load_b_kmajor(B& b, unsigned addr, int /*row_bytes*/) { ldmatrix_x4_trans(b.r, addr); }
    // c += a b for column block `half` (0: j, 1: j + 1) of b.
    __device__ static void mma(float (&c)[4], const A& a, const B& b, int half) {
        HalfOps<S>::mma(c, a.r, b.r[2 * half], b.r[2 * half + 1]);
    }
};

__device__ __forceinline__ unsigned to_tf32(float x) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

__device__ __forceinline__ void mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3, unsigned b0,
                                         unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// N float32 words as TF32: big parts, and with PASSES = 3 the small remainders too.
//
// One pass rounds with cvt.rna.tf32.f32, which ptxas expands to about four
// instructions (a NaN test and a select among them). 3xTF32 splits with three:
// big = x rounded to nearest (ties away) by an integer add of half the dropped
// bits' range and a mask; small = x - big, exact, passed as it is: the tensor
// cores use at least the top 19 bits of a TF32 operand (how many more is the
// hardware's choice), so small may lose the low bits of its own mantissa, an
// error under 2^-21 |x| whose sign is small's, as often positive as negative.
// Where the add overflows (NaN payloads near all ones) big is garbage, but
// small = x - big is then NaN and carries it into the product. A float32 word kept for
// many splits (the wgmma kernels' a_words_global) is stored rounding-biased, once, and
// split with two instructions each time (set_from_biased).
template <int PASSES, int N>
struct Tf32Words {
    unsigned big[N];
    unsigned small[PASSES == 3 ? N : 1];
    __device__ void set(int i, float x) {
        if constexpr (PASSES == 3) {
            big[i] = (__float_as_uint(x) + 0x1000u) & 0xFFFFE000u;
            small[i] = __float_as_uint(x - __uint_as_float(big[i]));
        } else {
            big[i] = to_tf32(x);
        }
    }
    __device__ void set_bits(const unsigned (&w)[N]) {
#pragma unroll
        for (int i = 0; i < N; ++i) set(i, __uint_as_float(w[i]));
    }
    // set(i, x) from rounding_biased(x) (below), in two instructions: big is the biased
    // word as it is - its top 19 bits are x rounded as set rounds it, and wgmma reads
    // those only (tests/test_precision_gpu.py) - and small = biased - (rounded + the half
    // unit).
    // top19: 0xFFFFE000 in a register (biased_split_mask()), so that the mask and the or
    // are one LOP3 (with both as immediates ptxas rebuilt the mask before each).
    __device__ void set_from_biased(int i, float biased, unsigned top19) {
        static_assert(PASSES == 3, "3xTF32 parts");
        big[i] = __float_as_uint(biased);
        small[i] = __float_as_uint(biased - __uint_as_float((big[i] & top19) | 0x1000u));
    }
};

// Tf32Words::set_from_biased's mask, 0xFFFFE000, as a value ptxas cannot fold: given
// the constant, it moved it into a register before every LOP3 (one more instruction a
// word); the dynamic shared-memory size shifted right by 20 is 0 (no GPU has 1 MiB of it
// per block), but only known at launch.
__device__ __forceinline__ unsigned biased_split_mask() {
    unsigned dynamic_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;\n" : "=r"(dynamic_smem));
    return 0xFFFFE000u | (dynamic_smem >> 20);
}

// x plus half a TF32 unit in the last place of x rounded to TF32 (nearest, ties away, as
// Tf32Words::set rounds), for a float32 word that a kernel keeps and splits many times
// (a_words_global): its top 19 bits are then the rounded x, and x - rounded is the word
// minus (those bits + the half unit), exact. Within x's binade that is an integer add of
// 0x1000; where the rounding carries into the next power of two, x plus half of that
// binade's unit, rounded (small then off by at most one float32 unit of x). Zero becomes
// 0x1000's denormal, whose parts are both zero; NaN and inf stay NaN in small, as set
// leaves them.
__device__ __forceinline__ float rounding_biased(float x) {
    const unsigned bits = __float_as_uint(x), up = bits + 0x1000u;
    const float next_binade = x + __uint_as_float(up & 0xFF800000u) * (1.0f / 2048.0f);
    return ((up ^ bits) & 0x7F800000u) == 0 ? __uint_as_float(up) : next_binade;
}

template <int PASSES>
struct MmaTf32 {
    static_assert(PASSES == 1 || PASSES == 3, "one TF32 pass, or 3xTF32");
    static constexpr int passes = PASSES;
    using Smem = float;
    static constexpr int K_STEP = 8;
    using A = Tf32Words<PASSES, 4>;  // 16 x 8
    using B = Tf32Words<PASSES, 4>;  // 8 x 8 for two column blocks: [0..1] block j, [2..3] block j + 1

    __device__ static void load_a(A& a, unsigned addr) {
        unsigned w[4];
        ldmatrix_x4(w, addr);
        a.set_bits(w);
    }
    __device__ static void load_b(B& b, unsigned addr) {
        unsigned w[4];
        ldmatrix_x4(w, addr);
        b.set_bits(w);
    }
    // A of the k-step at accumulator block kb (8 keys), k order permuted (see above):
    // a0 (row g, k' t) = key 2t, a2 (row g, k' t + 4) = key 2t + 1; a1, a3 row g + 8.
    template <int N>
    __device__ static void a_from_acc(A& a, const float (&x)[N][4], int kb) {
        a.set(0, x[kb][0]);
        a.set(1, x[kb][2]);
        a.set(2, x[kb][1]);
        a.set(3, x[kb][3]);
    }
    // Lane (g, t) reads B rows 2t and 2t + 1 (keys in the permuted order), column g.
    __device__ static int kmajor_lane_offset(int lane, int stride) { return 2 * (lane % 4) * stride + lane / 4; }
    __device__ static void load_b_kmajor(B& b, unsigned addr, int row_bytes) {
        b.set(0, __uint_as_float(lds32(addr)));
        b.set(1, __uint_as_float(lds32(addr + row_bytes)));
        b.set(2, __uint_as_float(lds32(addr + 32)));  // column block j + 1: 8 words on
        b.set(3, __uint_as_float(lds32(addr + row_bytes + 32)));
    }
    // c += a b for column block `half` of b. 3xTF32 sums the k-step's three products
    // in a fresh accumulator (small terms first: they are the smallest) and adds that
    // to c with a rounded float32 add: the tensor cores truncate their float32
    // additions (round toward zero), and a chain of them through c (3 * D / 8 for
    // S = Q K^T, thousands for dK, dV over a long sequence) biases every sum toward
    // zero: 3.4-4.7x a float32 NumPy reference's error, this 0.4-0.6x, in the float64
    // model of scripts/tf32_error_model.py; measured in docs/precision.md.
    // The fresh accumulator is c * 0 rather than 0 so that each k-step waits for the
    // previous one's add: with independent k-steps ptxas hoists every k-step's loads
    // and splits ahead and spills (e.g. 104 bytes at head dim 128). An inf in c
    // turns NaN here (inf * 0) where the chain kept it inf: not finite either way.
    __device__ static void mma(float (&c)[4], const A& a, const B& b, int half) {
        const int j = 2 * half;
        if constexpr (PASSES == 3) {
            float k_step[4];
#pragma unroll
            for (int e = 0; e < 4; ++e) k_step[e] = c[e] * 0.0f;
            mma_tf32(k_step, a.small[0], a.small[1], a.small[2], a.small[3], b.big[j], b.big[j + 1]);
            mma_tf32(k_step, a.big[0], a.big[1], a.big[2], a.big[3], b.small[j], b.small[j + 1]);
            mma_tf32(k_step, a.big[0], a.big[1], a.big[2], a.big[3], b.big[j], b.big[j + 1]);
#pragma unroll
            for (int e = 0; e < 4; ++e) c[e] += k_step[e];
        } else {
            mma_tf32(c, a.big[0], a.big[1], a.big[2], a.big[3], b.big[j], b.big[j + 1]);
        }
    }
};

// acc[mt][j] += A_mt B for MT row tiles: A (16 x K_BLOCKS * 8, k = keys or query rows)
// from the float accumulators x[mt], rounded to the operand type; B (K_BLOCKS * 8 rows
// x OUT_BLOCKS * 8 columns, row-major in shared memory) read k-major at b_addr (the
// lane's kmajor_lane_offset), row stride ROW bytes. The products O = P V, dV = P^T dO,
// dK = dS^T Q and dQ = dS K, summed over every key or query of a long sequence.
template <typename Op, int MT, int K_BLOCKS, int OUT_BLOCKS, int ROW>
__device__ __forceinline__ void acc_times_kmajor(float (&acc)[MT][OUT_BLOCKS][4], const float (&x)[MT][K_BLOCKS][4],
                                                 unsigned b_addr) {
    constexpr int E = (int)sizeof(typename Op::Smem);
    constexpr int KB = Op::K_STEP / 8;  // accumulator blocks per k-step
#pragma unroll
    for (int kb = 0; kb < K_BLOCKS; kb += KB) {
        typename Op::A a[MT];
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) Op::a_from_acc(a[mt], x[mt], kb);
#pragma unroll
        for (int j = 0; j < OUT_BLOCKS; j += 2) {
            typename Op::B b;  // output columns j and j + 1; each fragment feeds all MT row tiles
            Op::load_b_kmajor(b, b_addr + kb * 8 * ROW + j * 8 * E, ROW);
#pragma unroll
            for (int mt = 0; mt < MT; ++mt) {
                Op::mma(acc[mt][j], a[mt], b, 0);
                Op::mma(acc[mt][j + 1], a[mt], b, 1);
            }
        }
    }
}

// Lane offsets (elements of Smem) of the ldmatrix rows for A and B of a rows-by-rows product.
template <typename Smem>
__device__ __forceinline__ int a_lane_offset(int lane, int stride) {
    constexpr int COL = 16 / (int)sizeof(Smem);  // 16 bytes
    return (lane % 8 + ((lane / 8) & 1) * 8) * stride + (lane / 16) * COL;
}
template <typename Smem>
__device__ __forceinline__ int b_lane_offset(int lane, int stride) {
    constexpr int COL = 16 / (int)sizeof(Smem);
    return ((lane / 16) * 8 + lane % 8) * stride + ((lane / 8) & 1) * COL;
}

// Shared-memory row stride (elements) of a tile with D_PAD columns: 16 bytes of
// padding, so the 8 rows one ldmatrix phase reads fall in 8 different 16-byte
// bank groups, and (float) the k-major reads of rows 2t, 2t + 1 hit 32 banks.
template <typename Smem, int D_PAD>
__host__ __device__ constexpr int padded_stride() {
    return D_PAD + 16 / (int)sizeof(Smem);
}

// 16-byte asynchronous copy; src_bytes < 16 zero-fills the rest (0: all zeros).
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Copy a [ROWS][COLS] tile (COLS a multiple of 8 elements) from global memory
// (row stride src_stride elements, 16-byte aligned rows) into shared memory
// (row stride DST_STRIDE) with 16-byte cp.async; rows >= valid_rows and
// 16-byte chunks at or past valid_cols (a multiple of 8) are zero-filled.
// STEPPED: unrolled, each thread one column chunk of every (THREADS / CHUNKS)-th row
// through one pointer stepped by a constant, a compare and a copy a chunk (the
// forward's K/V loads). Otherwise a loop, not unrolled: unrolled that way, ptxas
// keeps every row's 64-bit source address live across the caller's whole loop,
// registers the backward's 32-row tiles need.
template <typename T, int ROWS, int COLS, int DST_STRIDE, int THREADS, bool STEPPED = false>
__device__ __forceinline__ void cp_async_tile(T* dst, const T* src, long long src_stride, int valid_rows,
                                              int valid_cols) {
    constexpr int CHUNK = 16 / (int)sizeof(T);  // elements per 16 bytes
    constexpr int CHUNKS = COLS / CHUNK;
    if constexpr (STEPPED) {
        static_assert(THREADS % CHUNKS == 0 && ROWS % (THREADS / CHUNKS) == 0, "whole rows a step");
        constexpr int ROW_STEP = THREADS / CHUNKS;
        const int r0 = threadIdx.x / CHUNKS, c = threadIdx.x % CHUNKS * CHUNK;
        const bool col_ok = c < valid_cols;
        const T* p = src + r0 * src_stride + c;
        T* d = dst + r0 * DST_STRIDE + c;
#pragma unroll
        for (int i = 0; i < ROWS / ROW_STEP; ++i) {
            const bool ok = col_ok && r0 + i * ROW_STEP < valid_rows;
            cp_async_16(d + i * ROW_STEP * DST_STRIDE, ok ? p : src, ok ? 16 : 0);
            p += ROW_STEP * src_stride;
        }
    } else {
#pragma unroll 1
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
            const int r = i / CHUNKS, c = (i % CHUNKS) * CHUNK;
            const bool ok = r < valid_rows && c < valid_cols;
            cp_async_16(dst + r * DST_STRIDE + c, ok ? src + r * src_stride + c : src, ok ? 16 : 0);
        }
    }
}

// Flip the sign of every element of a [ROWS][COLS] tile (row stride STRIDE elements).
template <typename S, int ROWS, int COLS, int STRIDE, int THREADS>
__device__ __forceinline__ void negate_tile(S* tile) {
    constexpr unsigned SIGNS = sizeof(S) == 2 ? 0x80008000u : 0x80000000u;
    constexpr int CHUNKS = COLS * (int)sizeof(S) / 16;
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        uint4* p = reinterpret_cast<uint4*>(tile + (i / CHUNKS) * STRIDE) + i % CHUNKS;
        const uint4 w = *p;
        *p = make_uint4(w.x ^ SIGNS, w.y ^ SIGNS, w.z ^ SIGNS, w.w ^ SIGNS);
    }
}

// As cp_async_tile, for a tile staged in shared memory as S while global memory
// holds T: the same type is copied asynchronously; float32 becomes a half type
// through registers (8 elements per step: two 16-byte loads, one 16-byte store),
// which halves the tile's shared memory but waits for the loads.
template <typename T, typename S, int ROWS, int COLS, int DST_STRIDE, int THREADS, bool STEPPED = false>
__device__ __forceinline__ void stage_tile(S* dst, const T* src, long long src_stride, int valid_rows, int valid_cols) {
    if constexpr (same_type<T, S>) {
        cp_async_tile<T, ROWS, COLS, DST_STRIDE, THREADS, STEPPED>(dst, src, src_stride, valid_rows, valid_cols);
    } else {
        static_assert(same_type<T, float> && sizeof(S) == 2, "float32 staged as a half type");
        constexpr int CHUNKS = COLS / 8;
#pragma unroll 1
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
            const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
            uint4 packed = make_uint4(0u, 0u, 0u, 0u);  // all-zero bits: 0.0 in both half types
            if (r < valid_rows && c < valid_cols) {
                const float4* p = reinterpret_cast<const float4*>(src + r * src_stride + c);
                const float4 lo = p[0], hi = p[1];
                packed.x = HalfOps<S>::pack(lo.x, lo.y);
                packed.y = HalfOps<S>::pack(lo.z, lo.w);
                packed.z = HalfOps<S>::pack(hi.x, hi.y);
                packed.w = HalfOps<S>::pack(hi.z, hi.w);
            }
            *reinterpret_cast<uint4*>(dst + r * DST_STRIDE + c) = packed;
        }
    }
}

}  // namespace cupyattn
