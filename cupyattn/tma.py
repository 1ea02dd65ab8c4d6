"""TMA tensor maps (CUtensorMap) for the float16 / bfloat16 wgmma forward, encoded by the
CUDA driver's ``cuTensorMapEncodeTiled`` through ctypes (libcuda.so.1).

A map is rank 4 over a (B, S, H, D) array: dims {D, S, H, B} innermost first, byte strides
of S, H and B, box {64, rows, 1, 1} (a 64-column chunk of ``rows`` rows), 128-byte swizzle,
zeros outside the array (rows past S, columns past D). A forward kernel takes the three maps
of q, k and v as one ``TmaMaps`` struct by value (``TMA_MAPS``, kernels/wgmma_half.cuh), a
backward kernel those of q, k, v and dout (``BWD_TMA_MAPS``)."""

from __future__ import annotations

import ctypes
import functools

import numpy as np

_DATA_TYPES = {"float16": 6, "bfloat16": 9}  # CU_TENSOR_MAP_DATA_TYPE_FLOAT16 / _BFLOAT16
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_128B, _OOB_FILL_ZEROS = 0, 3, 2, 0
BOX_COLUMNS = 64  # 128 bytes of 16-bit elements: the widest box inner dim the 128-byte swizzle takes
MAX_STRIDE = 1 << 40

TMA_MAP = np.dtype((np.uint64, 16))
TMA_MAPS = np.dtype([("q", TMA_MAP), ("k", TMA_MAP), ("v", TMA_MAP)])
BWD_TMA_MAPS = np.dtype([("q", TMA_MAP), ("k", TMA_MAP), ("v", TMA_MAP), ("dout", TMA_MAP)])


class TmaUnavailableError(RuntimeError):
    """The CUDA driver (or its cuTensorMapEncodeTiled) cannot be loaded, or refused a map."""


def describable(x) -> bool:
    """Whether a TMA map can describe the (B, S, H, D) view ``x``: a 16-byte aligned base,
    the byte strides of its dims longer than 1 non-negative multiples of 16 below 2^40,
    each dim below 2^32 (a contiguous last dim is checked by the caller)."""
    if x.data.ptr % 16:
        return False
    if any(n >= 1 << 32 for n in x.shape):
        return False
    return all(st % 16 == 0 and 0 <= st < MAX_STRIDE for st, n in zip(x.strides[:3], x.shape[:3]) if n > 1)


@functools.cache
def _encode_fn():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        fn = lib.cuTensorMapEncodeTiled
    except (OSError, AttributeError) as exc:
        raise TmaUnavailableError(
            f"TMA maps need the CUDA driver's cuTensorMapEncodeTiled (libcuda.so.1, CUDA 12+): {exc}; "
            "plan without the 'wgmma_half' family (Policy(families=...)) to use the mma.sync kernels"
        ) from exc
    fn.argtypes = (
        [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4
    )
    fn.restype = ctypes.c_int
    return fn


def _strides_for_encoding(shape: tuple, strides: tuple, itemsize: int) -> tuple:
    """Byte strides of S, H, B (the map's dims 1-3) of a (B, S, H, D) array with byte strides
    ``strides`` (numpy's order): a dim of length 1 is never stepped, so its stride (any value
    in a view) is replaced by a valid one."""
    span = max([shape[3] * itemsize] + [st * n for st, n in zip(strides[:3], shape[:3]) if n > 1])
    valid = -(-span // 16) * 16
    b, s, h = (st if n > 1 else valid for st, n in zip(strides[:3], shape[:3]))
    return s, h, b


@functools.lru_cache(maxsize=1024)
def encode(ptr: int, shape: tuple, strides: tuple, box_rows: int, dtype: str) -> np.ndarray:
    """The 128 bytes of the map of a (B, S, H, D) array at ``ptr`` with byte ``strides``
    (cached by its arguments; read-only)."""
    B, S, H, D = shape
    itemsize = 2
    s, h, b = _strides_for_encoding(shape, strides, itemsize)
    u32, u64 = ctypes.c_uint32, ctypes.c_uint64
    out = (u64 * 16)()
    status = _encode_fn()(
        ctypes.byref(out),
        _DATA_TYPES[dtype],
        4,
        ctypes.c_void_p(ptr),
        (u64 * 4)(D, S, H, B),
        (u64 * 3)(s, h, b),
        (u32 * 4)(BOX_COLUMNS, box_rows, 1, 1),
        (u32 * 4)(1, 1, 1, 1),
        _INTERLEAVE_NONE,
        _SWIZZLE_128B,
        _L2_PROMOTION_128B,
        _OOB_FILL_ZEROS,
    )
    if status != 0:
        raise TmaUnavailableError(
            f"cuTensorMapEncodeTiled refused a {dtype} map of shape (B, S, H, D) = {shape}, byte strides "
            f"{strides[:3]}, box rows {box_rows} at {ptr:#x} (CUresult {status})"
        )
    words = np.frombuffer(bytes(out), dtype=np.uint64).copy()
    words.flags.writeable = False
    return words


def tensor_map(x, box_rows: int) -> np.ndarray:
    """The map of the (B, S, H, D) CuPy view ``x`` (float16 or bfloat16) with boxes of
    ``box_rows`` rows, as 16 uint64 words."""
    if not 1 <= box_rows <= 256:
        raise ValueError(f"box_rows: expected 1..256 (a TMA box dim), got {box_rows}")
    dtype = np.dtype(x.dtype).name
    if dtype not in _DATA_TYPES:
        raise TypeError(f"TMA maps here take float16 or bfloat16 arrays, got {dtype}")
    if not describable(x):
        raise ValueError(
            f"no TMA map describes this view (pointer {x.data.ptr:#x}, byte strides {x.strides}): it needs a "
            "16-byte aligned base and byte strides that are non-negative multiples of 16"
        )
    return encode(int(x.data.ptr), tuple(int(n) for n in x.shape), tuple(int(s) for s in x.strides), box_rows, dtype)
