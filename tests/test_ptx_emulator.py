"""_ptx_emulator, the CPU run of a probe kernel's PTX, against NumPy on kernels compiled
here by NVRTC: the integer arithmetic it emulates, shared memory across a barrier, races
between barriers, float32 rounding, warp shuffles, a refusal to run what it does not
emulate; then wgmma_tiles.cuh's shared-memory rearrangements (transpose_core_tile,
zero_transposed_rows) and the staging launches (wgmma_staging.cuh) as compiled, on the
CPU (the GPU tests run them on the GPU); then float16 / bfloat16 wgmma on 128-byte
swizzled tiles (K-major and MN-major, from shared memory and from registers) and tensor
copies (cp.async.bulk.tensor through tensor_map, expect_tx), against NumPy and the layout
an H100 produced in probes like these; then the mma.sync kernels' own: cp.async groups and
the waits that land them, ldmatrix and mma.sync against the PTX ISA's register fragments
built in NumPy."""

import numpy as np
import pytest
from _probes import CORE_TILE_PROBES, compile_probe
from _ptx_emulator import DeadlockError, PtxKernel, RaceError, TrapError, UninitializedError, bank_wavefronts
from _tile_orders import core_offset, slot_row, staged_operands, staged_tiles
from test_compile import _nvrtc_reason

pytestmark = pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))

ARITHMETIC_PROBE = r"""
// Each thread's x and y (y != 0) through the integer operations a probe's index
// arithmetic compiles to, and x passed one thread on through shared memory.
extern "C" __global__ void arithmetic_probe(const int* in, int* out, long long* wide) {
    extern __shared__ int words[];
    const int t = threadIdx.x, n = blockDim.x;
    const int x = in[t], y = in[n + t];
    const unsigned ux = x, uy = y;
    int* o = out + 11 * t;
    o[0] = x / y;
    o[1] = x % y;
    o[2] = x >> (t % 32);
    o[3] = ux >> (t % 32);
    o[4] = min(x, y) - max(x, y);
    o[5] = x < y ? x * 3 : y - x;
    o[6] = (ux & ~0xF0u) | ((uy << 4) & 0xF0u);
    o[7] = ux / uy + ux % uy;
    o[8] = (ux ^ uy) + (ux | uy) * 5u - (ux << (t % 8));  // (unsigned: wrapping is defined)
    o[9] = x / 7 + (int)(ux / 28u);  // division by constants: high halves of products
    wide[t] = (long long)x * y;
    words[t] = x;
    __syncthreads();
    o[10] = words[(t + 1) % n];
}
"""

NEIGHBOUR_PROBE = r"""
// Each thread's word (-1 first, for all to see) set again and read back by its neighbour,
// with or without a barrier between; or (UNWRITTEN) a word no thread writes read.
template <bool SYNCED, bool UNWRITTEN = false>
__global__ void neighbour_probe(int* out) {
    extern __shared__ int words[];
    words[threadIdx.x] = -1;
    __syncthreads();
    words[threadIdx.x] = threadIdx.x;
    if (SYNCED) __syncthreads();
    out[threadIdx.x] = words[(threadIdx.x + 1) % blockDim.x + (UNWRITTEN ? blockDim.x : 0)];
}
"""

FLOAT_PROBE = r"""
extern "C" __global__ void float_probe(const float* a, const float* b, const float* c, float* out) {
    const int t = threadIdx.x;
    float* o = out + 4 * t;
    o[0] = __fmaf_rn(a[t], b[t], c[t]);
    o[1] = __fadd_rn(a[t], b[t]);
    o[2] = __fmul_rn(a[t], c[t]);
    o[3] = __fsub_rn(b[t], c[t]);
}
"""

FLOAT_MORE_PROBE = r"""
// The rest of the float32 operations the wgmma kernels use: a reciprocal, max and min
// (a NaN gives the other), int to float, ordered comparisons, and an atomic add.
extern "C" __global__ void float_more_probe(const float* a, const float* b, const int* n, float* out, float* sum) {
    const int t = threadIdx.x;
    float* o = out + 5 * t;
    o[0] = 1.0f / a[t];
    o[1] = fmaxf(a[t], b[t]);
    o[2] = fminf(a[t], b[t]);
    o[3] = (float)n[t];
    o[4] = a[t] < b[t] ? 1.0f : a[t] == b[t] ? 2.0f : 0.0f;
    atomicAdd(sum, (float)n[t]);
}
"""

SHUFFLE_PROBE = r"""
// A warp's sum by butterfly, lane ^ 5's, a lane three on (its own past the warp's end),
// lane 5's.
extern "C" __global__ void shuffle_probe(const int* in, int* out) {
    const int t = threadIdx.x, x = in[t];
    int sum = x;
    for (int m = 16; m; m /= 2) sum += __shfl_xor_sync(0xffffffff, sum, m);
    out[4 * t] = sum;
    out[4 * t + 1] = __shfl_xor_sync(0xffffffff, x, 5);
    out[4 * t + 2] = __shfl_down_sync(0xffffffff, x, 3);
    out[4 * t + 3] = __shfl_sync(0xffffffff, x, 5);
}
"""

STMATRIX_PROBE = r"""
// stmatrix .x4: lane l's words l * 4 + j as four 8 x 8 b16 matrices, row i of matrix j at the
// 16-byte slot (7 - i) + 8 (3 - j) of a shared tile (reversed: the lanes' addresses place the
// rows), read back after the warp meets.
extern "C" __global__ void stmatrix_probe(unsigned* out) {
    __shared__ __align__(16) unsigned tile[128];
    const int lane = threadIdx.x, i = lane % 8, j = lane / 8;
    const unsigned at = (unsigned)__cvta_generic_to_shared(tile) + ((7 - i) + 8 * (3 - j)) * 16;
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(at), "r"(lane * 4),
                 "r"(lane * 4 + 1), "r"(lane * 4 + 2), "r"(lane * 4 + 3)
                 : "memory");
    __syncwarp();
    for (int k = lane; k < 128; k += 32) out[k] = tile[k];
}
"""

TRAP_PROBE = r"""
extern "C" __global__ void trap_probe(int* out, int bad) {
    if (bad && threadIdx.x == 3) __trap();
    out[threadIdx.x] = 1;
}
"""

DIVIDE_PROBE = r"""
extern "C" __global__ void divide_probe(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x] / 3.0f; }
"""


SYNC_PROBES = r"""
#include "wgmma.cuh"
using namespace cupyattn;
// d = A B^T by one wgmma m64n16k8 (TF32) of the block's 128 threads, A (64 x 8) and B
// (16 x 8) in core-matrix order from global memory; FENCE: the threads' stores made
// visible to the async proxy before the barrier, as the kernels do.
template <bool FENCE>
__global__ void wgmma_probe(const float* a, const float* b, float* out) {
    __shared__ __align__(128) float tiles[64 * 8 + 16 * 8];
    for (int i = threadIdx.x; i < 64 * 8 + 16 * 8; i += 128) tiles[i] = i < 64 * 8 ? a[i] : b[i - 64 * 8];
    if (FENCE) fence_proxy_async();
    __syncthreads();
    float d[2][4];
    wgmma_fence();
    WgmmaTf32<16>::ss<false>(d, wgmma_desc<64>(wg_smem_addr(tiles)), wgmma_desc<16>(wg_smem_addr(tiles + 64 * 8)));
    wgmma_commit();
    wgmma_wait<0>();
    fence_operand(d);
    for (int j = 0; j < 2; ++j)
        for (int e = 0; e < 4; ++e) out[threadIdx.x * 8 + j * 4 + e] = d[j][e];
}
// Every thread waits for an mbarrier's first phase, of ARRIVALS arrivals; thread 0 arrives.
template <int ARRIVALS>
__global__ void phase_probe(int* out) {
    __shared__ unsigned long long bar;
    init_mbarriers<1, 0, ARRIVALS>(&bar);  // (one arrival: init_mbarriers' first N)
    if (ARRIVALS == 2 && threadIdx.x == 0) mbarrier_init(&bar, 2);
    __syncthreads();
    if (threadIdx.x == 0) mbarrier_arrive(&bar);
    mbarrier_wait(&bar, 0);
    out[threadIdx.x] = 1;
}
// Warp 0 stores words that warp 1 reads, handed over by named barrier 1 (ARRIVE: warp 0's
// bar.arrive, warp 1's bar.sync) or not at all.
template <bool ARRIVE>
__global__ void handoff_probe(int* out) {
    __shared__ int words[32];
    if (threadIdx.x < 32) {
        words[threadIdx.x] = 3 * threadIdx.x;
        if (ARRIVE) asm volatile("bar.arrive 1, 64;" ::: "memory");
    } else {
        if (ARRIVE) named_barrier_sync(1, 64);
        out[threadIdx.x - 32] = words[threadIdx.x - 32];
    }
}
"""


