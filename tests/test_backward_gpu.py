"""Backward kernels on the GPU against the float64 NumPy reference.

Rule: max|g - ref64| <= 3 * max|g_same_precision - ref64| + floor, for each of dq, dk, dv.
Gradients poisoned with NaN before launch; strided, NaN-padded inputs; GQA; both
causal alignments; the smaller shared-memory limits; determinism; float32 at S = 4096 within
101376 bytes.
"""

import numpy as np
import pytest
from _gpu_cases import DTYPES, NO_MMA_BACKWARD, SETTINGS, device_array, problems
from hypothesis import given
from hypothesis import strategies as st

import cupyattn
from cupyattn import testing
from cupyattn.reference import (
    attention_backward_reference,
    cancellation_unit,
    delta_cancellation_error,
    logit_bound,
    operand_precision,
)

pytestmark = pytest.mark.gpu


def _inputs(B, Sq, Sk, Hq, Hkv, D, Dv, dtype, layout, strided, seed):
    rng = np.random.default_rng(seed)
    host = [
        testing.host_values(shape, dtype, rng)
        for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, Dv), (B, Sq, Hq, Dv))
    ]
    dev = [device_array(x, dtype, strided, rng) for x in host]
    if layout == "bhsd":
        dev = [x.transpose(0, 2, 1, 3) for x in dev]
    return host, dev


def _poisoned_like(x, dtype):
    g = testing.to_device(np.zeros(x.shape, np.float32), dtype)
    testing.poison(g)
    return g


