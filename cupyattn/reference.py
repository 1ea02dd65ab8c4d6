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

The attention variants, FlashAttention-2's conventions where it has them
(``visible_keys``, ``modified_scores``): a sliding ``window=(left, right)`` (-1:
unbounded) lets query i see keys j with i + o - left <= j <= i + o + right, o the
diagonal's offset (Sk - Sq; 0 for ``causal="top_left"``), a causal window's right
extent being 0; ``softcap`` turns the scaled scores x into softcap * tanh(x / softcap);
``alibi_slopes`` ((Hq,) or (B, Hq)) adds -slope * |i + Sk - Sq - j|; ``score_mod(score,
b, h, q_idx, kv_idx)`` then modifies the scores, ``mask_mod(b, h, q_idx, kv_idx)``
hides keys (both NumPy functions of index arrays that broadcast to (B, Hq, Sq, Sk)).
Packed variable-length batches: ``varlen_attention_reference``.
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


def window_extents(window, causal) -> tuple[int, int]:
    """(left, right) of a sliding window (-1: unbounded; None: no window), a causal
    window's right extent 0."""
    causal_offset(causal, 0, 0)  # (validates causal)
    window = (-1, -1) if window is None else window
    if len(window) != 2 or any(not isinstance(e, (int, np.integer)) or e < -1 for e in window):
        raise ValueError(f"window: expected (left, right), each an int >= -1 (-1: unbounded), got {window!r}")
    left, right = window
    if causal not in (False, None):
        if right > 0:
            raise ValueError(f"window: a causal window ends at the diagonal (right 0 or -1), got {window!r}")
        right = 0
    return int(left), int(right)


def visible_keys(seqlen_q: int, seqlen_k: int, causal=False, window=None, rows=None) -> np.ndarray:
    """(len(rows), seqlen_k) booleans: the keys each query row sees under the causal mask
    and the sliding window (``rows``: query indices, default all)."""
    left, right = window_extents(window, causal)
    rows = np.arange(seqlen_q) if rows is None else np.asarray(rows)
    diagonal = 0 if causal == "top_left" else seqlen_k - seqlen_q
    distance = np.arange(seqlen_k)[None, :] - (rows[:, None] + diagonal)  # key j - query i's diagonal key
    visible = np.ones((len(rows), seqlen_k), bool)
    if right >= 0:
        visible &= distance <= right
    if left >= 0:
        visible &= distance >= -left
    return visible


def modified_scores(
    x,
    seqlen_q: int,
    rows=None,
    causal=False,
    window=None,
    softcap=None,
    alibi_slopes=None,
    score_mod=None,
    mask_mod=None,
    score_mod_derivative=None,
):
    """(scores, derivative) of the scaled scores ``x`` = scale Q K^T, (B, Hq, len(rows), Sk):
    the scores the softmax takes (softcap, ALiBi, score_mod in that order; -inf where the
    causal mask, the window or mask_mod hides a key) and their derivative with respect to x
    (0 where hidden; ``score_mod_derivative``, of the same arguments as score_mod, gives
    score_mod's), None where it is 1 (no softcap, no score_mod)."""
    B, H, _, Sk = x.shape
    rows = np.arange(seqlen_q) if rows is None else np.asarray(rows)
    b, h = np.arange(B)[:, None, None, None], np.arange(H)[None, :, None, None]
    q_idx, kv_idx = rows[None, None, :, None], np.arange(Sk)[None, None, None, :]
    derivative = None
    if softcap is not None:
        t = np.tanh(x / softcap)
        x, derivative = softcap * t, 1 - t * t
    if alibi_slopes is not None:
        slopes = np.asarray(alibi_slopes, np.float64)
        slopes = slopes.reshape((1, H) if slopes.ndim == 1 else (B, H))[:, :, None, None]
        x = x - (slopes * np.abs(q_idx + Sk - seqlen_q - kv_idx)).astype(x.dtype)
    if score_mod is not None:
        if score_mod_derivative is not None:
            d = score_mod_derivative(x, b, h, q_idx, kv_idx)
            derivative = d if derivative is None else derivative * d
        x = np.asarray(score_mod(x, b, h, q_idx, kv_idx), x.dtype)
    visible = visible_keys(seqlen_q, Sk, causal, window, rows)[None, None]
    if mask_mod is not None:
        visible = visible & np.asarray(mask_mod(b, h, q_idx, kv_idx), bool)
    if derivative is not None:
        derivative = np.where(visible, derivative, 0.0).astype(x.dtype)
    if visible.all():  # (no copy where nothing is hidden)
        return x, derivative
    x = np.broadcast_to(x, np.broadcast_shapes(x.shape, visible.shape))
    return np.where(visible, x, -np.inf), derivative


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
    q, k, v, causal=False, scale=None, layout="bshd", precision=None, rows=None, out_precision=None, **variants
):
    """(out, lse) of softmax(scale * Q K^T) V for host arrays.

    q (B, Sq, Hq, D), k (B, Sk, Hkv, D), v (B, Sk, Hkv, Dv) ("bshd") or the
    (B, H, S, D) transposes ("bhsd"). out has q's layout and shape (with Dv);
    lse is (B, Hq, Sq), natural log. ``precision=None`` computes in float64.
    ``rows`` (query indices) evaluates only those rows, for long sequences.
    ``out_precision``: the output's rounding (default: ``precision``).
    ``variants``: window, softcap, alibi_slopes, score_mod, mask_mod (``modified_scores``).
    """
    q, k, v = (_to_bshd(x, layout) for x in (q, k, v))
    if precision is None:
        work = np.float64
        q, k, v = (np.asarray(x, dtype=work) for x in (q, k, v))
    else:  # what a kernel of that precision sees: inputs rounded to it, float32 arithmetic
        work = np.float32
        q, k, v = (round_to(x, precision) for x in (q, k, v))
    B, Sq, Hq, D = q.shape
    group = Hq // k.shape[2]
    if scale is None:
        scale = 1.0 / np.sqrt(D)
    # (B, H, S, D), key/value heads repeated for GQA.
    qh = q.transpose(0, 2, 1, 3)
    rows = np.arange(Sq) if rows is None else np.asarray(rows)
    qh = qh[:, :, rows]
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)
    s = (qh @ np.swapaxes(kh, -1, -2)).astype(work) * work(scale)
    s, _ = modified_scores(s, Sq, rows, causal, **variants)
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


