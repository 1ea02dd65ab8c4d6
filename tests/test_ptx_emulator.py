"""_ptx_emulator, the CPU run of a probe kernel's PTX, against NumPy on kernels compiled
here by NVRTC: the integer arithmetic it emulates, shared memory across a barrier, races
between barriers, a refusal to run what it does not emulate; then wgmma_tiles.cuh's
shared-memory rearrangements (transpose_core_tile, zero_transposed_rows) as compiled,
on the CPU (the GPU tests run them inside the kernels)."""

import numpy as np
import pytest

from _probes import CORE_TILE_PROBES, compile_probe
from _ptx_emulator import PtxKernel, RaceError
from _tile_orders import core_offset, slot_row
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
// Each thread's word read back by its neighbour, with or without a barrier between.
template <bool SYNCED>
__global__ void neighbour_probe(int* out) {
    extern __shared__ int words[];
    words[threadIdx.x] = threadIdx.x;
    if (SYNCED) __syncthreads();
    out[threadIdx.x] = words[(threadIdx.x + 1) % blockDim.x];
}
"""

FLOAT_PROBE = r"""
extern "C" __global__ void float_probe(const float* in, float* out) { out[threadIdx.x] = in[threadIdx.x] * 3.0f; }
"""


def _kernel(source, name):
    _, ptx, entry = compile_probe(source, name)
    return PtxKernel(ptx, entry)


def _truncated(x, y):  # C's division and remainder of int32
    q = np.abs(x) // np.abs(y) * np.sign(x) * np.sign(y)
    return q, x - q * y


def test_integer_arithmetic_and_shared_memory_match_numpy():
    n = 64
    rng = np.random.default_rng(7)
    x = rng.integers(-2**31, 2**31, n, dtype=np.int64)
    y = rng.integers(-2**31, 2**31, n, dtype=np.int64)
    x[:4], y[:4] = [-7, 7, -2**31, 5], [2, -2, 3, -1]  # signs of division, the smallest int
    y[y == 0] = 1
    out = np.full(11 * n, 0x7FC00000, dtype=np.int32)  # poisoned
    wide = np.zeros(n, dtype=np.int64)
    _kernel(ARITHMETIC_PROBE, "arithmetic_probe").run(n, [np.concatenate([x, y]).astype(np.int32), out, wide],
                                                      n * 4)
    t = np.arange(n)
    ux, uy = x % 2**32, y % 2**32
    q, r = _truncated(x, y)
    want = np.stack([q, r, x >> (t % 32), ux >> (t % 32), np.minimum(x, y) - np.maximum(x, y),
                     np.where(x < y, x * 3, y - x), (x & ~0xF0) | ((y << 4) & 0xF0), ux // uy + ux % uy,
                     (x ^ y) + (x | y) * 5 - (x << (t % 8)), _truncated(x, 7)[0] + ux // 28, np.roll(x, -1)],
                    axis=1)
    np.testing.assert_array_equal(out.reshape(n, 11), ((want + 2**31) % 2**32 - 2**31).astype(np.int32))
    np.testing.assert_array_equal(wide, x * y)


def test_a_word_read_back_across_the_barrier_runs_and_without_it_is_a_race():
    out = np.zeros(96, dtype=np.int32)
    _kernel(NEIGHBOUR_PROBE, "neighbour_probe<true>").run(96, [out], 96 * 4)
    np.testing.assert_array_equal(out, np.roll(np.arange(96), -1))
    with pytest.raises(RaceError, match="since the last barrier"):
        _kernel(NEIGHBOUR_PROBE, "neighbour_probe<false>").run(96, [out], 96 * 4)


def test_what_it_does_not_emulate_is_refused_by_name():
    with pytest.raises(NotImplementedError, match="mul.f32|mul.rn.f32"):
        _kernel(FLOAT_PROBE, "float_probe").run(32, [np.ones(32, np.float32), np.zeros(32, np.float32)], 0)


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


@pytest.mark.parametrize("parts,rows,d_pad,from_row", [(2, 16, 256, 0), (2, 16, 256, 1), (2, 16, 256, 7),
                                                       (2, 16, 256, 9), (2, 16, 256, 16), (1, 64, 64, 40),
                                                       (1, 32, 96, 31)])
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
