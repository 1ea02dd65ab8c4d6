"""cupyattn from PyTorch: ``cupyattn.torch.attention``, differentiable, on torch's stream;
``cupyattn.torch.scaled_dot_product_attention``, SDPA's call.

    import cupyattn.torch
    out = cupyattn.torch.attention(q, k, v, causal="top_left")  # q, k, v: CUDA tensors
    out.sum().backward()

q, k, v are CUDA tensors in SDPA's (B, H, S, D) layout (``layout="bhsd"``, the
default) or (B, S, H, D) (``layout="bshd"``); float16, bfloat16 or float32; Hq a
multiple of Hkv (GQA / MQA without repeating k and v). Nothing is copied: tensors
reach the kernels as zero-copy CuPy views (DLPack; bfloat16 through an int16 view),
outputs, gradients and every buffer cupyattn needs on the way (lse, delta, dQ's float32
accumulator, staged tiles) come from torch's caching allocator, and every kernel runs on
``torch.cuda.current_stream()``. The forward saves q, k, v, out and the float32
log-sum-exp for the backward.

The forward and the backward are torch custom operators (``torch.ops.cupyattn.attention``,
``torch.ops.cupyattn.attention_backward``, with shape functions for tracing and an autograd
formula), so that ``torch.compile(model, fullgraph=True)`` keeps them in its graph and a
step may be captured into a CUDA graph once its kernels have compiled (after a first call).
Plain eager calls run the same work without the operators' Python dispatch, and a call
like an earlier one repeats its launch (the host time of a small call: BENCHMARKS.md).

``causal`` has cupyattn's meaning: True or "bottom_right" (FlashAttention's
convention) or "top_left" (SDPA's ``is_causal``); the two agree when Sq == Sk.

torch is imported here only, never by ``import cupyattn``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib

import torch
from torch.utils._python_dispatch import is_in_torch_dispatch_mode

from . import api
from .plan.policy import Policy
from .reference import causal_offset
from .testing import bfloat16_dtype

__all__ = ["attention", "register_transformers", "scaled_dot_product_attention"]

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


def _check(name: str, t, device=None, first: str = "q"):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__module__}.{type(t).__name__}")
    if not t.is_cuda and t.device.type != "meta":  # (meta: shapes only, for tracing)
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    if t.dtype not in _DTYPES:
        raise TypeError(f"{name}: expected dtype float16, bfloat16 or float32, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device} (the device of {first}), got {t.device}")


def _check_tensors(q, k, v, names=("q", "k", "v")):
    _check(names[0], q)
    for name, t in zip(names[1:], (k, v)):
        _check(name, t, q.device, names[0])


def _rows_contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.dim() == 0 or t.stride(-1) == 1 or t.shape[-1] == 1 else t.contiguous()


@contextlib.contextmanager
def _within_torch(device: torch.device):
    """CuPy's device and current stream set to torch's current stream on ``device``, and
    CuPy's allocations in this thread taken from torch's caching allocator (on that stream),
    so that a captured CUDA graph owns them as it owns torch's own."""
    import cupy

    stream = torch.cuda.current_stream(device)
    if hasattr(stream, "__cuda_stream__"):  # the CUDA stream protocol, where this torch has it
        cupy_stream = cupy.cuda.Stream.from_external(stream)
    else:
        cupy_stream = cupy.cuda.ExternalStream(stream.cuda_stream, device.index)

    def allocate(nbytes: int):
        block = torch.empty(nbytes, dtype=torch.uint8, device=device)
        return cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(block.data_ptr(), nbytes, block, device.index), 0)

    with cupy.cuda.Device(device.index), cupy_stream, cupy.cuda.using_allocator(allocate):
        yield


# The operators' arguments are tensors, numbers and strings: causal, precision and policy
# travel as strings and are read back here.
_CAUSAL = {"none": False, "bottom_right": True, "top_left": "top_left"}
_POLICIES: dict[str, Policy] = {}


def _causal_name(causal) -> str:
    causal_offset(causal, 1, 1)  # cupyattn's error for anything it does not take
    return "none" if causal is False or causal is None else "top_left" if causal == "top_left" else "bottom_right"


def _precision_name(precision) -> str | None:
    if precision is None or isinstance(precision, str):
        return precision
    modes = list(precision) if hasattr(precision, "__iter__") else None
    if not modes or not all(isinstance(m, str) and "," not in m for m in modes):
        raise ValueError(f"precision: expected None, a mode name or a sequence of them, got {precision!r}")
    return ",".join(modes)