def _sequences(cu_seqlens_q, cu_seqlens_k):
    """(b, query slice, key slice) of each sequence of a packed batch."""
    cq, ck = (np.asarray(c, np.int64) for c in (cu_seqlens_q, cu_seqlens_k))
    if cq.shape != ck.shape or cq.ndim != 1 or cq[0] != 0 or ck[0] != 0:
        raise ValueError("cu_seqlens_q, cu_seqlens_k: expected two (B + 1,) offsets from 0")
    if (np.diff(cq) < 0).any() or (np.diff(ck) < 0).any():
        raise ValueError("cu_seqlens_q, cu_seqlens_k: offsets must not decrease")
    return [(b, slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])) for b in range(len(cq) - 1)]


def _sequence_variants(variants: dict, b: int) -> dict:
    """A packed batch's variants for its sequence b, as a batch of one: slopes of shape
    (B, Hq) and the functions' batch index taken at b."""
    out = dict(variants)
    slopes = variants.get("alibi_slopes")
    if slopes is not None and np.ndim(slopes) == 2:
        out["alibi_slopes"] = np.asarray(slopes)[b]
    for name in ("score_mod", "score_mod_derivative"):
        if variants.get(name) is not None:
            out[name] = lambda x, _b, h, q_idx, kv_idx, f=variants[name]: f(x, b, h, q_idx, kv_idx)
    if variants.get("mask_mod") is not None:
        out["mask_mod"] = lambda _b, h, q_idx, kv_idx, f=variants["mask_mod"]: f(b, h, q_idx, kv_idx)
    return out


def varlen_attention_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, **options):
    """(out, lse) of a packed batch: q (total_q, Hq, D), k and v (total_k, Hkv, D / Dv), sequence
    b's queries q[cu_seqlens_q[b]:cu_seqlens_q[b + 1]] attending to its keys alone (causal and
    windows per sequence, FlashAttention-2's ``flash_attn_varlen_func``); lse is (Hq, total_q).
    ``options``: ``attention_reference``'s precision, out_precision and variants (a score_mod
    or mask_mod gets the sequence's index as b)."""
    q, k, v = (np.asarray(x) for x in (q, k, v))
    work = np.float64 if options.get("precision") is None else np.float32
    out = np.zeros((q.shape[0], q.shape[1], v.shape[2]), work)
    lse = np.full((q.shape[1], q.shape[0]), -np.inf, work)
    variants = {n: options.pop(n) for n in list(options) if n not in ("precision", "out_precision")}
    for b, rows, keys in _sequences(cu_seqlens_q, cu_seqlens_k):
        if rows.stop == rows.start:
            continue
        o, l = attention_reference(
            q[None, rows], k[None, keys], v[None, keys], causal, scale, **options, **_sequence_variants(variants, b)
        )
        out[rows], lse[:, rows] = o[0], l[0]
    return out, lse


