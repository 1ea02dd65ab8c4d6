"""Forward kernels on the GPU against the float64 NumPy reference.

Rule (FlashAttention's): max|out - ref64| <= 2 * max|out_same_precision - ref64| + floor.
Fresh random inputs every example; outputs poisoned with NaN before each launch;
strided views whose padding holds NaN, so a read past the logical end shows.
"""

import numpy as np
import pytest
from _gpu_cases import DTYPES, SETTINGS, device_array, problems, rising_keys
from hypothesis import given
from hypothesis import strategies as st

import cupyattn
from cupyattn import testing
from cupyattn.reference import attention_reference, logit_bound, operand_precision, unit_roundoff

pytestmark = pytest.mark.gpu


def run_and_check(
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
    rows=None,
    precision=None,
    policy=None,
):
    rng = np.random.default_rng(seed)
    hq = testing.host_values((B, Sq, Hq, D), dtype, rng)
    hk = testing.host_values((B, Sk, Hkv, D), dtype, rng)
    hv = testing.host_values((B, Sk, Hkv, Dv), dtype, rng)
    q, k, v = (device_array(x, dtype, strided, rng) for x in (hq, hk, hv))
    if layout == "bhsd":
        q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    out_shape = (B, Hq, Sq, Dv) if layout == "bhsd" else (B, Sq, Hq, Dv)
    out = testing.to_device(np.zeros(out_shape, np.float32), dtype)
    testing.poison(out)
    got, lse = cupyattn.attention(
        q,
        k,
        v,
        causal=causal,
        scale=scale,
        layout=layout,
        out=out,
        return_lse=True,
        smem_limit=smem_limit,
        precision=precision,
        policy=policy,
    )
    assert got is out
    got = testing.to_host(out)
    if layout == "bhsd":
        got = got.transpose(0, 2, 1, 3)
    ref, ref_lse = attention_reference(hq, hk, hv, causal=causal, scale=scale, rows=rows)
    operands, out_precision = operand_precision(dtype, precision)
    ref_p, _ = attention_reference(
        hq, hk, hv, causal=causal, scale=scale, rows=rows, precision=operands, out_precision=out_precision
    )
    if rows is not None:
        got, lse_host = got[:, rows], lse.get()[:, :, rows]
    else:
        lse_host = lse.get()
    assert not np.isnan(got).any(), "output has NaN (unwritten or leaked from padding)"
    bound = logit_bound(hq, hk, scale)
    cmp = testing.compare(got, ref, ref_p, operands, Sk, logit_bound=bound)
    assert cmp.ok, str(cmp)
    # float32 inputs rounded to narrower operands move each logit by up to 2u |scale q.k|.
    lse_tol = 2e-5 + (4 * unit_roundoff(operands) * bound if operands != dtype else 0.0)
    np.testing.assert_allclose(lse_host, ref_lse, rtol=lse_tol, atol=lse_tol)
    return cmp


@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(p=problems())
def test_forward_matches_reference(dtype, causal, p):
    run_and_check(dtype=dtype, causal=causal, **p)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [None, 2.0, -0.7, 0.0])
@pytest.mark.parametrize("causal", [False, True])
def test_mma_forward_with_scores_rising_along_the_keys_at_any_scale(dtype, scale, causal):
    """The mma.sync forward (the kernel of sm_80-sm_89, forced here by the policy): keys
    growing along the sequence, so that rows' maxima rise tile after tile, past the
    threshold at which the running max moves and O is rescaled, and stay below it in other
    tiles; a negative scale (the row maximum from the smallest raw score) and a zero one."""
    hq, hk, hv = rising_keys(dtype, seed=23)
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk, hv))
    policy = cupyattn.plan.Policy(families={"mma"})
    out, lse = cupyattn.attention(q, k, v, causal=causal, scale=scale, return_lse=True, policy=policy)
    ref, ref_lse = attention_reference(hq, hk, hv, causal=causal, scale=scale)
    operands, out_precision = operand_precision(dtype, None)
    ref_p, _ = attention_reference(
        hq, hk, hv, causal=causal, scale=scale, precision=operands, out_precision=out_precision
    )
    bound = logit_bound(hq, hk, scale)
    cmp = testing.compare(testing.to_host(out), ref, ref_p, operands, hk.shape[1], logit_bound=bound)
    assert cmp.ok, str(cmp)
    lse_tol = 2e-5 + (4 * unit_roundoff(operands) * bound if operands != dtype else 0.0)
    np.testing.assert_allclose(lse.get(), ref_lse, rtol=lse_tol, atol=lse_tol)