def run_backward_and_check(
    *,
    B,
    Sq,
    Sk,
    Hq,
    Hkv,
    D,
    Dv,
    dtype,
    causal,
    scale=None,
    layout="bshd",
    strided=False,
    smem_limit=None,
    seed=0,
    precision=None,
    deterministic=True,
    policy=None,
):
    (hq, hk, hv, hdo), (q, k, v, dout) = _inputs(B, Sq, Sk, Hq, Hkv, D, Dv, dtype, layout, strided, seed)
    out, lse = cupyattn.attention(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        layout=layout,
        return_lse=True,
        smem_limit=smem_limit,
        precision=precision,
        policy=policy,
    )
    grads = [_poisoned_like(x, dtype) for x in (q, k, v)]
    got = cupyattn.attention_backward(
        dout,
        q,
        k,
        v,
        out,
        lse,
        causal=causal,
        scale=scale,
        layout=layout,
        dq=grads[0],
        dk=grads[1],
        dv=grads[2],
        smem_limit=smem_limit,
        precision=precision,
        deterministic=deterministic,
        policy=policy,
    )
    assert all(a is b for a, b in zip(got, grads))
    ref = attention_backward_reference(hdo, hq, hk, hv, causal=causal, scale=scale)
    operands, out_precision = operand_precision(dtype, precision)
    ref_p = attention_backward_reference(
        hdo, hq, hk, hv, causal=causal, scale=scale, precision=operands, out_precision=out_precision
    )
    # Longest float32 sum behind any gradient element: over queries (dK, dV), keys (dQ), or
    # the head dims of dP = dO V^T and delta = rowsum(dO O), whose difference cancels
    # exactly where a row's probability sits on one key; the rounding noise left there
    # reaches dQ and dK at its own size, not theirs (delta_cancellation_error).
    reduction = max(Sq * (Hq // Hkv), Sk, D, Dv)
    bound = logit_bound(hq, hk, scale)
    cancellation = (
        *delta_cancellation_error(
            hdo, hq, hk, hv, causal=causal, scale=scale, unit=cancellation_unit(dtype, precision)
        ),
        0.0,
    )
    for name, g, r, rp, extra in zip(("dq", "dk", "dv"), got, ref, ref_p, cancellation):
        g = testing.to_host(g)
        if layout == "bhsd":
            g = g.transpose(0, 2, 1, 3)
        assert not np.isnan(g).any(), f"{name} has NaN (unwritten or leaked from padding)"
        cmp = testing.compare(g, r, rp, operands, reduction, factor=3.0, logit_bound=bound, extra=extra)
        assert cmp.ok, f"{name}: {cmp}"


@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(p=problems())
def test_backward_matches_reference(dtype, causal, p):
    run_backward_and_check(dtype=dtype, causal=causal, **p)


@pytest.mark.parametrize("smem_limit", [101376, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(p=problems(), causal=st.sampled_from([False, True, "top_left"]))
def test_backward_with_smaller_shared_memory(dtype, smem_limit, p, causal):
    run_backward_and_check(dtype=dtype, causal=causal, smem_limit=smem_limit, **p)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key_get_zero_gradients(dtype):
    run_backward_and_check(B=2, Sq=40, Sk=9, Hq=2, Hkv=1, D=64, Dv=64, dtype=dtype, causal=True)
    (_, _, _, _), (q, k, v, dout) = _inputs(1, 40, 9, 2, 2, 32, 32, dtype, "bshd", False, 3)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    dq = testing.to_host(dq)
    assert np.all(dq[:, :31] == 0) and not np.isnan(dq).any()


def _same_bits_call_after_call(backward, calls: int, word):
    """backward() returns the gradients of its first call, bit for bit (compared as `word`
    integers), `calls` more times."""
    first = [g.copy() for g in backward()]
    for _ in range(calls):
        for a, b in zip(first, backward()):
            assert bool((a.view(word) == b.view(word)).all())


@pytest.mark.parametrize("D", [64, 256])
def test_deterministic_backward_is_bitwise_reproducible(D):
    (_, _, _, _), (q, k, v, dout) = _inputs(32, 96, 96, 4, 2, D, D, "float16", "bshd", False, 11)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    _same_bits_call_after_call(
        lambda: cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True), 50, np.uint16
    )


def _fused_half_policy(dtype, D, ordered):
    """A policy that plans the float16 / bfloat16 fused pass at head dim D (``ordered``: its
    deterministic form), checked to be what the planner then gives on this GPU."""
    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("the fused pass runs on sm_90")
    where = {("bf16" if dtype == "bfloat16" else "fp16", P.mma_head_dim_pad(D))}
    policy = P.Policy(fused_where=where if not ordered else (), ordered_fused_where=where if ordered else ())
    problem = P.AttentionProblem(dtype, D, D, True, 1, 4, 2, 300, 300, deterministic=ordered)
    cfg = P.plan_backward(problem, current_device(), policy).dkdv.config
    assert isinstance(cfg, P.BwdFusedWgmmaHalfConfig) and cfg.ordered == ordered
    return policy


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("dtype,D", [("bfloat16", 64), ("float16", 80), ("bfloat16", 128)])
def test_fused_half_backward_matches_reference(dtype, D, causal, ordered):
    """The float16 / bfloat16 fused pass (dQ tiles added by the TMA's bulk reduction;
    ordered: each key block in its turn, deterministic=True) on GQA 4:2 with odd lengths,
    Sq < Sk and Sq > Sk, strided inputs, poisoned gradients."""
    policy = _fused_half_policy(dtype, D, ordered)
    for Sq, Sk in ((333, 517), (517, 200)):
        run_backward_and_check(
            B=2,
            Sq=Sq,
            Sk=Sk,
            Hq=4,
            Hkv=2,
            D=D,
            Dv=D,
            dtype=dtype,
            causal=causal,
            strided=True,
            seed=Sq + D,
            deterministic=ordered,
            policy=policy,
        )


@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("dtype,D", [("bfloat16", 256), ("float16", 200)])
def test_split_scores_half_backward_matches_reference(dtype, D, causal):
    """The float16 / bfloat16 dK/dV pass whose warpgroup pairs split each query tile's scores
    (d_split 2: P^T and dS^T through shared tiles), as planned past head dim 192, on GQA 8:4
    with odd lengths, Sq < Sk and Sq > Sk, strided inputs, poisoned gradients (enough key
    blocks to fill an H100 or H200, which the planner asks of this tile)."""
    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("the wgmma passes run on sm_90")
    for Sq, Sk in ((333, 517), (700, 520)):
        problem = P.AttentionProblem(dtype, D, D, bool(causal), 4, 8, 4, Sq, Sk)
        cfg = P.plan_backward(problem, current_device()).dkdv.config
        assert isinstance(cfg, P.BwdDkdvWgmmaHalfConfig) and cfg.split_scores, cfg.name_expression
        run_backward_and_check(
            B=4, Sq=Sq, Sk=Sk, Hq=8, Hkv=4, D=D, Dv=D, dtype=dtype, causal=causal, strided=True, seed=Sq + D
        )


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_ordered_fused_half_backward_is_bitwise_reproducible(D, causal):
    """The deterministic fused pass: up to 9 key blocks add to each query tile's dQ of each
    of the 4 query heads of a GQA group, each block in its turn, so that every call gives
    the same bits."""
    policy = _fused_half_policy("bfloat16", D, True)
    (_, _, _, _), (q, k, v, dout) = _inputs(2, 1100, 1100, 8, 2, D, D, "bfloat16", "bshd", False, 5)
    out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True)
    _same_bits_call_after_call(
        lambda: cupyattn.attention_backward(dout, q, k, v, out, lse, causal=causal, deterministic=True, policy=policy),
        30,
        np.uint16,
    )


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_float32_backward_on_tensor_cores_is_bitwise_reproducible(precision):
    """As the float16 case, for float32's tensor-core passes (on an sm_90 GPU the wgmma dK/dV
    and dQ passes, mma.sync's tiles taken away; "fp32" with its producer warpgroups) on a
    GQA group, causal, last tiles partial: their order of adds is fixed (dK/dV's query
    tiles from the last down), never the order in which blocks finish."""
    from cupyattn import plan as P
    from cupyattn.device import current_device

    spec = current_device()
    if spec.compute_capability == (9, 0):
        bplan = P.plan_backward(
            P.AttentionProblem("float32", 256, 256, True, 1, 4, 2, 1000, 1000, precision=(precision,)),
            spec,
            NO_MMA_BACKWARD,
        )
        assert isinstance(bplan.dkdv.config, P.BwdDkdvWgmmaConfig)
        assert isinstance(bplan.dq.config, P.BwdDqWgmmaConfig)
    (_, _, _, _), (q, k, v, dout) = _inputs(1, 1000, 1000, 4, 2, 256, 256, "float32", "bshd", False, 12)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True, precision=precision)
    _same_bits_call_after_call(
        lambda: cupyattn.attention_backward(
            dout, q, k, v, out, lse, causal=True, precision=precision, policy=NO_MMA_BACKWARD
        ),
        20,
        np.uint32,
    )


@pytest.mark.parametrize("D", [128, 256])
def test_float32_causal_forward_and_backward_within_the_rtx6000ada_limit(D):
    """float32, causal, B=4, H=4, S=4096 within 101376 bytes (an RTX 6000 Ada's opt-in limit)."""
    from cupyattn.reference import attention_reference

    B, S, H = 4, 4096, 4
    (hq, hk, hv, hdo), (q, k, v, dout) = _inputs(B, S, S, H, H, D, D, "float32", "bshd", False, D)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True, smem_limit=101376)
    dq, dk, dv = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True, smem_limit=101376)
    rng = np.random.default_rng(D)
    b = 1  # one batch element against the full reference (all rows feed dk, dv)
    rows = np.sort(rng.choice(S, 256, replace=False))
    ref_out, _ = attention_reference(hq[b : b + 1], hk[b : b + 1], hv[b : b + 1], causal=True, rows=rows)
    ref_out_p, _ = attention_reference(
        hq[b : b + 1], hk[b : b + 1], hv[b : b + 1], causal=True, rows=rows, precision="float32"
    )
    bound = logit_bound(hq[b], hk[b])
    assert testing.compare(
        testing.to_host(out)[b : b + 1][:, rows], ref_out, ref_out_p, "float32", S, logit_bound=bound
    ).ok
    ref = attention_backward_reference(hdo[b : b + 1], hq[b : b + 1], hk[b : b + 1], hv[b : b + 1], causal=True)
    ref_p = attention_backward_reference(
        hdo[b : b + 1], hq[b : b + 1], hk[b : b + 1], hv[b : b + 1], causal=True, precision="float32"
    )
    for name, g, r, rp in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, ref_p):
        cmp = testing.compare(
            testing.to_host(g)[b : b + 1][:, rows], r[:, rows], rp[:, rows], "float32", S, factor=3.0, logit_bound=bound
        )
        assert cmp.ok, f"{name}: {cmp}"


