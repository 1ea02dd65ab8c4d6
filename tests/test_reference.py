"""The NumPy reference against a naive per-row formula, and its helpers."""

import math

import numpy as np
import pytest

from cupyattn.reference import (
    attention_reference,
    causal_offset,
    delta_cancellation_error,
    logit_bound,
    round_to,
    tolerance,
)


def naive(q, k, v, causal, scale):
    """Row by row in Python floats: the formula, with no vectorised tricks."""
    B, Sq, Hq, D = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    out = np.zeros((B, Sq, Hq, Dv))
    lse = np.full((B, Hq, Sq), -np.inf)
    offset = causal_offset(causal, Sq, Sk)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                keys = [j for j in range(Sk) if offset is None or j <= i + offset]
                if not keys:
                    continue
                s = [scale * float(np.dot(q[b, i, h].astype(np.float64), k[b, j, hk])) for j in keys]
                m = max(s)
                w = [math.exp(x - m) for x in s]
                total = sum(w)
                lse[b, h, i] = m + math.log(total)
                for wj, j in zip(w, keys):
                    out[b, i, h] += wj / total * v[b, j, hk].astype(np.float64)
    return out, lse


@pytest.mark.parametrize("causal", [False, True, "top_left", "bottom_right"])
@pytest.mark.parametrize("Sq,Sk", [(5, 5), (3, 7), (7, 3), (1, 4)])
def test_reference_matches_naive(causal, Sq, Sk):
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, Sq, 4, 5))
    k = rng.standard_normal((2, Sk, 2, 5))
    v = rng.standard_normal((2, Sk, 2, 3))
    out, lse = attention_reference(q, k, v, causal=causal, scale=0.7)
    want_out, want_lse = naive(q, k, v, causal, 0.7)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_rows_without_keys_are_zero_with_minus_inf_lse():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, s, 1, 4)) for s in (6, 2, 2))
    out, lse = attention_reference(q, k, v, causal=True)  # bottom-right: rows 0..3 see nothing
    assert np.all(out[0, :4] == 0) and np.all(np.isneginf(lse[0, 0, :4]))
    assert np.all(np.isfinite(lse[0, 0, 4:]))
    assert not np.any(np.isnan(out))


def test_bhsd_layout_and_row_subset_agree_with_bshd():
    rng = np.random.default_rng(2)
    q, k, v = (rng.standard_normal((2, s, 3, 8)) for s in (9, 11, 11))
    out, lse = attention_reference(q, k, v, causal=True)
    t = lambda x: x.transpose(0, 2, 1, 3)
    out_t, lse_t = attention_reference(t(q), t(k), t(v), causal=True, layout="bhsd")
    np.testing.assert_allclose(t(out_t), out, rtol=1e-13)
    np.testing.assert_allclose(lse_t, lse, rtol=1e-13)
    rows = np.array([0, 4, 8])
    out_r, lse_r = attention_reference(q, k, v, causal=True, rows=rows)
    np.testing.assert_allclose(out_r, out[:, rows], rtol=1e-13)
    np.testing.assert_allclose(lse_r, lse[:, :, rows], rtol=1e-13)


def test_default_scale_is_inverse_sqrt_head_dim():
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((1, 4, 1, 16)) for _ in range(3))
    a, _ = attention_reference(q, k, v)
    b, _ = attention_reference(q, k, v, scale=0.25)
    np.testing.assert_allclose(a, b)


def test_round_to_bfloat16_matches_ml_dtypes():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(100000) * 10).astype(np.float32)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    np.testing.assert_array_equal(round_to(x, "bfloat16"), want)


def test_same_precision_reference_error_is_at_the_dtype_level():
    rng = np.random.default_rng(5)
    q, k, v = (round_to(rng.standard_normal((1, 64, 2, 32)), "float16") for _ in range(3))
    ref, _ = attention_reference(q, k, v)
    ref16, _ = attention_reference(q, k, v, precision="float16")
    err = np.max(np.abs(ref16 - ref))
    assert 1e-5 < err < 5e-3
    assert tolerance(err, "float16") > 2 * err


def test_causal_argument_is_validated():
    with pytest.raises(ValueError, match="causal"):
        causal_offset("diagonal", 3, 3)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