@pytest.mark.parametrize("smem_limit", [101376, 65536])
@pytest.mark.parametrize("dtype", DTYPES)
@SETTINGS
@given(p=problems(), causal=st.sampled_from([False, True, "bottom_right", "top_left"]))
def test_forward_with_smaller_shared_memory(dtype, smem_limit, p, causal):
    run_and_check(dtype=dtype, causal=causal, smem_limit=smem_limit, **p)


@pytest.mark.parametrize("D", [128, 256])
def test_float32_causal_within_the_rtx6000ada_limit(D):
    """float32, causal, B=4, H=4, S=4096 within 101376 bytes (an RTX 6000 Ada's opt-in limit)."""
    rows = np.sort(np.random.default_rng(D).choice(4096, 192, replace=False))
    run_and_check(
        B=4,
        Sq=4096,
        Sk=4096,
        Hq=4,
        Hkv=4,
        D=D,
        Dv=D,
        dtype="float32",
        causal=True,
        smem_limit=101376,
        rows=rows,
        seed=D,
    )


def test_env_smem_limit_is_honoured(monkeypatch):
    monkeypatch.setenv("CUPYATTN_SMEM_LIMIT", "65536")
    run_and_check(B=1, Sq=65, Sk=130, Hq=2, Hkv=1, D=256, Dv=256, dtype="float32", causal=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rows_that_see_no_key_give_zero_and_minus_inf(dtype):
    rng = np.random.default_rng(7)
    q, k, v = (testing.to_device(testing.host_values((2, s, 2, 64), dtype, rng), dtype) for s in (40, 9, 9))
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)  # rows 0..30 see nothing
    host = testing.to_host(out)
    assert np.all(host[:, :31] == 0) and not np.isnan(host).any()
    assert np.all(np.isneginf(lse.get()[:, :, :31])) and np.all(np.isfinite(lse.get()[:, :, 31:]))


@pytest.mark.parametrize("dtype", DTYPES)
def test_packed_qkv_views_need_no_copy(dtype):
    rng = np.random.default_rng(8)
    B, S, H, D = 2, 77, 3, 40
    qkv = testing.to_device(testing.host_values((B, S, 3, H, D), dtype, rng), dtype)
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    assert q.data.ptr - qkv.data.ptr == 0 and not q.flags.c_contiguous
    out = cupyattn.attention(q, k, v, causal=True)
    hq, hk, hv = (testing.to_host(x) for x in (q, k, v))
    ref, _ = attention_reference(hq, hk, hv, causal=True)
    ref_p, _ = attention_reference(hq, hk, hv, causal=True, precision=dtype)
    assert testing.compare(testing.to_host(out), ref, ref_p, dtype, S, logit_bound=logit_bound(hq, hk)).ok


def test_zero_sized_inputs_return_empty_results():
    import cupy

    for shape_q, shape_kv in [((0, 5, 2, 8), (0, 5, 2, 8)), ((1, 0, 2, 8), (1, 5, 2, 8)), ((1, 5, 0, 8), (1, 5, 0, 8))]:
        q = cupy.ones(shape_q, cupy.float16)
        kv = cupy.ones(shape_kv, cupy.float16)
        out, lse = cupyattn.attention(q, kv, kv, return_lse=True)
        assert out.shape == shape_q and lse.shape == (shape_q[0], shape_q[2], shape_q[1])
    q = cupy.ones((1, 3, 2, 8), cupy.float32)
    kv = cupy.ones((1, 0, 2, 8), cupy.float32)
    out, lse = cupyattn.attention(q, kv, kv, return_lse=True)  # no keys: every row sees none
    assert np.all(out.get() == 0) and np.all(np.isneginf(lse.get()))


