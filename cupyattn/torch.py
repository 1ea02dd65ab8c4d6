"""cupyattn from PyTorch: ``cupyattn.torch.attention``, differentiable, on torch's stream.

    import cupyattn.torch
    out = cupyattn.torch.attention(q, k, v, causal="top_left")  # q, k, v: CUDA tensors
    out.sum().backward()

q, k, v are CUDA tensors in SDPA's (B, H, S, D) layout (``layout="bhsd"``, the
default) or (B, S, H, D) (``layout="bshd"``); float16, bfloat16 or float32; Hq a
multiple of Hkv (GQA / MQA without repeating k and v). Nothing is copied: tensors
reach the kernels as zero-copy CuPy views (DLPack; bfloat16 through an int16 view),
outputs and gradients are allocated by torch's caching allocator and written in
place, and every kernel runs on ``torch.cuda.current_stream()``. The forward saves
q, k, v, out and the float32 log-sum-exp for the backward.

``causal`` has cupyattn's meaning: True or "bottom_right" (FlashAttention's
convention) or "top_left" (SDPA's ``is_causal``); the two agree when Sq == Sk.

torch is imported here only, never by ``import cupyattn``.
"""

from __future__ import annotations

import contextlib

import torch

from . import api
from .testing import bfloat16_dtype

__all__ = ["attention"]

_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _as_cupy(t: torch.Tensor):
    """A zero-copy CuPy view of a CUDA tensor (bfloat16 through its int16 bits, which any
    CuPy imports; the view gets ml_dtypes' bfloat16 dtype back)."""
    import cupy

    t = t.detach()  # a tensor that requires grad refuses DLPack export; same memory
    if t.dtype == torch.bfloat16:
        bf16 = bfloat16_dtype()
        if bf16 is None:
            raise RuntimeError("bfloat16 tensors need the ml_dtypes package (pip install ml_dtypes)")
        return cupy.from_dlpack(t.view(torch.int16)).view(bf16)
    return cupy.from_dlpack(t)


def _check(name: str, t, device=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the device of q), got {t.device}")


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


@contextlib.contextmanager
def _on_torch_stream(device: torch.device):
    """CuPy's device and current stream set to torch's current stream on ``device``."""
    import cupy

    stream = torch.cuda.current_stream(device)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol, where this torch has it
        cupy_stream = cupy.cuda.Stream.from_external(stream)
    else:
        cupy_stream = cupy.cuda.ExternalStream(stream.cuda_stream, device.index)
    with cupy.cuda.Device(device.index), cupy_stream:
        yield


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale, layout, precision, policy):
        q, k, v = (_rows_contiguous(x) for x in (q, k, v))
        out = torch.empty(q.shape[:-1] + v.shape[-1:], dtype=q.dtype, device=q.device)
        with _on_torch_stream(q.device):
            _, lse = api.attention(
                _as_cupy(q),
                _as_cupy(k),
                _as_cupy(v),
                causal=causal,
                scale=scale,
                layout=layout,
                precision=precision,
                policy=policy,
                out=_as_cupy(out),
                return_lse=True,
            )
            lse = torch.from_dlpack(lse)  # float32, (B, Hq, Sq); CuPy owns the memory
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, scale, layout, precision, policy)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, layout, precision, policy = ctx.options
        dout = _rows_contiguous(dout)
        dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
        with _on_torch_stream(q.device):
            api.attention_backward(
                _as_cupy(dout),
                _as_cupy(q),
                _as_cupy(k),
                _as_cupy(v),
                _as_cupy(out),
                _as_cupy(lse),
                causal=causal,
                scale=scale,
                layout=layout,
                precision=precision,
                policy=policy,
                dq=_as_cupy(dq),
                dk=_as_cupy(dk),
                dv=_as_cupy(dv),
            )
        return dq, dk, dv, None, None, None, None, None


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal=False,
    scale=None,
    layout: str = "bhsd",
    precision=None,
    policy=None,
) -> torch.Tensor:
    """``softmax(scale * q k^T) v`` through cupyattn's kernels, differentiable in q, k, v.

    Shapes (layout "bhsd", SDPA's): q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv);
    returns (B, Hq, Sq, Dv). With layout "bshd" the sequence and head axes swap.
    ``precision`` (float32 tensors: "fp32", "tf32", "bf16", "fp16" or a sequence of them;
    docs/precision.md) and ``policy`` (a ``cupyattn.plan.Policy``: the kernels the planner may
    choose) apply to the forward and the backward alike. Errors
    for shapes, dtypes and head dims are cupyattn's (see its README), raised before any
    launch.
    """
    _check("q", q)
    for name, t in (("k", k), ("v", v)):
        _check(name, t, q.device)
    return _Attention.apply(q, k, v, causal, scale, layout, precision, policy)
