"""The public entry point: validate, plan, compile (cached), launch."""

from __future__ import annotations

import functools
import math
import numbers

import numpy as np

from .compile import get_kernel
from .device import current_device, smem_limit_from_env
from .plan import CXX_TYPES, MAX_HEAD_DIM, AttentionProblem, plan_forward
from .reference import causal_offset as _causal_offset

LAYOUTS = ("bshd", "bhsd")


@functools.lru_cache(maxsize=None)
def _device_spec(device_id: int):
    return current_device(device_id)


def _dtype_name(x) -> str:
    return np.dtype(x.dtype).name


def _check_array(name: str, x):
    import cupy

    if isinstance(x, np.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray in GPU memory, got a numpy.ndarray "
                        f"(host memory); move it with cupy.asarray({name})")
    if not isinstance(x, cupy.ndarray):
        raise TypeError(f"{name}: expected a cupy.ndarray, got {type(x).__module__}.{type(x).__name__}")
    if x.ndim != 4:
        raise ValueError(f"{name}: expected 4 dimensions (batch, seqlen, heads, head_dim), "
                         f"got {x.ndim} with shape {tuple(x.shape)}")
    dtype = _dtype_name(x)
    if dtype not in CXX_TYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {dtype}")


def _to_bshd(x, layout):
    return x.transpose(0, 2, 1, 3) if layout == "bhsd" else x


def _check_last_dim_contiguous(name: str, x):
    if x.size > 0 and x.shape[-1] > 1 and x.strides[-1] != x.itemsize:
        raise ValueError(f"{name}: expected a contiguous last dimension (stride {x.itemsize} bytes), "
                         f"got stride {x.strides[-1]} bytes; pass {name}.copy() or a view with "
                         "contiguous rows")


