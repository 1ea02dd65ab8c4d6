"""NumPy references: the ground truth every kernel is checked against.

``attention_reference`` computes in float64 by default. With ``precision`` set to
an input dtype it is the *same-precision* reference of FlashAttention's test rule:
float32 arithmetic with the probabilities rounded to that dtype before P @ V and
the output rounded to it, as a half-precision kernel does. A kernel passes when
its error against the float64 result is at most a small multiple of this
reference's own error (``tolerance``).

For float32 inputs in a reduced precision mode (``attention(..., precision=)``),
``precision`` names the operand type ("tf32", "bfloat16", "float16") and
``out_precision="float32"`` keeps the output in float32, as those kernels do
(``operand_precision`` maps a mode to the pair).

Masking matches the kernels: with ``causal="bottom_right"`` (or True) query i
sees key j iff j <= i + Sk - Sq; with ``"top_left"`` iff j <= i. A row that sees
no key has out = 0 and lse = -inf.
"""

from __future__ import annotations

import numpy as np


def causal_offset(causal, seqlen_q: int, seqlen_k: int) -> int | None:
    """The diagonal offset of the causal mask (key j visible iff j <= i + offset), or None."""
    if causal is False or causal is None:
        return None
    if causal is True or causal == "bottom_right":
        return seqlen_k - seqlen_q
    if causal == "top_left":
        return 0
    raise ValueError(f"causal: expected False, True, 'top_left' or 'bottom_right', got {causal!r}")