def test_tolerance_rejects_a_slightly_wrong_kernel(dtype):
    """The rule must fail an output computed with a 5% wrong scale or one dropped key."""
    from cupyattn.testing import compare

    rng = np.random.default_rng(6)
    q, k, v = (round_to(rng.standard_normal((2, 128, 2, 64)), dtype) for _ in range(3))
    ref, _ = attention_reference(q, k, v, causal=True)
    ref_p, _ = attention_reference(q, k, v, causal=True, precision=dtype)
    bound = logit_bound(q, k)
    assert compare(ref_p, ref, ref_p, dtype, 128, logit_bound=bound).ok
    wrong_scale, _ = attention_reference(q, k, v, causal=True, scale=0.95 / 8, precision=dtype)
    assert not compare(wrong_scale, ref, ref_p, dtype, 128, logit_bound=bound).ok
    dropped, _ = attention_reference(q, k[:, 1:], v[:, 1:], causal=True, precision=dtype)
    assert not compare(dropped[:, 1:], ref[:, 1:], ref_p[:, 1:], dtype, 128, logit_bound=bound).ok


@pytest.mark.parametrize("causal", [False, True, "top_left"])
def test_backward_reference_matches_central_finite_differences(causal):
    from cupyattn.reference import attention_backward_reference

    rng = np.random.default_rng(9)
    q = rng.standard_normal((1, 5, 4, 3))
    k = rng.standard_normal((1, 4, 2, 3))
    v = rng.standard_normal((1, 4, 2, 2))
    dout = rng.standard_normal((1, 5, 4, 2))
    loss = lambda q, k, v: float(np.sum(attention_reference(q, k, v, causal=causal, scale=0.6)[0] * dout))
    grads = attention_backward_reference(dout, q, k, v, causal=causal, scale=0.6)
    eps = 1e-6
    for which, (x, g) in enumerate(zip((q, k, v), grads)):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = [q, k, v]
            for sign in (1, -1):
                xp = x.copy()
                xp[idx] += sign * eps
                args[which] = xp
                numeric[idx] += sign * loss(*args) / (2 * eps)
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-8)


def test_backward_reference_rows_without_keys_have_zero_gradients():
    from cupyattn.reference import attention_backward_reference

    rng = np.random.default_rng(10)
    q, dout = (rng.standard_normal((1, 6, 1, 4)) for _ in range(2))
    k, v = (rng.standard_normal((1, 2, 1, 4)) for _ in range(2))
    dq, dk, dv = attention_backward_reference(dout, q, k, v, causal=True)
    assert np.all(dq[0, :4] == 0) and np.all(np.isfinite(dk)) and np.all(np.isfinite(dv))


def test_logit_bound_bounds_every_logit():
    rng = np.random.default_rng(13)
    q, k = rng.standard_normal((2, 9, 3, 16)), rng.standard_normal((2, 7, 3, 16))
    logits = np.einsum("bihd,bjhd->bhij", q, k) * 0.3
    assert np.abs(logits).max() <= logit_bound(q, k, 0.3) < 10 * np.abs(logits).max()


def test_delta_cancellation_error_bounds_float32_noise_where_gradients_vanish():
    # One key per row: P = 1, O = V, so dS = dP - delta is exactly 0 and so are dq, dk.
    # Summing dP = dO . V and delta = dO . O in opposite float32 orders (as two kernels
    # may) leaves noise that reaches dk; the estimate must cover it without being vacuous.
    rng = np.random.default_rng(3)
    B, S, H, D, Dv = 4, 1, 2, 8, 256
    q, k = (rng.standard_normal((B, S, H, D)).astype(np.float32) for _ in range(2))
    v, dout = (rng.standard_normal((B, S, H, Dv)).astype(np.float32) for _ in range(2))
    scale = np.float32(1 / np.sqrt(D))
    terms = dout * v  # O = V exactly
    dp = np.zeros(terms.shape[:-1], np.float32)
    delta = np.zeros(terms.shape[:-1], np.float32)
    for d in range(Dv):  # sequential float32 sums, forwards and backwards
        dp += terms[..., d]
        delta += terms[..., Dv - 1 - d]
    dk = scale * (dp - delta)[..., None] * q
    dq_bound, dk_bound = delta_cancellation_error(dout, q, k, v)
    assert np.abs(dk).max() > 0  # the orders did round differently
    assert np.abs(dk).max() <= dk_bound
    assert dk_bound < 1e-3 * np.abs(q).max()  # float32 noise, not a free pass
    assert dq_bound > 0