def _kernel(source, name, arch="sm_90"):
    _, ptx, entry = compile_probe(source, name, arch)
    return PtxKernel(ptx, entry)


def _truncated(x, y):  # C's division and remainder of int32
    q = np.abs(x) // np.abs(y) * np.sign(x) * np.sign(y)
    return q, x - q * y


def test_integer_arithmetic_and_shared_memory_match_numpy():
    n = 64
    rng = np.random.default_rng(7)
    x = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
    y = rng.integers(-(2**31), 2**31, n, dtype=np.int64)
    x[:4], y[:4] = [-7, 7, -(2**31), 5], [2, -2, 3, -1]  # signs of division, the smallest int
    y[y == 0] = 1
    out = np.full(11 * n, 0x7FC00000, dtype=np.int32)  # poisoned
    wide = np.zeros(n, dtype=np.int64)
    _kernel(ARITHMETIC_PROBE, "arithmetic_probe").run(n, [np.concatenate([x, y]).astype(np.int32), out, wide], n * 4)
    t = np.arange(n)
    ux, uy = x % 2**32, y % 2**32
    q, r = _truncated(x, y)
    want = np.stack(
        [
            q,
            r,
            x >> (t % 32),
            ux >> (t % 32),
            np.minimum(x, y) - np.maximum(x, y),
            np.where(x < y, x * 3, y - x),
            (x & ~0xF0) | ((y << 4) & 0xF0),
            ux // uy + ux % uy,
            (x ^ y) + (x | y) * 5 - (x << (t % 8)),
            _truncated(x, 7)[0] + ux // 28,
            np.roll(x, -1),
        ],
        axis=1,
    )
    np.testing.assert_array_equal(out.reshape(n, 11), ((want + 2**31) % 2**32 - 2**31).astype(np.int32))
    np.testing.assert_array_equal(wide, x * y)


def test_a_word_read_back_across_the_barrier_runs_and_without_it_is_a_race():
    out = np.zeros(96, dtype=np.int32)
    _kernel(NEIGHBOUR_PROBE, "neighbour_probe<true>").run(96, [out], 96 * 4)
    np.testing.assert_array_equal(out, np.roll(np.arange(96), -1))
    with pytest.raises(RaceError, match="unordered"):
        _kernel(NEIGHBOUR_PROBE, "neighbour_probe<false>").run(96, [out], 96 * 4)
    with pytest.raises(UninitializedError, match="nothing stored it"):
        _kernel(NEIGHBOUR_PROBE, "neighbour_probe<true, true>").run(96, [out], 2 * 96 * 4)


def test_float32_arithmetic_is_rounded_once_as_the_gpu_rounds_it():
    n = 64
    rng = np.random.default_rng(3)
    a, b, c = ((rng.standard_normal(n) * 2.0 ** rng.integers(-20, 20, n)).astype(np.float32) for _ in range(3))
    # a * b = 1 + 2^-11 + 2^-24, halfway between two floats; c = +-2^-70 decides: rounded in
    # double first, both would tie to the even 1 + 2^-11.
    a[:2] = b[:2] = np.float32(1 + 2**-12)
    c[:2] = np.float32(2**-70), np.float32(-(2**-70))
    # More ties: products halfway between two floats, c zero (to even) or a hair either way.
    k = rng.integers(1, 2**10, 16) * 2 + 1
    a[2:18], b[2:18] = (1 + k * 2.0**-12).astype(np.float32), np.float32(1 + 2**-12)
    c[2:18] = np.tile(np.float32([0, 2**-60, -(2**-60), 2**-149]), 4)
    out = np.full(4 * n, np.nan, dtype=np.float32)
    _kernel(FLOAT_PROBE, "float_probe").run(n, [a, b, c, out])
    out = out.reshape(n, 4)
    assert out[0, 0] == np.float32(1 + 2**-11 + 2**-23) and out[1, 0] == np.float32(1 + 2**-11)
    np.testing.assert_array_equal(out[:, 0], [_exact_fma(*x) for x in zip(a, b, c)])
    np.testing.assert_array_equal(out[:, 1:], np.stack([a + b, a * c, b - c], axis=1))


def test_reciprocal_max_min_int_to_float_compares_and_atomic_adds_match_numpy():
    n = 64
    rng = np.random.default_rng(4)
    a = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 30, n)).astype(np.float32)
    b = np.where(rng.random(n) < 0.2, a, rng.standard_normal(n)).astype(np.float32)
    a[:3], b[3:6] = np.nan, np.nan
    ints = rng.integers(-(2**31), 2**31, n).astype(np.int32)
    out, total = np.full(5 * n, np.nan, np.float32), np.zeros(1, np.float32)
    _kernel(FLOAT_MORE_PROBE, "float_more_probe").run(n, [a, b, ints, out, total])
    out = out.reshape(n, 5)
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(out[:, 0], np.float32(1) / a)
        np.testing.assert_array_equal(out[:, 1], np.fmax(a, b))
        np.testing.assert_array_equal(out[:, 2], np.fmin(a, b))
        np.testing.assert_array_equal(out[:, 3], ints.astype(np.float32))
        np.testing.assert_array_equal(out[:, 4], np.where(a < b, 1, np.where(a == b, 2, 0)).astype(np.float32))
    want = np.float32(0)
    for x in ints.astype(np.float32):  # (the threads in turn)
        want = np.float32(want + x)
    np.testing.assert_array_equal(total, [want])


def _exact_fma(a, b, c) -> np.float32:
    """a * b + c rounded once to float32, nearest, ties to even (exact fractions)."""
    from fractions import Fraction

    exact = Fraction(float(a)) * Fraction(float(b)) + Fraction(float(c))
    f = np.float32(float(exact))
    near = (np.nextafter(f, np.float32(-np.inf)), f, np.nextafter(f, np.float32(np.inf)))
    return min(near, key=lambda x: (abs(Fraction(float(x)) - exact), int(x.view(np.uint32)) & 1))


def test_warp_shuffles_exchange_the_lanes_values():
    n = 64
    x = np.random.default_rng(5).integers(-1000, 1000, n).astype(np.int32)
    out = np.zeros(4 * n, dtype=np.int32)
    _kernel(SHUFFLE_PROBE, "shuffle_probe").run(n, [x, out])
    warps = x.reshape(2, 32)
    lane = np.arange(32)
    down = np.where(lane + 3 < 32, np.roll(warps, -3, axis=1), warps)
    want = np.stack(
        [
            np.repeat(warps.sum(axis=1), 32),
            warps[:, lane ^ 5].reshape(-1),
            down.reshape(-1),
            np.repeat(warps[:, 5], 32),
        ],
        axis=1,
    )
    np.testing.assert_array_equal(out.reshape(n, 4), want)


