"""cupyattn from JAX: ``cupyattn.jax.attention``, differentiable through ``jax.custom_vjp``.

    import cupyattn.jax
    out = cupyattn.jax.attention(q, k, v, causal=True)            # jax.Arrays on a GPU
    dq, dk, dv = jax.grad(lambda q, k, v: cupyattn.jax.attention(q, k, v).sum(), (0, 1, 2))(q, k, v)

Arrays cross to CuPy and back through DLPack without copies. Synchronization is the
DLPack stream protocol's: CuPy asks JAX for each input on CuPy's current stream and
JAX makes that stream wait until the array is computed; JAX imports each result the
same way, so its later work waits for cupyattn's kernels. Nothing blocks the host.

Eager mode only. Under ``jax.jit`` (or any other tracing transformation that stages
the call, such as ``vmap``), q, k, v are tracers with no device memory behind them,
and XLA can only run foreign kernels inside a compiled program through an FFI custom
call (a C++ handler built against XLA's headers), which a pure-Python, NVRTC-compiled
library cannot register. Such calls raise a ``TypeError`` that says so. ``jax.grad``
and ``jax.vjp`` outside ``jit`` work: the forward rule saves the log-sum-exp, the
backward rule calls ``cupyattn.attention_backward``.

jax is imported here only, never by ``import cupyattn``.
"""

from __future__ import annotations

import functools

import jax

from . import api

__all__ = ["attention"]


def _to_cupy(name: str, x):
    import cupy

    if isinstance(x, jax.core.Tracer):
        raise TypeError(
            f"{name}: cupyattn.jax runs eagerly; it was called under a JAX transformation "
            "that traces (jax.jit, vmap, ...), where XLA could only call its CuPy kernels "
            "through an FFI custom call. Call it outside jax.jit."
        )
    return cupy.from_dlpack(x)


def _forward(q, k, v, causal, scale, layout, precision, policy):
    out, lse = api.attention(
        _to_cupy("q", q),
        _to_cupy("k", k),
        _to_cupy("v", v),
        causal=causal,
        scale=scale,
        layout=layout,
        precision=precision,
        policy=policy,
        return_lse=True,
    )
    return jax.dlpack.from_dlpack(out), jax.dlpack.from_dlpack(lse)


def attention(q, k, v, causal=False, scale=None, layout="bshd", precision=None, policy=None):
    """``softmax(scale * q k^T) v`` with cupyattn's kernels; arguments as ``cupyattn.attention``
    (layout "bshd" by default, "bhsd" for (B, H, S, D); ``precision`` for float32 inputs and
    ``policy``, a ``cupyattn.plan.Policy``, forward and backward alike). Returns a jax.Array."""
    if isinstance(precision, list):  # non-differentiable arguments must be hashable
        precision = tuple(precision)
    return _attention(q, k, v, causal, scale, layout, precision, policy)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _attention(q, k, v, causal, scale, layout, precision, policy):
    return _forward(q, k, v, causal, scale, layout, precision, policy)[0]


def _attention_fwd(q, k, v, causal, scale, layout, precision, policy):
    out, lse = _forward(q, k, v, causal, scale, layout, precision, policy)
    return out, (q, k, v, out, lse)


def _attention_bwd(causal, scale, layout, precision, policy, residuals, dout):
    q, k, v, out, lse = residuals
    grads = api.attention_backward(
        _to_cupy("dout", dout),
        *(_to_cupy(n, x) for n, x in zip(("q", "k", "v", "out", "lse"), (q, k, v, out, lse))),
        causal=causal,
        scale=scale,
        layout=layout,
        precision=precision,
        policy=policy,
    )
    return tuple(jax.dlpack.from_dlpack(g) for g in grads)


_attention.defvjp(_attention_fwd, _attention_bwd)
