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


def central_differences(loss, arrays, eps=1e-6):
    """d loss / d each array's entries, by central differences."""
    grads = []
    for which, x in enumerate(arrays):
        numeric = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            args = list(arrays)
            for sign in (1, -1):
                xp = x.copy()
                xp[idx] += sign * eps
                args[which] = xp
                numeric[idx] += sign * loss(*args) / (2 * eps)
        grads.append(numeric)
    return grads


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
    for g, numeric in zip(grads, central_differences(loss, (q, k, v))):
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


def naive_variant(
    q, k, v, scale, causal=False, window=(-1, -1), softcap=None, slopes=None, score_mod=None, mask_mod=None
):
    """The variants row by row in Python floats, each rule written out as FlashAttention-2 and
    FlexAttention state it."""
    B, Sq, Hq, _ = q.shape
    Sk, Hkv, Dv = k.shape[1], k.shape[2], v.shape[3]
    left, right = window
    if causal:
        right = 0
    diagonal = 0 if causal == "top_left" else Sk - Sq
    out, lse = np.zeros((B, Sq, Hq, Dv)), np.full((B, Hq, Sq), -np.inf)
    for b in range(B):
        for h in range(Hq):
            hk = h // (Hq // Hkv)
            for i in range(Sq):
                scores = {}
                for j in range(Sk):
                    if right >= 0 and j > i + diagonal + right or left >= 0 and j < i + diagonal - left:
                        continue
                    if mask_mod is not None and not mask_mod(b, h, i, j):
                        continue
                    x = scale * float(np.dot(q[b, i, h], k[b, j, hk]))
                    if softcap is not None:
                        x = softcap * math.tanh(x / softcap)
                    if slopes is not None:
                        slope = slopes[h] if np.ndim(slopes) == 1 else slopes[b][h]
                        x -= slope * abs(i + Sk - Sq - j)
                    if score_mod is not None:
                        x = score_mod(x, b, h, i, j)
                    scores[j] = x
                if not scores:
                    continue
                m = max(scores.values())
                total = sum(math.exp(x - m) for x in scores.values())
                lse[b, h, i] = m + math.log(total)
                for j, x in scores.items():
                    out[b, i, h] += math.exp(x - m) / total * v[b, j, hk]
    return out, lse


def _prefix_lm(b, h, q_idx, kv_idx):  # (a document mask: query and key in the same half, or a prefix key)
    return (kv_idx < 2) | ((q_idx < 4) == (kv_idx < 4))


def _shifted(score, b, h, q_idx, kv_idx):
    return score + 0.1 * h - 0.05 * b


VARIANTS = [
    dict(window=(2, 1)),
    dict(window=(0, 0)),
    dict(window=(3, -1), causal=True),
    dict(window=(1, 0), causal="top_left"),
    dict(softcap=1.5),
    dict(slopes=[0.5, 0.25, 0.125, 0.0625]),
    dict(slopes=[[0.5, 0.25, 0.1, 0.0], [0.3, 0.2, 0.1, 0.05]], causal=True),
    dict(score_mod=_shifted, mask_mod=_prefix_lm),
    dict(softcap=2.0, slopes=[0.5, 0.25, 0.125, 0.0625], window=(4, 4), mask_mod=_prefix_lm),
]


def _reference_variants(case):
    """``naive_variant``'s case as ``attention_reference``'s arguments."""
    case = dict(case)
    causal = case.pop("causal", False)
    if "slopes" in case:
        case["alibi_slopes"] = np.asarray(case.pop("slopes"))
    return causal, case


@pytest.mark.parametrize("case", VARIANTS, ids=lambda c: ",".join(sorted(c)))
@pytest.mark.parametrize("Sq,Sk", [(6, 6), (5, 8), (8, 5)])
def test_variants_match_the_rules_written_out(case, Sq, Sk):
    rng = np.random.default_rng(Sq * 10 + Sk)
    q, k, v = (rng.standard_normal(s) for s in ((2, Sq, 4, 5), (2, Sk, 2, 5), (2, Sk, 2, 3)))
    causal, variants = _reference_variants(case)
    out, lse = attention_reference(q, k, v, causal, 0.7, **variants)
    want_out, want_lse = naive_variant(q, k, v, 0.7, **case)
    np.testing.assert_allclose(out, want_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, want_lse, rtol=1e-12, atol=1e-12)


def test_a_window_follows_flash_attention_2s_bounds():
    """Query i sees keys i + Sk - Sq - left .. i + Sk - Sq + right; causal ends at the diagonal,
    top-left causal at j = i."""
    from cupyattn.reference import visible_keys

    seen = visible_keys(3, 5, window=(1, 0))  # diagonal keys 2, 3, 4
    assert seen.tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 0, 1, 1]]
    assert visible_keys(3, 5, True, (1, -1)).tolist() == seen.tolist()
    assert visible_keys(3, 5, "top_left", (0, -1)).tolist() == [[1, 0, 0, 0, 0], [0, 1, 0, 0, 0], [0, 0, 1, 0, 0]]
    assert visible_keys(2, 2, window=(-1, -1)).all()
    for bad in [(1,), (-2, 0), (0.5, 1)]:
        with pytest.raises(ValueError, match="window"):
            visible_keys(2, 2, window=bad)
    with pytest.raises(ValueError, match="causal window"):
        visible_keys(2, 2, True, (1, 1))