def _bad_backward_inputs():
    import cupy

    f16 = lambda *s: cupy.ones(s, cupy.float16)
    q, k, v = f16(2, 16, 4, 64), f16(2, 16, 2, 64), f16(2, 16, 2, 64)
    out, dout = f16(2, 16, 4, 64), f16(2, 16, 4, 64)
    lse = cupy.zeros((2, 4, 16), cupy.float32)
    base = dict(dout=dout, q=q, k=k, v=v, out=out, lse=lse)
    return [
        (dict(base, dout=f16(2, 16, 4, 32)), ValueError, "dout: expected shape (2, 16, 4, 64)"),
        (dict(base, dout=dout.astype(cupy.float32)), TypeError, "dout: expected dtype float16"),
        (dict(base, dout=dout.get()), TypeError, "dout: expected a cupy.ndarray in GPU memory"),
        (dict(base, out=f16(2, 15, 4, 64)), ValueError, "out: expected shape (2, 16, 4, 64)"),
        (dict(base, lse=lse[:, :, :8]), ValueError, "lse: expected shape (2, 4, 16)"),
        (dict(base, lse=lse.astype(cupy.float16)), TypeError, "lse: expected dtype float32"),
        (
            dict(base, lse=cupy.zeros((2, 16, 4), cupy.float32).transpose(0, 2, 1)),
            ValueError,
            "lse: expected a C-contiguous array",
        ),
        (dict(base, k=f16(2, 16, 3, 64), v=f16(2, 16, 3, 64)), ValueError, "divides the 4 heads of q"),
        (dict(base, q=q.astype(cupy.float64)), TypeError, "q: expected dtype float16, bfloat16 or float32"),
        (dict(base, causal="sideways"), ValueError, "causal: expected False, True"),
        (dict(base, deterministic="yes"), TypeError, "deterministic: expected True or False"),
        (dict(base, dk=f16(2, 16, 4, 64)), ValueError, "dk: expected shape (2, 16, 2, 64)"),
    ]


@pytest.mark.parametrize("case", range(12))
def test_bad_backward_input_raises_before_launch_and_leaves_outputs_untouched(case):
    import cupy

    kwargs, exc, fragment = _bad_backward_inputs()[case]
    for name, shape in (("dq", (2, 16, 4, 64)), ("dk", (2, 16, 2, 64)), ("dv", (2, 16, 2, 64))):
        kwargs.setdefault(name, cupy.full(shape, 7, cupy.float16))
    before = {n: cupy.asnumpy(kwargs[n]).copy() for n in ("dq", "dk", "dv")}
    args = [kwargs.pop(n) for n in ("dout", "q", "k", "v", "out", "lse")]
    with pytest.raises(exc) as info:
        cupyattn.attention_backward(*args, **kwargs)
    assert fragment in str(info.value)
    for n, b in before.items():
        np.testing.assert_array_equal(cupy.asnumpy(kwargs[n]), b)
