"""cupyattn from JAX: ``cupyattn.jax.attention``, differentiable (``jax.custom_vjp``), under
``jax.jit``, ``jax.grad`` and ``jax.vmap`` alike.

    import cupyattn.jax
    out = cupyattn.jax.attention(q, k, v, causal=True)            # jax.Arrays on a GPU
    loss = jax.jit(lambda q, k, v: cupyattn.jax.attention(q, k, v, causal=True).sum())
    dq, dk, dv = jax.grad(loss, (0, 1, 2))(q, k, v)

Each pass is a ``jax.experimental.buffer_callback``: XLA allocates the results, and when the
program reaches the call it hands Python its device buffers and its stream; cupyattn launches
its kernels on that stream, writing the results in place. Nothing is copied and nothing
waits on the host; an eager call takes the same path (JAX compiles that one call once per
shape and options). Shapes, dtypes and options are checked when the call is traced, with
``cupyattn.attention``'s errors; the planner runs when XLA calls back, so its errors (a
policy that leaves no kernel, say) come inside JAX's runtime error. Under ``vmap`` the mapped
axes come first and fold into the batch axis (arguments not mapped are broadcast to it).

The workspace a pass needs beyond its results (the backward's delta, dQ's float32
accumulator, staged tiles) comes from CuPy's memory pool, beside JAX's own: leave it room
(``XLA_PYTHON_CLIENT_MEM_FRACTION`` below JAX's default 0.75, or
``XLA_PYTHON_CLIENT_PREALLOCATE=false``).

jax is imported here only, never by ``import cupyattn``.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import math

import jax
import numpy as np
from jax.experimental.buffer_callback import buffer_callback

from . import api
from .plan.policy import resolve_policy

__all__ = ["attention"]


def attention(q, k, v, causal=False, scale=None, layout="bshd", precision=None, policy=None, deterministic=True):
    """``softmax(scale * q k^T) v`` with cupyattn's kernels; arguments as ``cupyattn.attention``
    (layout "bshd" by default, "bhsd" for (B, H, S, D); ``precision`` for float32 inputs and
    ``policy``, a ``cupyattn.plan.Policy``, forward and backward alike; ``deterministic`` as
    ``cupyattn.attention_backward``'s). Returns a jax.Array."""
    if isinstance(precision, list):  # non-differentiable arguments must be hashable
        precision = tuple(precision)
    resolve_policy(policy)
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    for name, x in (("q", q), ("k", k), ("v", v)):
        placed = isinstance(x, jax.Array) and not isinstance(x, jax.core.Tracer)  # (a tracer is not placed yet)
        platforms = {d.platform for d in x.devices()} if placed else {"gpu"}
        if platforms != {"gpu"}:
            raise ValueError(f"{name}: expected an array on a CUDA GPU, got one on {', '.join(sorted(platforms))}")
    api.check_shapes(  # (under vmap, the shapes of one example)
        q.shape,
        k.shape,
        v.shape,
        tuple(np.dtype(x.dtype).name for x in (q, k, v)),
        causal=causal,
        scale=scale,
        layout=layout,
        precision=precision,
    )
    return _attention(q, k, v, causal, scale, layout, precision, policy, deterministic)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7, 8))
def _attention(q, k, v, causal, scale, layout, precision, policy, deterministic):
    return _forward(q, k, v, causal, scale, layout, precision, policy)[0]


def _forward(q, k, v, causal, scale, layout, precision, policy):
    out = jax.ShapeDtypeStruct(q.shape[:-1] + v.shape[-1:], q.dtype)
    B, a, b = q.shape[:3]
    lse = jax.ShapeDtypeStruct((B, a, b) if layout == "bhsd" else (B, b, a), np.float32)  # (B, Hq, Sq)
    run = _forward_callback(causal, scale, layout, precision, policy)
    return buffer_callback(run, (out, lse), vmap_method="broadcast_all")(q, k, v)


def _attention_fwd(q, k, v, causal, scale, layout, precision, policy, deterministic):
    out, lse = _forward(q, k, v, causal, scale, layout, precision, policy)
    return out, (q, k, v, out, lse)