def round_to(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to ``dtype`` (nearest even; "tf32": nearest, ties away from
    zero, as cvt.rna.tf32.f32), returned as float32."""
    x = np.asarray(x, dtype=np.float32)
    if dtype == "float32":
        return x
    if dtype == "tf32":  # 10 explicit mantissa bits: add half of the 13 dropped bits' range
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x1000) & 0xFFFFE000).astype(np.uint32).view(np.float32)
        return np.where(np.isfinite(x), rounded, x)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = rounded.astype(np.uint32).view(np.float32)
        return np.where(np.isnan(x), x, out)
    raise ValueError(f"dtype: expected float32, tf32, float16 or bfloat16, got {dtype!r}")


def unit_roundoff(dtype: str) -> float:
    return {"float32": 2.0**-24, "tf32": 2.0**-11, "float16": 2.0**-11, "bfloat16": 2.0**-8}[dtype]


# Operand type of each precision mode of float32 inputs (plan.PRECISIONS).
MODE_OPERANDS = {"fp32": "float32", "tf32": "tf32", "bf16": "bfloat16", "fp16": "float16"}


def cancellation_unit(dtype: str, mode: str | None = None) -> float:
    """The relative size of the dP - delta noise (``delta_cancellation_error``) of a
    kernel for inputs of ``dtype`` in ``mode``: float32's for half inputs (their products
    are exact); for float32 inputs the operand type's, and 2**-21 for 3xTF32, whose two
    TF32 parts carry about 22 bits of each operand."""
    if dtype != "float32":
        return unit_roundoff("float32")
    if mode in (None, "fp32"):
        return 2.0**-21
    return unit_roundoff(MODE_OPERANDS[mode])


def operand_precision(dtype: str, mode: str | None = None) -> tuple[str, str]:
    """(precision, out_precision) of the same-precision reference of inputs of ``dtype``
    computed in ``mode`` (None: the dtype's own)."""
    if mode is None or dtype != "float32":
        return dtype, dtype
    return MODE_OPERANDS[mode], "float32"


def _to_bshd(x, layout):
    x = np.asarray(x)
    if layout == "bhsd":
        return x.transpose(0, 2, 1, 3)
    if layout != "bshd":
        raise ValueError(f"layout: expected 'bshd' or 'bhsd', got {layout!r}")
    return x


def attention_reference(
    q, k, v, causal=False, scale=None, layout="bshd", precision=None, rows=None, out_precision=None
):
    """(out, lse) of softmax(scale * Q K^T) V for host arrays.

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) ("bshd") or the
    (B, H, S, D) transposes ("bhsd"). out has q's layout and shape (with Dv);
    lse is (B, Hq, Sq), natural log. ``precision=None`` computes in float64.
    ``rows`` (query indices) evaluates only those rows, for long sequences.
    ``out_precision``: the output's rounding (default: ``precision``).
    """
    q, k, v = (_to_bshd(x, layout) for x in (q, k, v))
    if precision is None:
        work = np.float64
        q, k, v = (np.asarray(x, dtype=work) for x in (q, k, v))
    else:  # what a kernel of that precision sees: inputs rounded to it, float32 arithmetic
        work = np.float32
        q, k, v = (round_to(x, precision) for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    # (B, H, S, D), key/value heads repeated for GQA.
    qh = q.transpose(0, 2, 1, 3)
    rows = np.arange(Sq) if rows is None else np.asarray(rows)
    qh = qh[:, :, rows]
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)
    s = (qh @ np.swapaxes(kh, -1, -2)).astype(work) * work(scale)
    offset = causal_offset(causal, Sq, Sk)
    if offset is not None:
        visible = np.arange(Sk)[None, :] <= rows[:, None] + offset
        s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    m_safe = np.where(np.isfinite(m), m, 0)
    p = np.exp(s - m_safe)
    l = p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        lse = np.where(l > 0, np.log(l) + m_safe, -np.inf)[..., 0]
        p = np.where(l > 0, p / np.where(l > 0, l, 1), 0)
    if precision is not None:
        p = round_to(p, precision)
    out = (p @ vh).astype(work)
    if precision is not None:
        out = round_to(out, out_precision or precision)
    out = out.transpose(0, 2, 1, 3)  # back to (B, Sq, Hq, Dv)
    if layout == "bhsd":
        out = out.transpose(0, 2, 1, 3)
    return out, lse.astype(np.float32 if precision is not None else np.float64)


def tolerance(
    ref_same_precision_error: float,
    dtype: str,
    magnitude: float = 1.0,
    seqlen_k: int = 1,
    factor: float = 2.0,
    logit_bound: float = 0.0,
) -> float:
    """FlashAttention's rule: ``factor`` x the same-precision reference's error plus a floor.

    The floor keeps cases where the same-precision reference happens to be exact
    (Sk = 1) meaningful. It covers, in units of rounding of the output's magnitude:
    the output's rounding to ``dtype``; float32 accumulation over Sk keys in another
    order than the reference's (grows like sqrt(Sk)); and the float32 rounding of
    the softmax argument, which the kernels form as scale * log2(e) * (q . k) and
    whose absolute error grows with the largest logit (``logit_bound``, e.g.
    ``logit_bound(q, k, scale)``).
    """
    scale = max(1.0, magnitude)
    f32 = unit_roundoff("float32")
    floor = (4 * unit_roundoff(dtype) + 4 * f32 * (np.sqrt(max(1, seqlen_k)) + logit_bound)) * scale
    return factor * ref_same_precision_error + floor


def logit_bound(q, k, scale=None) -> float:
    """An upper bound of |scale * q_i . k_j| (Cauchy-Schwarz): scale * max|q_i| * max|k_j|."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    if q.size == 0 or k.size == 0:
        return 0.0
    if scale is None:
        scale = 1.0 / np.sqrt(q.shape[-1])
    return float(abs(scale) * np.linalg.norm(q, axis=-1).max() * np.linalg.norm(k, axis=-1).max())


def _probabilities(q, k, v, causal, scale, work):
    """(qh, kh, vh, P) of (B, S, H, D) arrays in ``work`` precision: q, k, v as (B, H, S, D)
    with the key/value heads repeated over each GQA group, and softmax(scale Q K^T) with
    the causal mask (rows that see no key: P = 0)."""
    Sq, Hq = q.shape[1], q.shape[2]
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    qh = q.transpose(0, 2, 1, 3)
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)
    s = (qh @ np.swapaxes(kh, -1, -2)).astype(work) * scale
    offset = causal_offset(causal, Sq, Sk)
    visible = np.ones((Sq, Sk), bool)
    if offset is not None:
        visible = np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + offset
    s = np.where(visible, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, p / np.where(l > 0, l, 1), 0).astype(work)
    return qh, kh, vh, p


def attention_backward_reference(
    dout, q, k, v, causal=False, scale=None, layout="bshd", precision=None, out_precision=None
):
    """(dq, dk, dv) of ``attention_reference`` for host arrays, shaped like q, k, v.

    float64 by default. With ``precision`` (the inputs' dtype) it is the
    same-precision reference: inputs rounded to it, float32 arithmetic, the
    forward output (which the backward's delta uses), P and dS (before they
    enter their products) and the gradients rounded to it (the forward output and
    the gradients to ``out_precision`` if given). With GQA, dk and dv are summed
    over the query heads of each group.
    """
    dout, q, k, v = (_to_bshd(x, layout) for x in (dout, q, k, v))
    if precision is None:
        work = np.float64
        dout, q, k, v = (np.asarray(x, dtype=work) for x in (dout, q, k, v))
    else:
        work = np.float32
        dout, q, k, v = (round_to(x, precision) for x in (dout, q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    scale = work(scale)
    qh, kh, vh, p = _probabilities(q, k, v, causal, scale, work)
    doh = dout.transpose(0, 2, 1, 3)
    out = (p @ vh).astype(work)
    if precision is not None:
        out = round_to(out, out_precision or precision)
    dp = (doh @ np.swapaxes(vh, -1, -2)).astype(work)
    delta = (doh * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if precision is not None:  # P and dS enter their products in the input type, as on tensor cores
        p, ds = round_to(p, precision), round_to(ds, precision)
    dv = (np.swapaxes(p, -1, -2) @ doh).astype(work)
    dq = (ds @ kh).astype(work) * scale
    dk = (np.swapaxes(ds, -1, -2) @ qh).astype(work) * scale
    # Sum the repeated key/value heads back over each GQA group.
    dk = dk.reshape(B, Hkv, group, Sk, D).sum(axis=2)
    dv = dv.reshape(B, Hkv, group, Sk, v.shape[3]).sum(axis=2)
    grads = [g.transpose(0, 2, 1, 3) for g in (dq, dk, dv)]  # to (B, S, H, D)
    if precision is not None:
        grads = [round_to(g, out_precision or precision) for g in grads]
    if layout == "bhsd":
        grads = [g.transpose(0, 2, 1, 3) for g in grads]
    return tuple(grads)


def delta_cancellation_error(dout, q, k, v, causal=False, scale=None, layout="bshd", unit=None):
    """(max over dq, max over dk) of the error that float32 rounding of dS = P (dP - delta)
    can put into dq and dk, whatever their magnitude.

    dP = dO . V_j and delta = dO . O are Dv-long float32 sums that a kernel forms in
    different orders; where a row's probability sits on one key (O = V_j) they cancel
    to rounding noise of size u * sum|dO V_j|, which dq = scale dS K and dk = scale dS^T Q
    carry although the gradients themselves are ~0. Estimated here (float64) as
    u * P * (|dO| |V_j| + |dO| |O|) propagated through |K| and |Q|, GQA groups summed,
    with u = ``unit`` (default float32's unit roundoff): a kernel that forms dP from
    operands rounded to a narrower type than delta's (float32 inputs in a reduced
    precision mode) leaves noise of that type's size (``cancellation_unit``).
    """
    dout, q, k, v = (np.asarray(_to_bshd(x, layout), np.float64) for x in (dout, q, k, v))
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    group = Hq // Hkv
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    qh, kh, vh, p = _probabilities(q, k, v, causal, scale, np.float64)
    doh, oh = dout.transpose(0, 2, 1, 3), p @ vh
    terms = np.abs(doh) @ np.swapaxes(np.abs(vh), -1, -2) + (np.abs(doh) * np.abs(oh)).sum(-1, keepdims=True)
    ds_err = (unit or unit_roundoff("float32")) * p * terms
    dq_err = abs(scale) * (ds_err @ np.abs(kh))
    dk_err = abs(scale) * (np.swapaxes(ds_err, -1, -2) @ np.abs(qh)).reshape(B, Hkv, group, Sk, D).sum(2)
    return float(dq_err.max(initial=0.0)), float(dk_err.max(initial=0.0))