def _bad_inputs():
    import cupy

    f16 = lambda *s: cupy.ones(s, cupy.float16)
    q, k, v = f16(2, 16, 4, 64), f16(2, 16, 2, 64), f16(2, 16, 2, 64)
    return [
        # (kwargs, exception, message fragment)
        (dict(q=f16(2, 16, 64), k=k, v=v), ValueError, "q: expected 4 dimensions"),
        (dict(q=q, k=k.astype(cupy.float32), v=v), TypeError, "k: expected dtype float16"),
        (
            dict(q=q.astype(cupy.float64), k=k, v=v),
            TypeError,
            "q: expected dtype float16, bfloat16 or float32, got float64",
        ),
        (dict(q=q.astype(cupy.int32), k=k, v=v), TypeError, "got int32"),
        (dict(q=q.get(), k=k, v=v), TypeError, "q: expected a cupy.ndarray in GPU memory, got a numpy.ndarray"),
        (dict(q=q, k=f16(3, 16, 2, 64), v=v), ValueError, "expected batch 2"),
        (dict(q=q, k=f16(2, 16, 2, 32), v=v), ValueError, "k: expected head_dim 64"),
        (dict(q=q, k=f16(2, 16, 3, 64), v=f16(2, 16, 3, 64)), ValueError, "divides the 4 heads of q, got 3"),
        (dict(q=q, k=f16(2, 17, 2, 64), v=v), ValueError, "same seqlen and heads"),
        (dict(q=f16(2, 16, 4, 128)[..., ::2], k=k, v=v), ValueError, "q: expected a contiguous last dimension"),
        (dict(q=f16(2, 16, 4, 0), k=f16(2, 16, 2, 0), v=v), ValueError, "q: expected head_dim 1..256, got 0"),
        (dict(q=f16(2, 16, 4, 257), k=f16(2, 16, 2, 257), v=v), ValueError, "q: expected head_dim 1..256, got 257"),
        (dict(q=q, k=k, v=f16(2, 16, 2, 300)), ValueError, "v: expected head_dim 1..256, got 300"),
        (dict(q=q, k=k, v=v, causal="diagonal"), ValueError, "causal: expected False, True"),
        (dict(q=q, k=k, v=v, scale=float("nan")), ValueError, "scale: expected a finite real number"),
        (dict(q=q, k=k, v=v, layout="sbhd"), ValueError, "layout: expected 'bshd' or 'bhsd'"),
        (dict(q=q, k=k, v=v, out="out_wrong_shape"), ValueError, "out: expected shape (2, 16, 4, 64)"),
        (dict(q=q, k=k, v=v, out="out_wrong_dtype"), TypeError, "out: expected dtype float16"),
        (dict(q=q, k=k, v=v, out="out_strided"), ValueError, "out: expected a contiguous last dimension"),
        (dict(q=q, k=k, v=v, out="out_host"), TypeError, "out: expected a cupy.ndarray"),
    ]


@pytest.mark.parametrize("case", range(20))
def test_bad_input_raises_a_clear_error_and_leaves_out_untouched(case):
    import cupy

    kwargs, exc, fragment = _bad_inputs()[case]
    sentinel = {
        "out_wrong_shape": cupy.full((2, 16, 4, 32), 7, cupy.float16),
        "out_wrong_dtype": cupy.full((2, 16, 4, 64), 7, cupy.float32),
        "out_strided": cupy.full((2, 16, 4, 128), 7, cupy.float16)[..., ::2],
        "out_host": np.full((2, 16, 4, 64), 7, np.float16),
    }
    out = kwargs.get("out")
    if isinstance(out, str):
        out = kwargs["out"] = sentinel[out]
    else:
        out = kwargs["out"] = cupy.full((2, 16, 4, 64), 7, cupy.float16)
    before = cupy.asnumpy(out).copy()
    q, k, v = kwargs.pop("q"), kwargs.pop("k"), kwargs.pop("v")
    with pytest.raises(exc) as info:
        cupyattn.attention(q, k, v, **kwargs)
    assert fragment in str(info.value)
    np.testing.assert_array_equal(cupy.asnumpy(out), before)