def varlen_attention_backward_reference(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, causal=False, scale=None, **options):
    """(dq, dk, dv) of ``varlen_attention_reference``, shaped like q, k, v."""
    dout, q, k, v = (np.asarray(x) for x in (dout, q, k, v))
    work = np.float64 if options.get("precision") is None else np.float32
    grads = [np.zeros(x.shape, work) for x in (q, k, v)]
    variants = {n: options.pop(n) for n in list(options) if n not in ("precision", "out_precision")}
    for b, rows, keys in _sequences(cu_seqlens_q, cu_seqlens_k):
        parts = attention_backward_reference(
            dout[None, rows],
            q[None, rows],
            k[None, keys],
            v[None, keys],
            causal,
            scale,
            **options,
            **_sequence_variants(variants, b),
        )
        for g, part, where in zip(grads, parts, (rows, keys, keys)):
            g[where] = part[0]
    return tuple(grads)


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


def _probabilities(q, k, v, causal, scale, work, **variants):
    """(qh, kh, vh, P, dS/dx) of (B, S, H, D) arrays in ``work`` precision: q, k, v as
    (B, H, S, D) with the key/value heads repeated over each GQA group, softmax of the
    modified scores of x = scale Q K^T (rows that see no key: P = 0), and the scores'
    derivative with respect to x (``modified_scores``; None where it is 1)."""
    Sq, Hq = q.shape[1], q.shape[2]
    group = Hq // k.shape[2]
    qh = q.transpose(0, 2, 1, 3)
    kh = np.repeat(k.transpose(0, 2, 1, 3), group, axis=1)
    vh = np.repeat(v.transpose(0, 2, 1, 3), group, axis=1)
    s = (qh @ np.swapaxes(kh, -1, -2)).astype(work) * scale
    s, derivative = modified_scores(s, Sq, None, causal, **variants)
    m = s.max(axis=-1, keepdims=True)
    p = np.exp(s - np.where(np.isfinite(m), m, 0))
    l = p.sum(axis=-1, keepdims=True)
    p = np.where(l > 0, p / np.where(l > 0, l, 1), 0).astype(work)
    return qh, kh, vh, p, derivative


def attention_backward_reference(
    dout, q, k, v, causal=False, scale=None, layout="bshd", precision=None, out_precision=None, **variants
):
    """(dq, dk, dv) of ``attention_reference`` for host arrays, shaped like q, k, v.

    float64 by default. With ``precision`` (the inputs' dtype) it is the
    same-precision reference: inputs rounded to it, float32 arithmetic, the
    forward output (which the backward's delta uses), P and dS (before they
    enter their products) and the gradients rounded to it (the forward output and
    the gradients to ``out_precision`` if given). With GQA, dk and dv are summed
    over the query heads of each group. ``variants`` as ``attention_reference``'s, with
    ``score_mod_derivative`` where there is a score_mod (``modified_scores``).
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
    if variants.get("score_mod") is not None and variants.get("score_mod_derivative") is None:
        raise ValueError("score_mod_derivative: the backward of a score_mod needs its derivative")
    qh, kh, vh, p, derivative = _probabilities(q, k, v, causal, scale, work, **variants)
    doh = dout.transpose(0, 2, 1, 3)
    out = (p @ vh).astype(work)
    if precision is not None:
        out = round_to(out, out_precision or precision)
    dp = (doh @ np.swapaxes(vh, -1, -2)).astype(work)
    delta = (doh * out).sum(axis=-1, keepdims=True)
    ds = p * (dp - delta)
    if derivative is not None:  # (with respect to scale Q K^T)
        ds = ds * derivative
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
    qh, kh, vh, p, _ = _probabilities(q, k, v, causal, scale, np.float64)
    doh, oh = dout.transpose(0, 2, 1, 3), p @ vh
    terms = np.abs(doh) @ np.swapaxes(np.abs(vh), -1, -2) + (np.abs(doh) * np.abs(oh)).sum(-1, keepdims=True)
    ds_err = (unit or unit_roundoff("float32")) * p * terms
    dq_err = abs(scale) * (ds_err @ np.abs(kh))
    dk_err = abs(scale) * (np.swapaxes(ds_err, -1, -2) @ np.abs(qh)).reshape(B, Hkv, group, Sk, D).sum(2)
    return float(dq_err.max(initial=0.0)), float(dk_err.max(initial=0.0))