def _policy(name: str | None) -> Policy | None:
    if name is not None and name not in _POLICIES:
        raise ValueError(f"policy: {name!r} names no policy given to cupyattn.torch in this process")
    return None if name is None else _POLICIES[name]


def _precision(name: str | None):
    return name if name is None or "," not in name else tuple(name.split(","))


def _api_options(causal: str, scale, layout: str, precision: str | None, policy: str | None) -> dict:
    """The operators' string-encoded options as cupyattn's keyword arguments."""
    if causal not in _CAUSAL:
        raise ValueError(f"causal: expected the operators' 'none', 'bottom_right' or 'top_left', got {causal!r}")
    return dict(
        causal=_CAUSAL[causal],
        scale=scale,
        layout=layout,
        smem_limit=None,
        precision=_precision(precision),
        policy=_policy(policy),
    )


def _policy_name(policy) -> str | None:
    if policy is None:
        return None
    if not isinstance(policy, Policy):
        raise TypeError(f"policy: expected a cupyattn.plan.Policy or None, got {type(policy).__name__}")
    # (frozensets sorted: their repr follows string hashes, so equal policies could print apart)
    fields = [(f.name, getattr(policy, f.name)) for f in dataclasses.fields(policy)]
    canonical = [(n, tuple(sorted(v)) if isinstance(v, frozenset) else v) for n, v in fields]
    name = hashlib.sha1(repr(canonical).encode()).hexdigest()[:16]
    _POLICIES.setdefault(name, policy)
    return name


def _lse_shape(q: torch.Tensor, layout: str) -> tuple[int, int, int]:
    B, a, b = q.shape[:3]
    return (B, a, b) if layout == "bhsd" else (B, b, a)  # (B, Hq, Sq)


def _describe(t: torch.Tensor) -> tuple:
    """What a forward launch depends on of one tensor (``api.forward_key``)."""
    return (t.shape, t.stride(), t.dtype, t.data_ptr() % 16 == 0, t.get_device())