def test_stmatrix_stores_each_matrix_row_from_four_lanes_at_its_lane_s_address():
    out = np.zeros(128, dtype=np.uint32)
    _kernel(STMATRIX_PROBE, "stmatrix_probe").run(32, [out])
    i, j, q = np.meshgrid(np.arange(8), np.arange(4), np.arange(4), indexing="ij")  # row, matrix, lane of 4
    want = np.zeros(128, dtype=np.uint32)
    want[((7 - i) + 8 * (3 - j)) * 4 + q] = (4 * i + q) * 4 + j
    np.testing.assert_array_equal(out, want)


def test_what_it_does_not_emulate_is_refused_by_name():
    with pytest.raises(NotImplementedError, match=r"div\.rn\.f32|rcp"):
        _kernel(DIVIDE_PROBE, "divide_probe").run(32, [np.ones(32, np.float32), np.zeros(32, np.float32)])


def test_a_trap_fails_the_run_naming_the_thread():
    out = np.zeros(32, np.int32)
    _kernel(TRAP_PROBE, "trap_probe").run(32, [out, 0])
    assert (out == 1).all()
    with pytest.raises(TrapError, match="thread 3 of block 0"):
        _kernel(TRAP_PROBE, "trap_probe").run(32, [out, 1])


def test_shared_memory_outside_the_launch_s_bytes_is_an_error():
    with pytest.raises(IndexError, match="shared access"):
        _kernel(NEIGHBOUR_PROBE, "neighbour_probe<true>").run(96, [np.zeros(96, np.int32)], 95 * 4)


def _random_words(words, seed):
    return np.random.default_rng(seed).integers(0, 2**32, words, dtype=np.uint32)


@pytest.mark.parametrize("parts,rows,cols", [(2, 64, 64), (1, 32, 256), (2, 16, 24)])
def test_transpose_core_tile_puts_each_element_at_its_transposed_place(parts, rows, cols):
    words = _random_words(parts * rows * cols, rows * cols)
    out = np.full_like(words, 0xFFC00000)  # poisoned
    kernel = _kernel(CORE_TILE_PROBES, f"transpose_core_probe<{parts}, {rows}, {cols}>")
    kernel.run(128, [words, out], 2 * words.nbytes)
    r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
    part = rows * cols
    want = np.zeros_like(words)
    for p in range(parts):
        want[p * part + core_offset(cols, c, r)] = words[p * part + core_offset(rows, r, c)]
    np.testing.assert_array_equal(out, want)


def test_bank_wavefronts_counts_the_accesses_a_warp_s_words_need():
    assert bank_wavefronts([(lane, 4 * lane * 32, 4) for lane in range(32)]) == 32  # (one bank, 32 words)
    assert bank_wavefronts([(lane, 16 * lane, 16) for lane in range(32)]) == 4  # (512 bytes: the fewest)
    assert bank_wavefronts([(lane, 4 * lane, 4) for lane in range(32)]) == 1