def _attention_bwd(causal, scale, layout, precision, policy, deterministic, residuals, dout):
    q, k, v, out, lse = residuals
    grads = tuple(jax.ShapeDtypeStruct(x.shape, x.dtype) for x in (q, k, v))
    run = _backward_callback(causal, scale, layout, precision, policy, deterministic)
    return buffer_callback(run, grads, vmap_method="broadcast_all")(dout, q, k, v, out, lse)


# One callback per set of options: JAX caches a compiled eager call by its callback, among
# its other parameters, so a new closure each call would compile each call anew.
@functools.cache
def _forward_callback(causal, scale, layout, precision, policy):
    def run(ctx, results, q, k, v):
        out, lse = results
        with _on_xla_stream(ctx, q):
            fq, fk, fv, fout = _folded(q, k, v, out)
            api.attention(fq, fk, fv, out=fout, lse=_folded(lse, rank=3)[0], **options)

    options = dict(causal=causal, scale=scale, layout=layout, precision=precision, policy=policy)
    return run


@functools.cache
def _backward_callback(causal, scale, layout, precision, policy, deterministic):
    def run(ctx, results, dout, q, k, v, out, lse):
        dq, dk, dv = _folded(*results)
        with _on_xla_stream(ctx, q):
            arrays = (*_folded(dout, q, k, v, out), _folded(lse, rank=3)[0])
            api.attention_backward(*arrays, dq=dq, dk=dk, dv=dv, deterministic=deterministic, **options)

    options = dict(causal=causal, scale=scale, layout=layout, precision=precision, policy=policy)
    return run


_attention.defvjp(_attention_fwd, _attention_bwd)


class _Stream:
    """XLA's stream as the CUDA stream protocol has it (CuPy's ``Stream.from_external``)."""

    def __init__(self, pointer: int):
        self.pointer = pointer

    def __cuda_stream__(self):
        return (0, self.pointer)


@contextlib.contextmanager
def _on_xla_stream(ctx, buffer):
    """CuPy's device and current stream set to XLA's stream for this call."""
    import cupy

    device_type, device = buffer.__dlpack_device__()
    if device_type != _DLPACK_CUDA:
        raise ValueError(f"cupyattn.jax runs on CUDA GPUs; XLA gave it a buffer on DLPack device type {device_type}")
    with cupy.cuda.Device(device), cupy.cuda.Stream.from_external(_Stream(ctx.stream)):
        yield


_DLPACK_CUDA = 2


def _folded(*buffers, rank: int = 4):
    """Zero-copy CuPy views of XLA's buffers (row-major), the axes vmap adds in front of the
    last ``rank`` folded into the first of them (the batch)."""
    import cupy

    views = []
    for buffer in buffers:
        shape, dtype = tuple(buffer.shape), np.dtype(buffer.dtype)
        memory = cupy.cuda.UnownedMemory(
            _data_pointer(buffer), math.prod(shape) * dtype.itemsize, buffer, buffer.__dlpack_device__()[1]
        )
        view = cupy.ndarray(shape, dtype, cupy.cuda.MemoryPointer(memory, 0))
        if len(shape) > rank:
            leading = len(shape) - rank + 1
            view = view.reshape((math.prod(shape[:leading]),) + shape[leading:])
        views.append(view)
    return views


_capsule_name = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi)
)


def _data_pointer(buffer) -> int:
    """The device address of an XLA buffer, read from its DLPack capsule (any dtype, bfloat16
    included, where ``__cuda_array_interface__`` knows only some)."""
    capsule = buffer.__dlpack__()
    name = _capsule_name(capsule)
    # DLManagedTensorVersioned: version (8 bytes), manager_ctx, deleter, flags, then the DLTensor;
    # DLManagedTensor: the DLTensor first. A DLTensor: data, device, ndim, dtype, shape, strides,
    # byte_offset (at 40).
    tensor = _capsule_pointer(capsule, name) + {b"dltensor": 0, b"dltensor_versioned": 32}[name]
    data, byte_offset = ctypes.c_void_p.from_address(tensor).value, ctypes.c_uint64.from_address(tensor + 40).value
    return (data or 0) + byte_offset