def _elem_strides(x) -> tuple[int, int, int]:
    """(batch, seq, head) strides in elements of a (B, S, H, D) view."""
    return tuple(np.int64(s // x.itemsize) for s in x.strides[:3])


def _ptr(x):
    # Raw pointers: CuPy need not know the dtype (bfloat16 comes from ml_dtypes).
    return np.uint64(x.data.ptr)


def _zero_fill(x):
    x.view(f"u{x.itemsize}").fill(0)  # all-zero bits are 0.0 in every supported dtype


def _parse_scale(scale, head_dim: int) -> float:
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    if isinstance(scale, bool) or not isinstance(scale, numbers.Real) or not math.isfinite(scale):
        raise ValueError(f"scale: expected a finite real number, got {scale!r}")
    return float(scale)


def attention(q, k, v, *, causal=False, scale=None, return_lse=False, out=None,
              layout="bshd", smem_limit=None):
    """Exact attention ``softmax(scale * Q K^T) V`` with FlashAttention's tiled algorithm.

    Args:
        q: (B, Sq, Hq, D) CuPy array, float16, bfloat16 or float32; any strides
           with a contiguous last dimension (views of packed QKV work without copies).
        k: (B, Sk, Hkv, D), same dtype and device; Hq must be divisible by Hkv (GQA/MQA).
        v: (B, Sk, Hkv, Dv). Head dims 1..256.
        causal: False; True or "bottom_right" (query i sees key j iff j <= i + Sk - Sq,
           FlashAttention's convention); "top_left" (j <= i, PyTorch SDPA's is_causal).
        scale: softmax scale, default 1 / sqrt(D).
        return_lse: also return the log-sum-exp, (B, Hq, Sq) float32, natural log.
        out: optional output array, (B, Sq, Hq, Dv) in ``layout``, q's dtype, last
           dimension contiguous. Left untouched if validation fails.
        layout: "bshd" (default) or "bhsd" for (B, H, S, D) arrays; out follows it.
        smem_limit: plan as if a block could use at most this many bytes of shared
           memory (``CUPYATTN_SMEM_LIMIT`` in the environment does the same).

    A query row that sees no key gets out = 0 and lse = -inf.
    """
    import cupy

    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        _check_array(name, x)
    dtype = _dtype_name(q)
    for name, x in (("k", k), ("v", v)):
        if _dtype_name(x) != dtype:
            raise TypeError(f"{name}: expected dtype {dtype} (the dtype of q), got {_dtype_name(x)}")
        if x.device.id != q.device.id:
            raise ValueError(f"{name}: expected an array on device {q.device.id} (the device of q), "
                             f"got device {x.device.id}")
    qs, ks, vs = (_to_bshd(x, layout) for x in (q, k, v))
    B, Sq, Hq, D = qs.shape
    _, Sk, Hkv, Dv = vs.shape
    if ks.shape[0] != B or vs.shape[0] != B:
        raise ValueError(f"k, v: expected batch {B} (the batch of q), got k {ks.shape[0]}, v {vs.shape[0]}")
    if ks.shape[1] != Sk or ks.shape[2] != Hkv:
        raise ValueError(f"k, v: expected the same seqlen and heads, got k {tuple(k.shape)} "
                         f"and v {tuple(v.shape)} (layout {layout!r})")
    if ks.shape[3] != D:
        raise ValueError(f"k: expected head_dim {D} (the head_dim of q), got {ks.shape[3]}")
    for name, d in (("q", D), ("v", Dv)):
        if not 1 <= d <= MAX_HEAD_DIM:
            raise ValueError(f"{name}: expected head_dim 1..{MAX_HEAD_DIM}, got {d}")
    if (Hkv == 0 and Hq != 0) or (Hkv != 0 and Hq % Hkv != 0):
        raise ValueError(f"k, v: expected a number of heads that divides the {Hq} heads of q, got {Hkv}")
    for name, x in (("q", qs), ("k", ks), ("v", vs)):
        _check_last_dim_contiguous(name, x)
    offset = _causal_offset(causal, Sq, Sk)
    scale = _parse_scale(scale, D)

    out_shape = (B, Hq, Sq, Dv) if layout == "bhsd" else (B, Sq, Hq, Dv)
    if out is None:
        out = cupy.empty(out_shape, dtype=q.dtype)
    else:
        if not isinstance(out, cupy.ndarray):
            raise TypeError(f"out: expected a cupy.ndarray, got {type(out).__module__}.{type(out).__name__}")
        if tuple(out.shape) != out_shape:
            raise ValueError(f"out: expected shape {out_shape}, got {tuple(out.shape)}")
        if _dtype_name(out) != dtype:
            raise TypeError(f"out: expected dtype {dtype} (the dtype of q), got {_dtype_name(out)}")
        if out.device.id != q.device.id:
            raise ValueError(f"out: expected an array on device {q.device.id}, got device {out.device.id}")
        _check_last_dim_contiguous("out", out)
    lse = cupy.empty((B, Hq, Sq), dtype=cupy.float32)
    result = (out, lse) if return_lse else out
    if out.size == 0:
        return result
    if Sk == 0:  # no keys at all: every row sees none
        _zero_fill(out)
        lse.fill(-np.inf)
        return result

    with cupy.cuda.Device(q.device.id):
        spec = _device_spec(q.device.id)
        limit = smem_limit if smem_limit is not None else smem_limit_from_env()
        spec = spec.with_smem_limit(limit)
        problem = AttentionProblem(dtype, D, Dv, offset is not None, B, Hq, Hkv, Sq, Sk)
        plan = plan_forward(problem, spec)
        cfg = plan.config
        kernel = get_kernel(cfg, spec)
        os_ = _to_bshd(out, layout)
        num_m_tiles = -(-Sq // cfg.block_m)
        grid = (num_m_tiles * B * Hq,)
        if grid[0] >= 2**31:
            raise ValueError(f"q: {B} x {Hq} heads x {num_m_tiles} query tiles exceed the grid limit")
        log2e = 1.4426950408889634
        kernel(grid, (cfg.threads,), (
            _ptr(qs), _ptr(ks), _ptr(vs), _ptr(os_), _ptr(lse),
            *_elem_strides(qs), *_elem_strides(ks), *_elem_strides(vs), *_elem_strides(os_),
            np.int32(Hq), np.int32(Hkv), np.int32(Sq), np.int32(Sk), np.int32(D), np.int32(Dv),
            np.int32(num_m_tiles), np.float32(scale * log2e), np.int32(offset or 0),
        ), shared_mem=plan.smem_bytes)
    return result