def test_compiled_kernel_opts_in_to_exactly_the_planned_bytes():
    from cupyattn.compile import get_kernel
    from cupyattn.device import current_device
    from cupyattn.plan import AttentionProblem, plan_forward

    spec = current_device()
    plan = plan_forward(AttentionProblem("float32", 128, 128, True, 4, 16, 16, 4096, 4096), spec)
    assert plan.smem_bytes > spec.smem_per_block  # past the 48 KiB default
    kernel = get_kernel(plan.config, spec)
    assert kernel.max_dynamic_shared_size_bytes == plan.smem_bytes


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequences_on_the_planned_kernel(dtype, D, causal):
    """Many K/V tiles (pipeline stages wrap many times); Sq != Sk, not multiples of the tiles."""
    rows = np.sort(np.random.default_rng(D).choice(1000, 128, replace=False))
    run_and_check(B=2, Sq=1000, Sk=1531, Hq=4, Hkv=2, D=D, Dv=D, dtype=dtype, causal=causal, rows=rows, seed=D + causal)


def test_long_context_forward_needs_only_the_lse_as_workspace():
    """B=1, H=16, S=65536, D=128 bf16: no Sq x Sk buffer, only out and the O(S) lse."""
    import cupy

    B, S, H, D = 1, 65536, 16, 128
    rng = np.random.default_rng(12)
    hq, hk, hv = (testing.host_values((B, S, H, D), "bfloat16", rng) for _ in range(3))
    q, k, v = (testing.to_device(x, "bfloat16") for x in (hq, hk, hv))
    out = testing.to_device(np.zeros((B, S, H, D), np.float32), "bfloat16")
    cupyattn.attention(q[:, :64], k[:, :64], v[:, :64], causal=True)  # compile outside the count
    hook = testing.peak_allocation_hook()  # (the pool's used_bytes also counts frees of earlier garbage)
    with hook:
        _, lse = cupyattn.attention(q, k, v, causal=True, out=out, return_lse=True)
        cupy.cuda.Device().synchronize()
    assert hook.peak == lse.nbytes == 4 * B * H * S
    rows = np.array([0, 1, 4095, 40000, S - 1])
    ref, _ = attention_reference(hq, hk, hv, causal=True, rows=rows)
    ref_p, _ = attention_reference(hq, hk, hv, causal=True, rows=rows, precision="bfloat16")
    cmp = testing.compare(testing.to_host(out)[:, rows], ref, ref_p, "bfloat16", S, logit_bound=logit_bound(hq, hk))
    assert cmp.ok, str(cmp)


def test_forward_at_64k_keys_allocates_only_out_and_lse():
    """B=1, H=16, S=65536, D=128 bfloat16 runs with O(S) extra device memory
    (the output and the log-sum-exp), never an S x S buffer; sampled rows are exact."""
    B, S, H, D, dtype = 1, 65536, 16, 128, "bfloat16"
    rng = np.random.default_rng(64)
    hq, hk, hv = (testing.host_values((B, S, H, D), dtype, rng) for _ in range(3))
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk, hv))
    cupyattn.attention(q[:, :64], k[:, :64], v[:, :64], causal=True)  # compile outside the count
    hook = testing.peak_allocation_hook()
    with hook:
        out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    assert hook.peak <= out.nbytes + lse.nbytes + (1 << 20), (hook.peak, out.nbytes, lse.nbytes)
    rows = np.sort(rng.choice(S, 48, replace=False))
    ref, _ = attention_reference(hq, hk, hv, causal=True, rows=rows)
    ref_p, _ = attention_reference(hq, hk, hv, causal=True, rows=rows, precision=dtype)
    got = testing.to_host(out)[:, rows]
    cmp = testing.compare(got, ref, ref_p, dtype, S, logit_bound=logit_bound(hq, hk))
    assert cmp.ok, str(cmp)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", [64, 128])