def test_rows_a_window_or_mask_hides_every_key_from_are_zero_with_zero_gradients():
    from cupyattn.reference import attention_backward_reference

    rng = np.random.default_rng(4)
    q, dout = (rng.standard_normal((1, 4, 2, 3)) for _ in range(2))
    k, v = (rng.standard_normal((1, 4, 2, 3)) for _ in range(2))
    hidden = dict(mask_mod=lambda b, h, q_idx, kv_idx: q_idx != 1 + 0 * kv_idx)  # row 1 sees nothing
    out, lse = attention_reference(q, k, v, **hidden)
    dq, dk, dv = attention_backward_reference(dout, q, k, v, **hidden)
    assert np.all(out[0, 1] == 0) and np.all(np.isneginf(lse[0, :, 1])) and np.all(dq[0, 1] == 0)
    assert np.isfinite(lse[0, :, [0, 2, 3]]).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.parametrize(
    "variants",
    [
        dict(window=(1, 1)),
        dict(softcap=0.8),
        dict(alibi_slopes=np.array([0.3, 0.7, 0.2, 0.9]), causal=True),
        dict(
            score_mod=lambda x, b, h, q_idx, kv_idx: x * (1 + 0.5 * np.sin(x)) + 0.1 * q_idx,
            score_mod_derivative=lambda x, b, h, q_idx, kv_idx: 1 + 0.5 * np.sin(x) + 0.5 * x * np.cos(x),
            mask_mod=_prefix_lm,
        ),
        dict(softcap=1.2, window=(2, -1), causal="top_left"),
    ],
    ids=["window", "softcap", "alibi", "score_mod", "softcap+window"],
)
def test_variant_gradients_match_central_finite_differences(variants):
    from cupyattn.reference import attention_backward_reference

    variants = dict(variants)
    causal = variants.pop("causal", False)
    rng = np.random.default_rng(12)
    q = rng.standard_normal((1, 5, 4, 3))
    k = rng.standard_normal((1, 6, 2, 3))
    v = rng.standard_normal((1, 6, 2, 2))
    dout = rng.standard_normal((1, 5, 4, 2))
    loss = lambda q, k, v: float(np.sum(attention_reference(q, k, v, causal, 0.6, **variants)[0] * dout))
    grads = attention_backward_reference(dout, q, k, v, causal, 0.6, **variants)
    for g, numeric in zip(grads, central_differences(loss, (q, k, v))):
        np.testing.assert_allclose(g, numeric, rtol=1e-6, atol=1e-8)


def test_a_score_mod_backward_needs_its_derivative():
    from cupyattn.reference import attention_backward_reference

    x = np.ones((1, 2, 1, 2))
    with pytest.raises(ValueError, match="score_mod_derivative"):
        attention_backward_reference(x, x, x, x, score_mod=_shifted)


@pytest.mark.parametrize("causal", [False, True, "top_left"])
def test_a_packed_batch_is_each_sequence_alone(causal):
    """varlen: each sequence against its own keys (one of them empty, one with fewer keys than
    queries), lse (Hq, total_q), gradients scattered back; a mask_mod and (B, Hq) slopes see the
    sequence's index as b."""
    from cupyattn.reference import (
        attention_backward_reference,
        varlen_attention_backward_reference,
        varlen_attention_reference,
    )

    rng = np.random.default_rng(3)
    cu_q, cu_k = np.array([0, 5, 5, 12]), np.array([0, 7, 9, 13])
    q, dout = (rng.standard_normal((12, 4, 3)) for _ in range(2))
    k, v = (rng.standard_normal((13, 2, 3)) for _ in range(2))
    variants = dict(
        window=(3, -1),
        alibi_slopes=rng.uniform(0, 1, (3, 4)),
        mask_mod=lambda b, h, q_idx, kv_idx: (kv_idx + b) % 3 != 0,
    )
    out, lse = varlen_attention_reference(q, k, v, cu_q, cu_k, causal, 0.5, **variants)
    grads = varlen_attention_backward_reference(dout, q, k, v, cu_q, cu_k, causal, 0.5, **variants)
    assert out.shape == (12, 4, 3) and lse.shape == (4, 12)
    for b in (0, 2):
        rows, keys = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        alone = dict(variants, alibi_slopes=variants["alibi_slopes"][b])
        alone["mask_mod"] = lambda _b, h, q_idx, kv_idx, b=b: (kv_idx + b) % 3 != 0
        o, l = attention_reference(q[None, rows], k[None, keys], v[None, keys], causal, 0.5, **alone)
        np.testing.assert_array_equal(out[rows], o[0])
        np.testing.assert_array_equal(lse[:, rows], l[0])
        want = attention_backward_reference(
            dout[None, rows], q[None, rows], k[None, keys], v[None, keys], causal, 0.5, **alone
        )
        for g, w, where in zip(grads, want, (rows, keys, keys)):
            np.testing.assert_array_equal(g[where], w[0])
    assert np.all(grads[1][7:9] == 0) and np.all(grads[2][7:9] == 0)  # the empty sequence's keys
    for bad in (([0, 5, 3], [0, 7, 9]), ([1, 5], [0, 7]), ([0, 5], [0, 7, 9])):
        with pytest.raises(ValueError, match="cu_seqlens"):
            varlen_attention_reference(q, k, v, *bad)