def _raw_stream(device: torch.device) -> int:
    """torch's current stream on ``device`` as a CUstream (the fast accessor torch's compiled
    code uses, where this torch has it)."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return get(device.index) if get is not None else torch.cuda.current_stream(device).cuda_stream


def _forward(
    q, k, v, causal: str, scale, layout: str, precision, policy, names=("q", "k", "v")
) -> tuple[torch.Tensor, torch.Tensor]:
    """out and lse; a call described like an earlier one repeats its launch (``api.known_forward``;
    keyed by the operators' options, out always a new contiguous tensor). ``names``: the
    tensors' names in errors."""
    q, k, v = (_rows_contiguous(x) for x in (q, k, v))
    options = dict(causal=causal, scale=scale, layout=layout, smem_limit=None, precision=precision, policy=policy)
    key = api.forward_key(_describe(q), _describe(k), _describe(v), None, None, **options)
    known = api.known_forward(key)
    if known is not None:  # (a key seen before is one of valid tensors)
        out, lse = q.new_empty(known.out_shape), q.new_empty(known.lse_shape, dtype=torch.float32)
        known(q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(), _raw_stream(q.device))
        return out, lse
    _check_tensors(q, k, v, names)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    lse = q.new_empty(_lse_shape(q, layout), dtype=torch.float32)
    with _within_torch(q.device):
        views = (_as_cupy(x) for x in (q, k, v, out, lse))
        _, forward = api.forward_uncached(*views, **_api_options(causal, scale, layout, precision, policy))
    if forward is not None:
        api.remember_forward(key, forward)
    return out, lse


def _backward(dout, q, k, v, out, lse, causal: str, scale, layout: str, precision, policy, deterministic: bool):
    """dq, dk, dv."""
    dout, q, k, v = (_rows_contiguous(x) for x in (dout, q, k, v))
    dq, dk, dv = (torch.empty_like(x) for x in (q, k, v))
    with _within_torch(q.device):
        api.attention_backward(
            *(_as_cupy(x) for x in (dout, q, k, v, out, lse)),
            **_api_options(causal, scale, layout, precision, policy),
            deterministic=deterministic,
            dq=_as_cupy(dq),
            dk=_as_cupy(dk),
            dv=_as_cupy(dv),
        )
    return dq, dk, dv


@torch.library.custom_op("cupyattn::attention", mutates_args=(), device_types="cuda")
def _attention_op(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    causal: str,
    scale: float | None,
    layout: str,
    precision: str | None,
    policy: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """out and the float32 lse (B, Hq, Sq); ``deterministic`` is the backward's."""
    return _forward(q, k, v, causal, scale, layout, precision, policy)


def _check_traced(q, k, v, causal: str, scale, layout: str, precision) -> bool:
    """cupyattn's errors for q, k, v and the options where the operators are traced (meta or
    fake tensors: torch.compile, make_fx), as a call that runs raises them; False, checking
    nothing, where a size is symbolic (reading it would specialize the graph to it)."""
    shapes = [tuple(x.shape) for x in (q, k, v)]
    if not all(isinstance(n, int) for shape in shapes for n in shape):
        return False
    options = _api_options(causal, scale, layout, precision, None)
    del options["smem_limit"], options["policy"]
    api.check_shapes(*shapes, tuple(_dtype_name(x.dtype) for x in (q, k, v)), **options)
    return True


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_traced_like(name: str, x, shape, dtype):
    """An operand of the backward operator against the shape and dtype it must have."""
    if tuple(x.shape) != tuple(shape):
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise TypeError(f"{name}: expected dtype {_dtype_name(dtype)}, got {_dtype_name(x.dtype)}")


@_attention_op.register_fake
def _(q, k, v, causal, scale, layout, precision, policy, deterministic):
    _check_traced(q, k, v, causal, scale, layout, precision)
    out = q.new_empty(q.shape[:-1] + v.shape[-1:])
    return out, q.new_empty(_lse_shape(q, layout), dtype=torch.float32)


@torch.library.custom_op("cupyattn::attention_backward", mutates_args=(), device_types="cuda")
def _attention_backward_op(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    lse: torch.Tensor,
    causal: str,
    scale: float | None,
    layout: str,
    precision: str | None,
    policy: str | None,
    deterministic: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv."""
    return _backward(dout, q, k, v, out, lse, causal, scale, layout, precision, policy, deterministic)


@_attention_backward_op.register_fake
def _(dout, q, k, v, out, lse, causal, scale, layout, precision, policy, deterministic):
    if _check_traced(q, k, v, causal, scale, layout, precision):
        out_shape = q.shape[:-1] + v.shape[-1:]
        _check_traced_like("dout", dout, out_shape, q.dtype)
        _check_traced_like("out", out, out_shape, q.dtype)
        _check_traced_like("lse", lse, _lse_shape(q, layout), torch.float32)
    return tuple(torch.empty_like(_rows_contiguous(x)) for x in (q, k, v))


def _setup_context(ctx, inputs, output):
    q, k, v, *options = inputs
    ctx.save_for_backward(q, k, v, *output)
    ctx.mark_non_differentiable(output[1])  # lse: the public call returns out only
    ctx.options = options


def _backward_formula(ctx, dout, dlse):
    q, k, v, out, lse = ctx.saved_tensors
    dq, dk, dv = _attention_backward_op(dout, q, k, v, out, lse, *ctx.options)
    return dq, dk, dv, None, None, None, None, None, None


_attention_op.register_autograd(_backward_formula, setup_context=_setup_context)


class _EagerAttention(torch.autograd.Function):
    """The operators' autograd formula for eager calls, which skip the operators' dispatch."""

    @staticmethod
    def forward(ctx, q, k, v, options):
        out, lse = _forward(q, k, v, *options[:-1])
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = options
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        return *_backward(dout, q, k, v, out, lse, *ctx.options), None


def _watched(*tensors) -> bool:
    """Whether torch.compile, a tracer or a mode may be watching the call (or the tensors are
    meta tensors, shapes only): it then goes through the registered operators, which they see.
    Plain eager calls skip the operators' Python dispatch, which costs more host time than a
    small attention launch."""
    return (
        torch.compiler.is_compiling()
        or any(type(t) is not torch.Tensor or not t.is_cuda for t in tensors)
        or is_in_torch_dispatch_mode()
        or torch._C._is_torch_function_mode_enabled()
    )


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
    deterministic: bool = True,
) -> torch.Tensor:
    """``softmax(scale * q k^T) v`` through cupyattn's kernels, differentiable in q, k, v.

    Shapes (layout "bhsd", SDPA's): q (B, Hq, Sq, D), k (B, Hkv, Sk, D), v (B, Hkv, Sk, Dv);
    returns (B, Hq, Sq, Dv). With layout "bshd" the sequence and head axes swap.
    ``precision`` (float32 tensors: "fp32", "tf32", "bf16", "fp16" or a sequence of them;
    docs/precision.md) and ``policy`` (a ``cupyattn.plan.Policy``: the kernels the planner may
    choose) apply to the forward and the backward alike; ``deterministic`` is the backward's
    (``cupyattn.attention_backward``). Errors for shapes, dtypes and head dims are
    cupyattn's (see its README), raised before any launch.
    """
    if layout not in ("bhsd", "bshd"):
        raise ValueError(f"layout: expected 'bhsd' or 'bshd', got {layout!r}")
    if not isinstance(deterministic, bool):
        raise TypeError(f"deterministic: expected True or False, got {deterministic!r}")
    options = (_causal_name(causal), scale, layout, _precision_name(precision), _policy_name(policy), deterministic)
    return _attend(q, k, v, options)


def _attend(q, k, v, options: tuple, names=("q", "k", "v")) -> torch.Tensor:
    """attention's out for the operators' options; ``names``: the tensors' names in errors."""
    watched = _watched(q, k, v)
    if not watched and not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)):
        return _forward(q, k, v, *options[:-1], names)[0]  # (checks the tensors unless it repeats a launch)
    _check_tensors(q, k, v, names)
    if watched:
        return _attention_op(q, k, v, *options)[0]
    return _EagerAttention.apply(q, k, v, options)


def scaled_dot_product_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attn_mask=None,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    scale=None,
    enable_gqa: bool = False,
) -> torch.Tensor:
    """``torch.nn.functional.scaled_dot_product_attention``'s call and layout through
    cupyattn: query (B, Hq, L, E) or (Hq, L, E), key (..., Hkv, S, E), value (..., Hkv, S,
    Ev); ``is_causal`` top-left aligned as SDPA's; ``enable_gqa`` lets Hq be a multiple of
    Hkv. A model switches by replacing the function. What cupyattn does not do raises
    before any launch: ``attn_mask`` (no masks but causal), ``dropout_p`` other than 0."""
    if attn_mask is not None:
        raise NotImplementedError(
            f"attn_mask: cupyattn takes no attention masks (only is_causal); got {type(attn_mask).__name__}"
        )
    if dropout_p != 0.0:
        raise NotImplementedError(f"dropout_p: cupyattn has no dropout; expected 0.0, got {dropout_p!r}")
    names = ("query", "key", "value")
    if not all(isinstance(t, torch.Tensor) for t in (query, key, value)):
        _check_tensors(query, key, value, names)  # (raises; the rest is checked once, by _attend)
    dims = {t.dim() for t in (query, key, value)}
    if dims not in ({3}, {4}):
        got = ", ".join(f"{n} {tuple(t.shape)}" for n, t in (("query", query), ("key", key), ("value", value)))
        raise ValueError(f"query, key, value: expected all (B, H, L, E) or all (H, L, E), got {got}")
    if query.shape[-3] != key.shape[-3] and not enable_gqa:
        raise ValueError(
            f"key: expected query's {query.shape[-3]} heads (or enable_gqa=True for a multiple of key's), "
            f"got {key.shape[-3]}"
        )
    batched = dims == {4}
    q, k, v = (t if batched else t.unsqueeze(0) for t in (query, key, value))
    out = _attend(q, k, v, ("top_left" if is_causal else "none", scale, "bhsd", None, None, True), names)
    return out if batched else out.squeeze(0)


def transformers_attention(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, is_causal=None, **kwargs
):
    """An attention function for Hugging Face transformers' ``AttentionInterface`` (what
    ``register_transformers`` registers): query (B, Hq, Sq, D), key and value (B, Hkv, Sk, D)
    as the models pass them; returns ((B, Sq, Hq, Dv), None). Causal attention is
    bottom-right aligned, so that queries continuing a cache see every earlier key. Padding
    masks (packed sequences included: the registered mask function gives one), sliding
    windows, soft-capping and dropout raise before any launch."""
    if attention_mask is not None:
        raise NotImplementedError(
            f"attention_mask: cupyattn takes no padding masks (only causal attention over whole sequences); "
            f"got a mask of shape {tuple(attention_mask.shape)}"
        )
    for name in ("sliding_window", "softcap", "cu_seq_lens_q", "cu_seq_lens_k", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(f"{name}: cupyattn takes none (causal attention over whole sequences only)")
    if dropout:
        raise NotImplementedError(f"dropout: cupyattn has no dropout; expected 0.0, got {dropout!r}")
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = attention(query, key, value, causal=bool(causal), scale=scaling)
    return out.transpose(1, 2).contiguous(), None


def register_transformers(name: str = "cupyattn") -> str:
    """Register ``transformers_attention`` with transformers under ``name`` (and its mask
    function: SDPA's, which passes no mask where plain causal attention is exact, and a mask
    for padding or packed sequences, which ``transformers_attention`` refuses), so that
    ``attn_implementation=name`` (``from_pretrained``, a config, or
    ``model.set_attn_implementation``) runs cupyattn. Returns ``name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, transformers_attention)
    AttentionMaskInterface.register(name, sdpa_mask)
    return name