def test_a_repeated_call_repeats_its_launch_bit_for_bit(dtype, D):
    """A second call with arrays described alike (shapes, strides, dtype, 16-byte alignment)
    skips validation and planning; its result at new addresses is the first call's, bit for
    bit. A view that is not 16-byte aligned is described differently and planned anew."""
    import cupy

    from cupyattn import api

    rng = np.random.default_rng(11)
    B, Sq, Sk, H = 2, 300, 333, 4
    host = [testing.host_values((B, s, H, D), dtype, rng) for s in (Sq, Sk, Sk)]
    first, first_lse = cupyattn.attention(*(testing.to_device(x, dtype) for x in host), causal=True, return_lse=True)
    again = [testing.to_device(x, dtype) for x in host]  # the same values at other addresses
    key = api.forward_key(*(api._describe(x) for x in again), None, None, **_OPTIONS)
    if dtype != "float32":  # (float32 launches that read staged tiles are planned every call)
        assert api.known_forward(key) is not None
    second, second_lse = cupyattn.attention(*again, causal=True, return_lse=True)
    for a, b in ((first, second), (first_lse, second_lse)):
        assert cupy.array_equal(a.view(f"u{a.itemsize}"), b.view(f"u{b.itemsize}"))
    shifted = []  # the same values one element past a 16-byte boundary
    for x in host:
        buffer = testing.to_device(np.zeros(x.size + 1, np.float32), dtype)
        view = buffer[1:].reshape(x.shape)
        bits = f"u{view.itemsize}"
        view.view(bits)[...] = testing.to_device(x, dtype).view(bits)
        shifted.append(view)
    assert shifted[0].data.ptr % 16 and api._describe(shifted[0]) != api._describe(again[0])
    third = cupyattn.attention(*shifted, causal=True)
    ref, _ = attention_reference(*host, causal=True)
    ref_p, _ = attention_reference(*host, causal=True, precision=operand_precision(dtype, None)[0])
    assert testing.compare(testing.to_host(third), ref, ref_p, dtype, Sk, logit_bound=logit_bound(*host[:2])).ok


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_lse_is_written_to_a_given_array(dtype):
    """lse= takes the log-sum-exp as return_lse gives it, first call and repeated; a wrong
    shape or a strided view is refused before anything runs, the arrays left untouched."""
    import cupy

    rng = np.random.default_rng(13)
    q, k, v = (testing.to_device(testing.host_values((2, s, 3, 64), dtype, rng), dtype) for s in (50, 70, 70))
    want, want_lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    for _ in range(2):
        lse = cupy.full((2, 3, 50), np.nan, dtype=cupy.float32)
        out, got = cupyattn.attention(q, k, v, causal=True, lse=lse, return_lse=True)
        assert got is lse and cupy.array_equal(lse, want_lse) and cupy.array_equal(out.view("u1"), want.view("u1"))
    for bad, match in (
        (cupy.full((2, 3, 49), np.nan, dtype=cupy.float32), r"^lse: expected shape \(2, 3, 50\), got \(2, 3, 49\)$"),
        (cupy.full((2, 3, 100), np.nan, dtype=cupy.float32)[:, :, ::2], "^lse: expected a C-contiguous array"),
    ):
        out = cupy.full((2, 50, 3, 64), 7, dtype=q.dtype) if dtype == "float32" else None
        with pytest.raises(ValueError, match=match):
            cupyattn.attention(q, k, v, causal=True, lse=bad, out=out)
        assert bool(cupy.isnan(bad).all()) and (out is None or bool((out == 7).all()))


def test_a_new_thread_launches_planned_and_repeated_calls():
    """A thread of its own (whose CUDA context the driver must find bound) runs a first and a
    repeated call on arrays made elsewhere, with the main thread's results bit for bit."""
    import threading

    import cupy

    rng = np.random.default_rng(12)
    q, k, v = (testing.to_device(testing.host_values((2, s, 4, 64), "bfloat16", rng), "bfloat16") for s in (70, 90, 90))
    want = cupyattn.attention(q, k, v, causal="top_left", scale=0.3)
    got = []
    thread = threading.Thread(target=lambda: got.extend(cupyattn.attention(q, k, v, scale=0.3) for _ in range(2)))
    thread.start()
    thread.join()
    ref = cupyattn.attention(q, k, v, scale=0.3)
    assert len(got) == 2 and all(cupy.array_equal(x.view(cupy.uint16), ref.view(cupy.uint16)) for x in got)
    assert not cupy.array_equal(want.view(cupy.uint16), ref.view(cupy.uint16))


_OPTIONS = dict(causal=True, scale=None, layout="bshd", smem_limit=None, precision=None, policy=None)
