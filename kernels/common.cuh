// Shared helpers for the cupyattn kernels: element types, warp reductions,
// and the compile-time check that a kernel's shared-memory layout matches the
// one the Python planner computed (the planner's layout is the source of truth).
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace cupyattn {

constexpr float LN2 = 0.6931471805599453f;
// NVRTC has no <math.h>: -inf from its bit pattern.
#define CUPYATTN_NEG_INF (-__int_as_float(0x7f800000))

__host__ __device__ constexpr int align16(int bytes) { return (bytes + 15) / 16 * 16; }

// std::is_same_v without <type_traits> (not every NVRTC ships it).
template <typename A, typename B>
constexpr bool same_type = false;
template <typename A>
constexpr bool same_type<A, A> = true;
// std::conditional_t likewise: select_type<C, X, Y> is X where C, else Y.
template <bool C, class X, class Y>
struct select_type_t {
    using type = X;
};
template <class X, class Y>
struct select_type_t<false, X, Y> {
    using type = Y;
};
template <bool C, class X, class Y>
using select_type = typename select_type_t<C, X, Y>::type;

// Element traits. A "word" is 4 bytes of a shared-memory row: one float or two
// halves. SIMT kernels read shared memory a word per lane, which is what the
// one-word row padding against bank conflicts is measured in.
template <typename T>
struct Elem;

template <>
struct Elem<float> {
    static constexpr int VEC = 1;
    using Word = float;
    __device__ static float to_float(float x) { return x; }
    __device__ static float from_float(float x) { return x; }
    __device__ static float zero() { return 0.0f; }
    __device__ static void unpack(Word w, float (&f)[VEC]) { f[0] = w; }
};

template <>
struct Elem<__half> {
    static constexpr int VEC = 2;
    using Word = __half2;
    __device__ static float to_float(__half x) { return __half2float(x); }
    __device__ static __half from_float(float x) { return __float2half_rn(x); }
    __device__ static __half zero() { return __float2half_rn(0.0f); }
    __device__ static void unpack(Word w, float (&f)[VEC]) {
        const float2 t = __half22float2(w);
        f[0] = t.x;
        f[1] = t.y;
    }
};

template <>
struct Elem<__nv_bfloat16> {
    static constexpr int VEC = 2;
    using Word = __nv_bfloat162;
    __device__ static float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
    __device__ static __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
    __device__ static __nv_bfloat16 zero() { return __float2bfloat16_rn(0.0f); }
    __device__ static void unpack(Word w, float (&f)[VEC]) {
        const float2 t = __bfloat1622float2(w);
        f[0] = t.x;
        f[1] = t.y;
    }
};

constexpr unsigned FULL_MASK = 0xffffffffu;

// Sum over the lanes whose index differs only in bits [log2 FIRST, 5): the
// butterfly leaves the result in every lane of the group.
template <int FIRST>
__device__ __forceinline__ float warp_sum_from(float x) {
#pragma unroll
    for (int off = FIRST; off < 32; off <<= 1) x += __shfl_xor_sync(FULL_MASK, x, off);
    return x;
}

// 2^x on the special-function unit, results below 2^-126 flushed to zero: the same bits as
// exp2f wherever the result is a normal float, without the range check and rescaling exp2f
// adds an element for denormal results (no probability that small changes an output).
// (The mma.sync backward kernels keep exp2f: with this, ptxas spills some of them.)
__device__ __forceinline__ float exp2_ftz(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// Max / sum over aligned groups of WIDTH consecutive lanes (WIDTH a power of two).
template <int WIDTH>
__device__ __forceinline__ float group_max(float x) {
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off >>= 1) x = fmaxf(x, __shfl_xor_sync(FULL_MASK, x, off));
    return x;
}

template <int WIDTH>
__device__ __forceinline__ float group_sum(float x) {
#pragma unroll
    for (int off = WIDTH / 2; off > 0; off >>= 1) x += __shfl_xor_sync(FULL_MASK, x, off);
    return x;
}

// Layout agreement check. The planner compiles this next to every kernel with
// the offsets and total it computed; a mismatch is a compile error, so a kernel
// can never be launched with a shared-memory size that differs from its layout.
template <class Layout, int... OFFSETS>
__host__ __device__ constexpr bool offsets_match() {
    constexpr int expected[] = {OFFSETS...};
    for (int i = 0; i < Layout::num_buffers; ++i)
        if (Layout::offsets[i] != expected[i]) return false;
    return true;
}

template <class Layout, int TOTAL, int... OFFSETS>
struct LayoutAgrees {
    static_assert(sizeof...(OFFSETS) == Layout::num_buffers,
                  "planner and kernel disagree on the number of shared-memory buffers");
    static_assert(offsets_match<Layout, OFFSETS...>(), "planner and kernel disagree on shared-memory buffer offsets");
    static_assert(Layout::total == TOTAL, "planner and kernel disagree on the total shared-memory bytes");
    static constexpr bool value = true;
};

template <class Layout, int TOTAL, int... OFFSETS>
__global__ void check_layout() {
    static_assert(LayoutAgrees<Layout, TOTAL, OFFSETS...>::value, "");
}

}  // namespace cupyattn