@pytest.mark.parametrize(
    "parts,rows,d_pad,from_row",
    [
        (2, 16, 256, 0),
        (2, 16, 256, 1),
        (2, 16, 256, 7),
        (2, 16, 256, 9),
        (2, 16, 256, 16),
        (1, 64, 64, 40),
        (1, 32, 96, 31),
    ],
)
def test_zero_transposed_rows_zeroes_the_rows_from_its_index_and_keeps_the_rest(parts, rows, d_pad, from_row):
    words = _random_words(parts * rows * d_pad, rows * d_pad + from_row)
    out = np.full_like(words, 0xFFC00000)  # poisoned
    kernel = _kernel(CORE_TILE_PROBES, f"zero_rows_probe<{parts}, {rows}, {d_pad}>")
    kernel.run(128, [words, out, from_row], words.nbytes)
    d, slot = np.meshgrid(np.arange(d_pad), np.arange(rows), indexing="ij")
    zeroed = np.zeros(rows * d_pad, bool)
    zeroed[core_offset(d_pad, d, slot)] = slot_row(slot) >= from_row
    want = np.where(np.tile(zeroed, parts), 0, words)
    assert (out == 0).sum() >= parts * d_pad * (rows - from_row)  # (random words are rarely 0)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize(
    "precision,operands,D,rows,parts_as_rows",
    [
        ("fp32", "dkdv queries", 40, 16, False),
        ("tf32", "dkdv queries", 64, 32, False),
        ("fp32", "dq keys", 72, 16, False),
        ("fp32", "forward keys", 40, 16, False),
        ("tf32", "forward keys", 32, 64, False),
        ("fp32", "dkdv queries", 136, 16, True),
        ("fp32", "dq keys", 72, 16, True),
    ],
)
def test_staging_launches_write_the_modelled_tiles_and_delta_as_attn_bwd_delta(
    precision, operands, D, rows, parts_as_rows
):
    """The staging kernels (the launch's grid, one block after another) from strided views
    of two operands interleaved in one array, a partial last tile, the head dim padded:
    every word as staged_tiles models it (TF32 parts split as the kernels do); the query
    tiles' delta = rowsum(dO * O), to delta and beside lse, bit for bit as attn_bwd_delta's
    kernel computes it (test_precision_gpu's test of the same runs on the GPU)."""
    from cupyattn import api
    from cupyattn.compile import kernel_source, target_arch
    from cupyattn.plan import BwdDeltaConfig, StagingConfig, mma_head_dim_pad

    def run(config, blocks, args):
        _kernel(kernel_source(config), config.name_expression, target_arch(config, "sm_90")).run(
            config.threads, args, blocks=blocks
        )

    B, S, H = 1, rows + 5, 2
    rng = np.random.default_rng(D + rows)
    pair = rng.standard_normal((B, S, 2, H, D)).astype(np.float32)
    a, b = pair[:, :, 0], pair[:, :, 1]
    views = [(pair, 0), (pair, H * D * 4)]  # a and b: pointers into one array
    staging = StagingConfig(operands, precision, mma_head_dim_pad(D), rows, parts_as_rows)
    staged = np.full(staging.workspace_bytes(B, H, S) // 4, np.nan, dtype=np.float32)
    blocks = staging.tiles(S) * B * H
    sizes = (np.int32(H), np.int32(S), np.int32(D), np.int32(staging.tiles(S)))
    if staging.queries:
        o_pair = rng.standard_normal((B, S, 2, H, D)).astype(np.float32)
        o = o_pair[:, :, 1]  # strided as dO
        lse = rng.standard_normal((B, H, S)).astype(np.float32)
        delta, own = np.full((B, H, S), np.nan, np.float32), np.full((B, H, S), np.nan, np.float32)
        run(
            staging,
            blocks,
            [
                *views,
                (o_pair, H * D * 4),
                lse,
                delta,
                staged,
                *api._elem_strides(a),
                *api._elem_strides(b),
                *api._elem_strides(o),
                *sizes,
            ],
        )
        cfg, n_rows = BwdDeltaConfig("float32"), B * H * S
        run(
            cfg,
            -(-n_rows // cfg.rows_per_block),
            [
                views[1],
                (o_pair, H * D * 4),
                own,
                *api._elem_strides(b),
                *api._elem_strides(o),
                *sizes[:3],
                np.int64(n_rows),
            ],
        )
        np.testing.assert_array_equal(delta.view(np.uint32), own.view(np.uint32))
        exact = np.einsum("bshd,bshd->bhs", b.astype(np.float64), o.astype(np.float64))
        np.testing.assert_allclose(delta, exact, rtol=1e-5, atol=1e-5)
        want = staged_tiles(
            staged_operands(operands, a, b),
            precision,
            staging.head_dim_pad,
            rows,
            rowwise=(lse * np.float32(1.4426950408889634), delta),
            parts_as_rows=parts_as_rows,
        )
    else:
        run(staging, blocks, [*views, staged, *api._elem_strides(a), *api._elem_strides(b), *sizes])
        want = staged_tiles(
            staged_operands(operands, a, b), precision, staging.head_dim_pad, rows, parts_as_rows=parts_as_rows
        )
    np.testing.assert_array_equal(staged.view(np.uint32), want.view(np.uint32))


def test_a_wgmma_computes_a_b_transposed_in_the_accumulator_layout_and_needs_the_proxy_fence():
    """The emulated wgmma against NumPy: A and B through their descriptors (wgmma.cuh's
    core matrices), the tensor cores' 19 bits of each operand, d in wgmma.cuh's layout;
    without fence.proxy.async after the stores it reads, a race."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((64, 8)).astype(np.float32), rng.standard_normal((16, 8)).astype(np.float32)
    r, k = np.meshgrid(np.arange(64), np.arange(8), indexing="ij")
    a_tile, b_tile = np.zeros(64 * 8, np.float32), np.zeros(16 * 8, np.float32)
    a_tile[core_offset(64, r, k)] = a
    b_tile[core_offset(16, r[:16], k[:16])] = b
    out = np.full(128 * 8, np.nan, np.float32)
    _kernel(SYNC_PROBES, "wgmma_probe<true>", "sm_90a").run(128, [a_tile, b_tile, out])
    tf32 = [(x.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64) for x in (a, b)]
    d = tf32[0] @ tf32[1].T
    lane = np.arange(128)[:, None]
    i = np.arange(8)[None, :]
    rows = 16 * (lane // 32) + lane % 32 // 4 + 8 * (i % 4 // 2)
    cols = 8 * (i // 4) + 2 * (lane % 4) + i % 2
    np.testing.assert_array_equal(out.reshape(128, 8), d[rows, cols].astype(np.float32))
    with pytest.raises(RaceError, match="fence.proxy.async"):
        _kernel(SYNC_PROBES, "wgmma_probe<false>", "sm_90a").run(128, [a_tile, b_tile, out])


def test_a_phase_that_never_completes_is_a_deadlock_and_a_named_barrier_hands_words_over():
    out = np.zeros(64, np.int32)
    _kernel(SYNC_PROBES, "phase_probe<1>", "sm_90a").run(64, [out])
    assert (out == 1).all()
    with pytest.raises(DeadlockError, match="mbarrier.try_wait"):
        _kernel(SYNC_PROBES, "phase_probe<2>", "sm_90a").run(64, [out])
    _kernel(SYNC_PROBES, "handoff_probe<true>", "sm_90a").run(64, [out])
    np.testing.assert_array_equal(out[:32], 3 * np.arange(32))
    with pytest.raises(RaceError, match="unordered"):
        _kernel(SYNC_PROBES, "handoff_probe<false>", "sm_90a").run(64, [out])


def _registers(n: int) -> str:
    return ", ".join(f"%{i}" for i in range(n))


HALF_PROBES = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// 16-bit tiles in shared memory with the 128-byte swizzle: element (r, c) of an R-row tile
// at (c / 64) R 128 + r 128 + ((c % 64 / 8) ^ (r % 8)) 16 + (c % 8) 2, written by threads 16
// bytes each from a row-major global array, then read by wgmma through descriptors.
template <int R>
__device__ unsigned sw128(int r, int c) {
    return (c / 64) * R * 128 + r * 128 + (((c % 64) / 8) ^ (r % 8)) * 16 + (c % 8) * 2;
}
template <int R, int C>
__device__ void to_swizzled(unsigned char* tile, const unsigned short* src) {
    for (int i = threadIdx.x; i < R * C / 8; i += blockDim.x) {
        const int r = i / (C / 8), c = i % (C / 8) * 8;
        *(uint4*)(tile + sw128<R>(r, c)) = *(const uint4*)(src + r * C + c);
    }
}
// 128-byte swizzle (layout 1), stride byte offset 1024 (8 rows or 8 k), leading ``lbo``.
__device__ unsigned long long desc_sw128(const void* p, unsigned lbo) {
    const unsigned at = (unsigned)__cvta_generic_to_shared(p);
    return (0x40000040ull << 32) | ((at >> 4) & 0x3FFF) | ((lbo >> 4) << 16);
}
#define F4(x) "+f"(d[x]), "+f"(d[x + 1]), "+f"(d[x + 2]), "+f"(d[x + 3])
#define F16(x) F4(x), F4(x + 4), F4(x + 8), F4(x + 12)
#define SS64(TY)                                                                                  \
    asm volatile("wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {"                     \
                 R32 "}, %32, %33, 1, 1, 1, 0, 0;" : F16(0), F16(16) : "l"(da), "l"(db) : "memory")
#define RS128(TY)                                                                                 \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"                                     \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {"                    \
                 R64 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}"                              \
                 : F16(0), F16(16), F16(32), F16(48)                                              \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate) : "memory")
// accumulator register i of thread t: row 16 w + g + 8 (i / 2 % 2), column 8 (i / 4) + 2 u + i % 2
__device__ int acc_row(int i) { return 16 * (threadIdx.x / 32) + threadIdx.x % 32 / 4 + 8 * (i / 2 % 2); }
__device__ int acc_col(int i) { return 8 * (i / 4) + 2 * (threadIdx.x % 4) + i % 2; }
__device__ void wg_done() {
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory");
}
// S = Q K^T (64 x 64) of Q, K 64 x D, K-major, by D / 16 SS wgmmas (k-step kk: + 32 bytes in a
// 128-byte row, + 64 R 2 bytes past a 64-column chunk); K's tile K_AT bytes past a 1024 boundary.
template <bool BF16, int D, int K_AT>
__global__ void qk_probe(const unsigned short* q, const unsigned short* k, float* s) {
    __shared__ __align__(1024) unsigned char smem[2 * 64 * D * 2 + 1024];
    unsigned char *tq = smem, *tk = smem + 64 * D * 2 + K_AT;
    to_swizzled<64, D>(tq, q);
    to_swizzled<64, D>(tk, k);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int kk = 0; kk < D / 16; ++kk) {
        const int at = kk / 4 * 64 * 128 + kk % 4 * 32;
        const unsigned long long da = desc_sw128(tq + at, 16), db = desc_sw128(tk + at, 16);
        if (BF16) SS64("bf16"); else SS64("f16");
    }
    wg_done();
    for (int i = 0; i < 32; ++i) s[acc_row(i) * 64 + acc_col(i)] = d[i];
}
// O = P V (64 x 128) of P 64 x 64 (float, packed in-thread from the accumulator layout into A
// registers: a0 = (g, 2u..2u+1), a1 = (g + 8, ...), a2 = (g, 2u + 8..), a3 = (g + 8, 2u + 8..))
// and V 64 keys x 128 (row-major, MN-major to wgmma: trans-b 1, the next 64 columns LBO =
// 64 keys x 128 bytes on, k-step kk + 2048 bytes), by 4 RS wgmmas m64n128k16.
template <bool BF16>
__global__ void pv_probe(const float* p_in, const unsigned short* v, float* o) {
    __shared__ __align__(1024) unsigned char tv[64 * 128 * 2];
    to_swizzled<64, 128>(tv, v);
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    float pf[32], d[64];
    for (int i = 0; i < 32; ++i) pf[i] = p_in[acc_row(i) * 64 + acc_col(i)];
    for (int i = 0; i < 64; ++i) d[i] = 1e30f;
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
    for (int kk = 0; kk < 4; ++kk) {
        unsigned a[4];
        for (int j = 0; j < 4; ++j) {
            const float lo = pf[8 * kk + 2 * j], hi = pf[8 * kk + 2 * j + 1];
            if (BF16) {
                __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
                a[j] = *(unsigned*)&h;
            } else {
                half2 h = __floats2half2_rn(lo, hi);
                a[j] = *(unsigned*)&h;
            }
        }
        const unsigned long long db = desc_sw128(tv + kk * 2048, 64 * 128);
        const int accumulate = kk > 0;  // (the first ignores d's garbage)
        if (BF16) RS128("bf16"); else RS128("f16");
    }
    wg_done();
    for (int i = 0; i < 64; ++i) o[acc_row(i) * 128 + acc_col(i)] = d[i];
}
""".replace("R32", '"' + _registers(32) + '"').replace("R64", '"' + _registers(64) + '"')


def _bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 to bfloat16 bits, nearest even (no NaNs here)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def _half_operand(x: np.ndarray, bf16: bool):
    """(the bits the kernel reads, their values in float64)."""
    if bf16:
        bits = _bf16_bits(x)
        return bits, (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    half = x.astype(np.float16)
    return half.view(np.uint16), half.astype(np.float64)


@pytest.mark.parametrize("bf16", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_wgmma_k16_reads_128_byte_swizzled_k_major_tiles(bf16, D):
    """S = Q K^T by D / 16 SS wgmmas (float16 or bfloat16, K-major, 128-byte swizzle: one or
    two 64-column chunks) against NumPy: the products exact, summed into float32."""
    rng = np.random.default_rng(D + bf16)
    (q, qv), (k, kv) = (_half_operand(rng.standard_normal((64, D)), bf16) for _ in range(2))
    s = np.full((64, 64), np.nan, np.float32)
    _kernel(HALF_PROBES, f"qk_probe<{str(bf16).lower()}, {D}, 0>", "sm_90a").run(128, [q, k, s])
    np.testing.assert_allclose(s, qv @ kv.T, rtol=0, atol=2e-6 * np.abs(qv @ kv.T).max())


def test_a_swizzled_tile_off_a_1024_byte_boundary_reads_what_the_hardware_reads():
    """K's tile 512 bytes past a 1024 boundary: the swizzle XORs the address's bits 7-9 (rows
    4 on, for row 0), so every row's 16-byte groups are read from the group 4 away (columns
    c ^ 32 of each 64) - not Q K^T, as the hardware's XOR of address bits gives."""
    rng = np.random.default_rng(11)
    (q, qv), (k, kv) = (_half_operand(rng.standard_normal((64, 64)), False) for _ in range(2))
    s = np.full((64, 64), np.nan, np.float32)
    _kernel(HALF_PROBES, "qk_probe<false, 64, 512>", "sm_90a").run(128, [q, k, s])
    permuted = kv[:, np.arange(64) ^ 32]
    np.testing.assert_allclose(s, qv @ permuted.T, rtol=0, atol=2e-6 * np.abs(qv @ permuted.T).max())
    assert np.abs(s - qv @ kv.T).max() > 1


@pytest.mark.parametrize("bf16", [False, True])
def test_wgmma_k16_from_registers_times_an_mn_major_swizzled_tile(bf16):
    """O = P V by 4 RS wgmmas m64n128k16: P packed in-thread from float32 (cvt.rn to float16
    or bfloat16, the first source the upper half), V row-major (MN-major, trans-b 1, two
    64-column chunks a leading byte offset apart); the first wgmma's scale-d 0 drops the
    accumulators' garbage."""
    rng = np.random.default_rng(5 + bf16)
    p = rng.standard_normal((64, 64)).astype(np.float32)
    _, pv = _half_operand(p, bf16)
    v, vv = _half_operand(rng.standard_normal((64, 128)), bf16)
    o = np.full((64, 128), np.nan, np.float32)
    _kernel(HALF_PROBES, f"pv_probe<{str(bf16).lower()}>", "sm_90a").run(128, [p, v, o])
    np.testing.assert_allclose(o, pv @ vv, rtol=0, atol=2e-6 * np.abs(pv @ vv).max())


TMA_PROBE = r"""
struct alignas(64) TmaMap {
    unsigned long long w[16];
};
struct TmaMaps {
    TmaMap x, o;
};
// Two boxes {64 columns, 64 rows} of x at (row, head, batch 0) into 128-byte swizzled shared
// memory, by warp 0's elected lane, on one mbarrier expecting ``expect`` bytes (expect_tx,
// then arrive.expect_tx of 8192); every thread waits, then copies the tile out byte for
// byte; (store) thread 0 stores the tile to o at the same coordinates.
extern "C" __global__ void tma_probe(const __grid_constant__ TmaMaps m, unsigned char* out, int row, int head,
                                     int expect, int store) {
    __shared__ __align__(1024) unsigned char s[16384];
    __shared__ __align__(8) unsigned long long bar;
    const unsigned b = __cvta_generic_to_shared(s), br = __cvta_generic_to_shared(&bar);
    if (threadIdx.x == 0) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(br));
        asm volatile("fence.mbarrier_init.release.cluster;");
    }
    __syncthreads();
    if (threadIdx.x < 32) {
        unsigned elected;
        asm volatile("{\n.reg .pred e;\nelect.sync _|e, 0xffffffff;\nselp.u32 %0, 1, 0, e;\n}" : "=r"(elected));
        if (elected) {
            asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(br), "r"(expect - 8192));
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(br), "r"(8192));
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes"
                " [%0], [%1, {%2, %3, %4, %5}], [%6];" ::"r"(b), "l"(&m.x), "r"(0), "r"(row), "r"(head), "r"(0),
                "r"(br) : "memory");
            asm volatile(
                "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                " [%0], [%1, {%2, %3, %4, %5}], [%6], %7;" ::"r"(b + 8192), "l"(&m.x), "r"(64), "r"(row),
                "r"(head), "r"(0), "r"(br), "l"(0x14F0000000000000ull) : "memory");
        }
    }
    unsigned ok = 0;
    while (!ok)
        asm volatile(
            "{\n.reg .pred P;\nmbarrier.try_wait.parity.shared::cta.b64 P, [%1], 0, 1000000;\n"
            "selp.u32 %0, 1, 0, P;\n}" : "=r"(ok) : "r"(br) : "memory");
    for (int i = threadIdx.x; i < 16384; i += blockDim.x) out[i] = s[i];
    if (store && threadIdx.x == 0) {
        for (int c = 0; c < 2; ++c)
            asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];"
                         ::"l"(&m.o), "r"(64 * c), "r"(row), "r"(head), "r"(0), "r"(b + 8192 * c) : "memory");
        asm volatile("cp.async.bulk.commit_group;" ::: "memory");
        asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
    }
}
"""


def _tma_run(row, expect=16384, store=0):
    from _ptx_emulator import tensor_map

    x = np.random.default_rng(1).standard_normal((2, 50, 3, 128)).astype(np.float16)
    o = np.full_like(x, 7)  # (what the store leaves alone stays 7)
    out = np.zeros(16384, np.uint8)
    maps = np.concatenate([tensor_map(x, 64), tensor_map(o, 64)])  # (the struct's bytes)
    _kernel(TMA_PROBE, "tma_probe", "sm_90a").run(128, [maps, out, row, 1, expect, store])
    return x, o, out.view(np.uint16)


@pytest.mark.parametrize("row", [10, -8])
def test_a_tensor_copy_writes_its_box_swizzled_with_zeros_outside_and_stores_it_back_clipped(row):
    """What an H100 gave for a driver map (SWIZZLE_128B) in a probe like this: element (r, c) of the box at
    (c / 64) 8192 + r 128 + ((c % 64 / 8) ^ (r % 8)) 16 + (c % 8) 2, rows outside the tensor
    (past its end, before its start) zeros; the store writes back only rows inside it."""
    x, o, tile = _tma_run(row, store=1)
    r, c = np.meshgrid(np.arange(64), np.arange(128), indexing="ij")
    inside = (row + r >= 0) & (row + r < 50)
    want = np.zeros(8192, np.uint16)
    want[((c // 64) * 8192 + r * 128 + ((c % 64 // 8) ^ (r % 8)) * 16 + (c % 8) * 2) // 2] = np.where(
        inside, x[0, np.clip(row + r, 0, 49), 1, c].view(np.uint16), 0
    )
    np.testing.assert_array_equal(tile, want)
    assert (tile.reshape(2, 64, 64) != 0).any(axis=(0, 2)).sum() == inside[:, 0].sum()
    stored = np.full_like(x, 7)
    rows = slice(max(row, 0), row + 64)
    stored[0, rows, 1] = x[0, rows, 1]
    np.testing.assert_array_equal(o.view(np.uint16), stored.view(np.uint16))


def test_a_phase_expecting_more_bytes_than_its_copies_bring_never_completes():
    with pytest.raises(DeadlockError, match="mbarrier.try_wait"):
        _tma_run(10, expect=16384 + 16)


CONVERT_PROBE = r"""
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// float32 to float16 and bfloat16 and back, one value and a pair (the pair's halves
// swapped back out through 16-bit stores), 16-bit loads.
extern "C" __global__ void convert_probe(const float* x, const unsigned short* h, const unsigned short* b,
                                         unsigned short* to_h, unsigned short* to_b, unsigned short* pairs,
                                         float* back) {
    const int t = threadIdx.x;
    const __half hx = __float2half_rn(x[t]);
    const __nv_bfloat16 bx = __float2bfloat16_rn(x[t]);
    to_h[t] = *(const unsigned short*)&hx;
    to_b[t] = *(const unsigned short*)&bx;
    const half2 hp = __floats2half2_rn(x[t], -x[t]);
    const __nv_bfloat162 bp = __floats2bfloat162_rn(x[t], -x[t]);
    pairs[4 * t] = *(const unsigned short*)&hp.y;
    pairs[4 * t + 1] = *(const unsigned short*)&hp.x;
    pairs[4 * t + 2] = *(const unsigned short*)&bp.y;
    pairs[4 * t + 3] = *(const unsigned short*)&bp.x;
    back[2 * t] = __half2float(*(const __half*)(h + t));
    back[2 * t + 1] = __bfloat162float(*(const __nv_bfloat16*)(b + t));
}
"""


def test_half_conversions_round_to_nearest_even_and_widen_exactly():
    n = 64
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(n) * 2.0 ** rng.integers(-30, 20, n)).astype(np.float32)
    # ties of float16 (1 + 2^-11 (2k + 1)), of bfloat16, a float16 subnormal, overflows
    x[:4] = np.float32([1 + 2**-11, 1 + 3 * 2**-11, 1 + 2**-8, 1 + 3 * 2**-8])
    x[4:8] = np.float32([3e-6, 70000.0, -3.4e38, 65520.0])
    h = rng.integers(0, 2**16, n, dtype=np.uint16)
    h[(h & 0x7C00) == 0x7C00] = 0x3C00  # (no infinities or NaNs)
    b = rng.integers(0, 2**16, n, dtype=np.uint16)
    b[(b & 0x7F80) == 0x7F80] = 0x3F80
    to_h, to_b, pairs = np.zeros(n, np.uint16), np.zeros(n, np.uint16), np.zeros(4 * n, np.uint16)
    back = np.full(2 * n, np.nan, np.float32)
    _kernel(CONVERT_PROBE, "convert_probe").run(n, [x, h, b, to_h, to_b, pairs, back])
    with np.errstate(over="ignore"):
        want_h, want_nh = x.astype(np.float16).view(np.uint16), (-x).astype(np.float16).view(np.uint16)
    want_b, want_nb = _bf16_bits(x), _bf16_bits(-x)
    assert list(want_h[:2]) == [0x3C00, 0x3C02] and list(want_b[2:4]) == [0x3F80, 0x3F82]  # (to even)
    assert (want_h[6], want_b[6], want_h[7]) == (0xFC00, 0xFF80, 0x7C00)  # (past the largest: infinities)
    np.testing.assert_array_equal(to_h, want_h)
    np.testing.assert_array_equal(to_b, want_b)
    np.testing.assert_array_equal(pairs.reshape(n, 4), np.stack([want_nh, want_h, want_nb, want_b], axis=1))
    np.testing.assert_array_equal(back[0::2], h.view(np.float16).astype(np.float32))
    np.testing.assert_array_equal(back[1::2], (b.astype(np.uint32) << 16).view(np.float32))


CP_ASYNC_PROBE = r"""
#include "mma.cuh"
using namespace cupyattn;
// Each thread copies 16 bytes (src_bytes of them, zeros after) to its slot of shared memory
// by cp.async, in two groups (slots t, then n + t); waits (WAIT: wait_group WAIT, 2:
// wait_all, -1: not at all), passes a barrier and reads its neighbour's slot of group GROUP
// (-1: none).
template <int WAIT, int GROUP>
__global__ void cp_async_probe(const uint4* in, uint4* out, int src_bytes) {
    __shared__ __align__(16) uint4 slots[2 * 64];
    const int t = threadIdx.x, n = blockDim.x;
    for (int g = 0; g < 2; ++g) {
        cp_async_16(slots + g * n + t, in + g * n + t, src_bytes);
        cp_async_commit();
    }
    if (WAIT == 0 || WAIT == 1) cp_async_wait<WAIT>();
    if (WAIT == 2) asm volatile("cp.async.wait_all;" ::: "memory");
    __syncthreads();
    if (GROUP >= 0) out[t] = slots[GROUP * n + (t + 1) % n];
    if (WAIT >= 0) cp_async_wait<0>();
}
"""


@pytest.mark.parametrize("wait,group", [(0, 1), (1, 0), (2, 1)])
@pytest.mark.parametrize("src_bytes", [16, 4, 0])
def test_a_cp_async_lands_by_the_wait_that_completes_its_group(wait, group, src_bytes):
    """16-byte copies, the bytes past src_bytes zeros, read across a barrier after a wait that
    completes their group (wait_group 0, wait_group 1 for the older group, wait_all)."""
    n = 64
    words = _random_words(2 * n * 4, src_bytes).reshape(2 * n, 4)
    out = np.zeros((n, 4), np.uint32)
    _kernel(CP_ASYNC_PROBE, f"cp_async_probe<{wait}, {group}>").run(n, [words, out, src_bytes])
    want = words[group * n + (np.arange(n) + 1) % n].copy()
    want[:, src_bytes // 4 :] = 0
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("wait,group", [(1, 1), (-1, 0)])
def test_a_cp_async_read_before_the_wait_that_completes_it_is_a_race(wait, group):
    """The newest group past wait_group 1, or no wait at all: its words are in flight when the
    neighbour reads them, barrier or not."""
    n = 64
    words, out = _random_words(2 * n * 4, 1).reshape(2 * n, 4), np.zeros((n, 4), np.uint32)
    with pytest.raises(RaceError, match="cp.async to it is in flight"):
        _kernel(CP_ASYNC_PROBE, f"cp_async_probe<{wait}, {group}>").run(n, [words, out, 16])


CP_ASYNC_OVERWRITE_PROBE = r"""
#include "mma.cuh"
using namespace cupyattn;
// Each thread reads its neighbour's slot, then copies new bytes into its own by cp.async,
// with a barrier between (EARLY) or only between the copy's issue and its wait.
template <bool EARLY>
__global__ void cp_async_overwrite_probe(const uint4* in, uint4* out) {
    __shared__ __align__(16) uint4 slots[64];
    const int t = threadIdx.x, n = blockDim.x;
    slots[t] = in[t];
    __syncthreads();
    out[t] = slots[(t + 1) % n];
    if (EARLY) __syncthreads();
    cp_async_16(slots + t, in + n + t, 16);
    cp_async_commit();
    if (!EARLY) __syncthreads();
    cp_async_wait<0>();
    __syncthreads();
    out[n + t] = slots[(t + 1) % n];
}
"""


def test_a_cp_async_issued_over_a_word_another_thread_may_still_read_is_a_race():
    """Its bytes may land as soon as it is issued: a barrier between the issue and the wait
    comes too late for the neighbour's read (it would order that read before the landing,
    not before the copy)."""
    n = 64
    words, out = _random_words(2 * n * 4, 3).reshape(2 * n, 4), np.zeros((2 * n, 4), np.uint32)
    _kernel(CP_ASYNC_OVERWRITE_PROBE, "cp_async_overwrite_probe<true>").run(n, [words, out])
    np.testing.assert_array_equal(out, np.concatenate([np.roll(words[:n], -1, 0), np.roll(words[n:], -1, 0)]))
    with pytest.raises(RaceError, match="unordered"):
        _kernel(CP_ASYNC_OVERWRITE_PROBE, "cp_async_overwrite_probe<false>").run(n, [words, out])


def test_a_thread_that_ends_with_a_cp_async_no_wait_completed_is_an_error():
    n = 64
    words, out = _random_words(2 * n * 4, 2).reshape(2 * n, 4), np.zeros((n, 4), np.uint32)
    with pytest.raises(RaceError, match="cp.async copies that no wait completed"):
        _kernel(CP_ASYNC_PROBE, "cp_async_probe<-1, -1>").run(n, [words, out, 16])


LDMATRIX_PROBE = r"""
// ldmatrix .xN (.trans) of 8 x 8 b16 matrices: 32 rows of 8 b16 from global memory, row r
// at the 16-byte slot 31 - r of a shared tile (reversed: the lanes' addresses place the
// rows), written by warp WRITER (1: across a barrier, or not with SYNC false) but for row
// SKIP; lane l gives row l's address (matrix l / 8, row l % 8; past the N matrices an
// address outside shared memory) and stores the N words it receives. GENERIC: the row
// addresses as generic pointers (ldmatrix without .shared).
template <int N, bool TRANS, bool GENERIC = false, int WRITER = 0, bool SYNC = true, int SKIP = -1>
__global__ void ldmatrix_probe(const uint4* in, unsigned* out) {
    __shared__ __align__(16) uint4 tile[32];
    const int lane = threadIdx.x % 32;
    if (threadIdx.x / 32 == WRITER && lane != SKIP) tile[31 - lane] = in[lane];
    if (SYNC) __syncthreads();
    if (threadIdx.x >= 32) return;
    const unsigned at = lane < 8 * N ? (unsigned)__cvta_generic_to_shared(tile + 31 - lane) : 1u << 20;
    const unsigned long long p = (unsigned long long)(tile + 31 - lane);
    unsigned r[4] = {0, 0, 0, 0};
#define LDM(X, T, S, R, A, ...) asm volatile("ldmatrix.sync.aligned.m8n8." X T S ".b16 " R ", [%" #A "];" : __VA_ARGS__)
    if (GENERIC)
        LDM("x4", "", "", "{%0, %1, %2, %3}", 4, "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "l"(p));
    else if (N == 1 && !TRANS) LDM("x1", "", ".shared", "{%0}", 1, "=r"(r[0]) : "r"(at));
    else if (N == 1) LDM("x1", ".trans", ".shared::cta", "{%0}", 1, "=r"(r[0]) : "r"(at));
    else if (N == 2 && !TRANS) LDM("x2", "", ".shared", "{%0, %1}", 2, "=r"(r[0]), "=r"(r[1]) : "r"(at));
    else if (N == 2) LDM("x2", ".trans", ".shared", "{%0, %1}", 2, "=r"(r[0]), "=r"(r[1]) : "r"(at));
    else if (!TRANS)
        LDM("x4", "", ".shared", "{%0, %1, %2, %3}", 4, "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(at));
    else
        LDM("x4", ".trans", ".shared", "{%0, %1, %2, %3}", 4, "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
            : "r"(at));
    for (int j = 0; j < N; ++j) out[lane * N + j] = r[j];
}
"""


def _ldmatrix_words(rows: np.ndarray, n: int, trans: bool) -> np.ndarray:
    """[lane, matrix] words lane l receives of n 8 x 8 b16 matrices (``rows``: 32 x 8 uint16,
    matrix j its rows 8j..8j+7): the PTX ISA's fragment, (row l / 4, columns 2 (l % 4) and
    2 (l % 4) + 1), the first in the lower half; .trans reads each matrix transposed."""
    lane = np.arange(32)
    words = np.zeros((32, n), np.uint32)
    for j in range(n):
        m = rows[8 * j : 8 * j + 8].astype(np.uint32)
        if trans:
            m = m.T
        words[:, j] = m[lane // 4, 2 * (lane % 4)] | m[lane // 4, 2 * (lane % 4) + 1] << np.uint32(16)
    return words


@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("n", [1, 2, 4])
def test_ldmatrix_hands_each_lane_its_words_of_the_rows_the_lanes_address(n, trans):
    """ldmatrix .x1 / .x2 / .x4 (.trans) against the ISA's fragment built in NumPy; the lanes
    past the N matrices give addresses outside shared memory, which must go unread."""
    rows = _random_words(32 * 4, 10 * n + trans).view(np.uint16).reshape(32, 8)
    out = np.zeros(32 * n, np.uint32)
    _kernel(LDMATRIX_PROBE, f"ldmatrix_probe<{n}, {str(trans).lower()}>").run(32, [rows, out])
    np.testing.assert_array_equal(out.reshape(32, n), _ldmatrix_words(rows, n, trans))
    # (a layout read the other way round would fail: the two differ)
    assert (out.reshape(32, n) != _ldmatrix_words(rows, n, not trans)).mean() > 0.9


def test_ldmatrix_of_generic_addresses_and_its_rows_in_the_bank_wavefronts():
    """ldmatrix without .shared takes generic addresses; each matrix's 8 rows are one
    128-byte phase (the tile's 16-byte rows in 8 bank groups: 4 wavefronts for .x4)."""
    rows = _random_words(32 * 4, 3).view(np.uint16).reshape(32, 8)
    out, wavefronts = np.zeros(32 * 4, np.uint32), {}
    _kernel(LDMATRIX_PROBE, "ldmatrix_probe<4, false, true>").run(32, [rows, out], wavefronts=wavefronts)
    np.testing.assert_array_equal(out.reshape(32, 4), _ldmatrix_words(rows, 4, False))
    assert [runs for s, runs in wavefronts.items() if s.startswith("ldmatrix")] == [[4]]


def test_ldmatrix_rows_are_shared_loads_checked_for_races_and_uninitialized_words():
    rows = _random_words(32 * 4, 4).view(np.uint16).reshape(32, 8)
    out = np.zeros(32 * 4, np.uint32)
    _kernel(LDMATRIX_PROBE, "ldmatrix_probe<4, true, false, 1>").run(64, [rows, out])
    np.testing.assert_array_equal(out.reshape(32, 4), _ldmatrix_words(rows, 4, True))
    with pytest.raises(RaceError, match="unordered"):  # warp 1 stores the rows, no barrier
        _kernel(LDMATRIX_PROBE, "ldmatrix_probe<4, true, false, 1, false>").run(64, [rows, out])
    with pytest.raises(UninitializedError, match="nothing stored it"):  # row 5 at slot 26
        _kernel(LDMATRIX_PROBE, "ldmatrix_probe<4, false, false, 0, true, 5>").run(32, [rows, out])


MMA_SYNC_PROBE = r"""
// One mma.sync of a warp on its registers as given: lane l's A words a[4l..4l+3], B words
// b[2l..2l+1], C c[4l..4l+3]; d[4l..4l+3] gets its D.
#define MMA(SHAPE, TY)                                                                            \
    asm volatile("mma.sync.aligned." SHAPE ".row.col.f32." TY "." TY ".f32 {%0, %1, %2, %3}, "    \
                 "{%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};"                              \
                 : "=f"(d[4 * l]), "=f"(d[4 * l + 1]), "=f"(d[4 * l + 2]), "=f"(d[4 * l + 3])     \
                 : "r"(a[4 * l]), "r"(a[4 * l + 1]), "r"(a[4 * l + 2]), "r"(a[4 * l + 3]),        \
                   "r"(b[2 * l]), "r"(b[2 * l + 1]), "f"(c[4 * l]), "f"(c[4 * l + 1]),            \
                   "f"(c[4 * l + 2]), "f"(c[4 * l + 3]))
template <int KIND>  // 0: float16, 1: bfloat16, 2: TF32
__global__ void mma_sync_probe(const unsigned* a, const unsigned* b, const float* c, float* d) {
    const int l = threadIdx.x;
    if (KIND == 0) MMA("m16n8k16", "f16");
    if (KIND == 1) MMA("m16n8k16", "bf16");
    if (KIND == 2) MMA("m16n8k8", "tf32");
}
// An mma.sync the emulator leaves out (float16 accumulators).
__global__ void mma_f16_probe(const unsigned* a, unsigned* d) {
    const int l = threadIdx.x;
    unsigned x, y;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f16.f16.f16.f16 {%0, %1}, {%2, %2, %2, %2}, {%2, %2}, {%2, %2};"
                 : "=r"(x), "=r"(y) : "r"(a[l]));
    d[2 * l] = x;
    d[2 * l + 1] = y;
}
"""


def _mma_fragments(a_bits: np.ndarray, b_bits: np.ndarray, kind: str):
    """Lanes' A and B words of the PTX ISA's m16n8k16 (16-bit: a_bits 16 x 16, b_bits 16 x 8
    of uint16) or m16n8k8 (TF32: 16 x 8, 8 x 8 of uint32) fragments, with g = l / 4, t = l % 4:
    16-bit A word i row g + 8 (i % 2), columns 2t + 8 (i / 2) (the lower half) and the next;
    B word i rows 2t + 8i and the next, column g. TF32: A word i row g + 8 (i % 2), column
    t + 4 (i / 2); B word i row t + 4i, column g."""
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    a, b = np.zeros((32, 4), np.uint32), np.zeros((32, 2), np.uint32)
    for i in range(4):
        if kind == "tf32":
            a[:, i] = a_bits[g + 8 * (i % 2), t + 4 * (i // 2)]
        else:
            row, col = g + 8 * (i % 2), 2 * t + 8 * (i // 2)
            a[:, i] = a_bits[row, col].astype(np.uint32) | a_bits[row, col + 1].astype(np.uint32) << 16
    for i in range(2):
        if kind == "tf32":
            b[:, i] = b_bits[t + 4 * i, g]
        else:
            row = 2 * t + 8 * i
            b[:, i] = b_bits[row, g].astype(np.uint32) | b_bits[row + 1, g].astype(np.uint32) << 16
    return a, b


def _mma_d(d: np.ndarray) -> np.ndarray:
    """[lane, e] of a 16 x 8 float32 C / D: row g + 8 (e / 2), column 2t + e % 2."""
    lane, e = np.arange(32)[:, None], np.arange(4)[None, :]
    return d[lane // 4 + 8 * (e // 2), 2 * (lane % 4) + e % 2]


@pytest.mark.parametrize("kind", ["f16", "bf16", "tf32"])
def test_mma_sync_multiplies_the_isa_s_fragments_and_adds_c(kind):
    """D = A B + C of one m16n8k16 (float16, bfloat16) or m16n8k8 (TF32) mma.sync, the lanes'
    registers built from A, B and C in NumPy by the ISA's fragment layouts: products exact,
    summed and added to C in float64 and rounded once (TF32: each operand's top 19 bits,
    the low 13 random). A's words 1 and 2 taken the other way round would not match."""
    rng = np.random.default_rng(["f16", "bf16", "tf32"].index(kind))
    k = 8 if kind == "tf32" else 16
    x, y = rng.standard_normal((16, k)), rng.standard_normal((k, 8))
    if kind == "tf32":
        (a_bits, av), (b_bits, bv) = (
            (bits, (bits & np.uint32(0xFFFFE000)).view(np.float32).astype(np.float64))
            for bits in (z.astype(np.float32).view(np.uint32) for z in (x, y))
        )
        assert (a_bits & 0x1FFF).any()  # (bits the tensor cores drop)
    else:
        (a_bits, av), (b_bits, bv) = (_half_operand(z, kind == "bf16") for z in (x, y))
    c = rng.standard_normal((16, 8)).astype(np.float32)
    a, b = _mma_fragments(a_bits, b_bits, kind)
    d = np.full((32, 4), np.nan, np.float32)
    _kernel(MMA_SYNC_PROBE, f"mma_sync_probe<{['f16', 'bf16', 'tf32'].index(kind)}>").run(
        32, [a, b, _mma_d(c).astype(np.float32), d]
    )
    want = (av @ bv + c).astype(np.float32)
    np.testing.assert_array_equal(d, _mma_d(want))
    swapped = av.copy()  # A's words 1 and 2 read the other way round (rows g + 8 for columns + k/2)
    swapped[:8, k // 2 :], swapped[8:, : k // 2] = av[8:, : k // 2], av[:8, k // 2 :]
    assert np.abs(d - _mma_d(swapped @ bv + c)).max() > 0.5
    exact = _mma_d((x @ y + c).astype(np.float32))  # (unrounded operands: not what it computes)
    assert (d != exact).mean() > 0.5


def test_an_mma_sync_it_does_not_emulate_is_refused_by_name():
    with pytest.raises(NotImplementedError, match=r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f16"):
        _kernel(MMA_SYNC_PROBE, "mma_f16_probe").run(32, [np.zeros(32, np.uint32), np.zeros(64, np.uint32)])


TF32_PROBE = r"""
extern "C" __global__ void tf32_probe(const float* x, unsigned* out) {
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(out[threadIdx.x]) : "f"(x[threadIdx.x]));
}
"""


def test_tf32_rounding_is_to_nearest_ties_away_and_keeps_infinities_and_nans():
    """cvt.rna.tf32.f32 against reference.round_to (the low 13 bits of every result clear):
    ties away from zero, carries into the exponent and past the largest float to infinity;
    infinities and NaNs (the mma.sync backward's keys no row sees) kept, but for a NaN whose
    payload only the dropped bits hold."""
    from cupyattn.reference import round_to

    n = 64
    bits = np.random.default_rng(6).integers(0, 2**32, n, dtype=np.uint32)
    special = [0x3F801000, 0xBF803000, 0x3FFFF000, 0x7F7FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC01234]
    bits[(bits & 0x7F800000) == 0x7F800000] &= np.uint32(0xBFFFFFFF)  # (random ones finite)
    bits[: len(special)] = special  # ties, a carry, the largest float, infinities, NaNs
    x = bits.view(np.float32)
    out = np.zeros(n, np.uint32)
    _kernel(TF32_PROBE, "tf32_probe").run(n, [x, out])
    assert list(out[:8]) == [0x3F802000, 0xBF804000, 0x40000000, 0x7F800000, 0x7F800000, 0xFF800000] + [
        0x7FC00000,
        0xFFC00000,
    ]
    finite = np.isfinite(x)
    np.testing.assert_array_equal(out[finite], round_to(x, "tf32")[finite].view(np.uint32))
    with pytest.raises(NotImplementedError, match="cvt.rna.tf32.f32 of a NaN"):
        _kernel(TF32_PROBE, "tf32_probe").run(32, [np.uint32([0x7F800001] * 32).view(np.float32), out])
