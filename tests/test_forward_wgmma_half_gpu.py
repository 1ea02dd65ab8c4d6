"""The float16 / bfloat16 wgmma forward on TMA-loaded tiles (attn_fwd_wgmma_half, sm_90)
against the float64 reference, selected through the planner's policy (run_and_check:
poisoned outputs, a tolerance from a same-precision reference); views a TMA map cannot
describe fall back to the mma.sync forward."""

import numpy as np
import pytest
from _gpu_cases import rising_keys
from test_forward_gpu import run_and_check

from cupyattn import testing
from cupyattn.plan import AttentionProblem, FwdMmaConfig, FwdWgmmaHalfConfig, Policy, plan_forward

pytestmark = pytest.mark.gpu

ONLY_HALF = Policy(families={"wgmma_half"})
HALF_OR_MMA = Policy(families={"wgmma_half", "mma"})
HALF = ("float16", "bfloat16")


@pytest.fixture(autouse=True)
def _hopper():
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("the wgmma forward runs on sm_90 only")


def _plan_of(q, k, v, policy=None):
    from cupyattn.api import _validate
    from cupyattn.device import current_device

    call = _validate(q, k, v, True, None, "bshd")
    return plan_forward(call.problem(), current_device(), policy).config


def _check(**p):
    p.setdefault("Dv", p["D"])
    run_and_check(policy=ONLY_HALF, **p)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [8, 40, 64, 72, 96, 128, 160, 192, 256])
@pytest.mark.parametrize("causal", [False, True, "top_left"])
def test_head_dims(dtype, D, causal):
    _check(B=2, Sq=300, Sk=300, Hq=2, Hkv=2, D=D, dtype=dtype, causal=causal, seed=D)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("Sq,Sk", [(1, 1), (17, 17), (127, 127), (129, 129), (1000, 1000), (1, 300), (300, 17),
                                   (129, 1000), (1000, 129), (65, 200)])  # fmt: skip
@pytest.mark.parametrize("causal", [False, True, "top_left"])
@pytest.mark.parametrize("D", [64, 128, 256])
def test_odd_lengths(dtype, Sq, Sk, causal, D):
    """Partial last tiles of queries and keys (zeros from the TMA), causal bottom-right and
    top-left with Sq != Sk: rows that see no key, blocks with no key tile, a last tile past
    the rows' keys (its V rows zeroed)."""
    _check(B=1, Sq=Sq, Sk=Sk, Hq=2, Hkv=1, D=D, dtype=dtype, causal=causal, seed=Sq * 7 + Sk)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("causal", [False, True])
def test_gqa_strided_and_bhsd(dtype, causal):
    """GQA on views a TMA map describes: rows and heads of a NaN-padded buffer (16-byte
    multiples), and the (B, H, S, D) layout."""
    import cupyattn
    from cupyattn.reference import attention_reference, logit_bound

    rng = np.random.default_rng(3)
    B, Sq, Sk, Hq, Hkv, D = 2, 257, 385, 8, 2, 128
    hq = testing.host_values((B, Sq, Hq, D), dtype, rng)
    hk, hv = (testing.host_values((B, Sk, Hkv, D), dtype, rng) for _ in range(2))

    def padded(x):  # a view into a buffer with 2 more heads and 8 more columns, NaN there
        big = np.full((x.shape[0], x.shape[1], x.shape[2] + 2, x.shape[3] + 8), np.nan, np.float32)
        big[:, :, 1 : 1 + x.shape[2], : x.shape[3]] = x
        return testing.to_device(big, dtype)[:, :, 1 : 1 + x.shape[2], : x.shape[3]]

    q, k, v = (padded(x) for x in (hq, hk, hv))
    assert isinstance(_plan_of(q, k, v, ONLY_HALF), FwdWgmmaHalfConfig)
    out = testing.to_host(cupyattn.attention(q, k, v, causal=causal, policy=ONLY_HALF))
    ref, _ = attention_reference(hq, hk, hv, causal=causal)
    ref_p, _ = attention_reference(hq, hk, hv, causal=causal, precision=dtype)
    assert testing.compare(out, ref, ref_p, dtype, Sk, logit_bound=logit_bound(hq, hk)).ok
    _check(B=2, Sq=200, Sk=200, Hq=6, Hkv=3, D=64, dtype=dtype, causal=causal, layout="bhsd", seed=4, scale=0.3)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("causal", [False, True])
def test_long_sequences(dtype, D, causal):
    """Many K/V tiles: the stages' mbarrier phases wrap many times."""
    rows = np.sort(np.random.default_rng(D).choice(3000, 128, replace=False))
    _check(B=1, Sq=3000, Sk=3500, Hq=4, Hkv=2, D=D, dtype=dtype, causal=causal, rows=rows, seed=D + causal)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("scale", [None, 2.0, -0.7, 0.0])
@pytest.mark.parametrize("causal", [False, True])
def test_scores_rising_along_the_keys_at_any_scale(dtype, scale, causal):
    """Keys growing along the sequence, so that rows' maxima rise tile after tile, past the
    threshold at which the running max moves and O is rescaled, and stay below it in other
    tiles; a negative scale (the row maximum from the smallest raw score) and a zero one (all
    probabilities equal). Output and lse against the float64 reference."""
    import cupyattn
    from cupyattn.reference import attention_reference, logit_bound

    hq, hk, hv = rising_keys(dtype, seed=17)
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk, hv))
    out, lse = cupyattn.attention(q, k, v, causal=causal, scale=scale, return_lse=True, policy=ONLY_HALF)
    ref, ref_lse = attention_reference(hq, hk, hv, causal=causal, scale=scale)
    ref_p, _ = attention_reference(hq, hk, hv, causal=causal, scale=scale, precision=dtype)
    cmp = testing.compare(testing.to_host(out), ref, ref_p, dtype, hk.shape[1], logit_bound=logit_bound(hq, hk, scale))
    assert cmp.ok, str(cmp)
    np.testing.assert_allclose(lse.get(), ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("D", [64, 256])
def test_nan_in_keys_no_row_sees_stays_out(dtype, D):
    """Top-left causal, Sq < Sk: keys from Sq on are seen by no row, but the last key tile
    of a block reaches into them; NaN in K and V there must not reach O (0 * NaN): those V
    rows are zeroed in shared memory."""
    import cupyattn
    from cupyattn.reference import attention_reference, logit_bound

    rng = np.random.default_rng(11)
    B, Sq, Sk, H = 1, 200, 250, 2
    hq = testing.host_values((B, Sq, H, D), dtype, rng)
    hk, hv = (testing.host_values((B, Sk, H, D), dtype, rng) for _ in range(2))
    hk_nan, hv_nan = hk.copy(), hv.copy()
    hk_nan[:, Sq:] = np.nan
    hv_nan[:, Sq:] = np.nan
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk_nan, hv_nan))
    out = testing.to_host(cupyattn.attention(q, k, v, causal="top_left", policy=ONLY_HALF))
    assert not np.isnan(out).any()
    ref, _ = attention_reference(hq, hk, hv, causal="top_left")
    ref_p, _ = attention_reference(hq, hk, hv, causal="top_left", precision=dtype)
    assert testing.compare(out, ref, ref_p, dtype, Sk, logit_bound=logit_bound(hq, hk)).ok


@pytest.mark.parametrize("dtype", HALF)
def test_views_a_tma_map_cannot_describe_fall_back_to_mma_sync(dtype):
    """Reversed rows (negative strides: 16-byte aligned, but no TMA map) take the mma.sync
    forward; the results are right either way."""
    import cupyattn

    rng = np.random.default_rng(5)
    B, S, H, D = 2, 1100, 8, 64  # 144 blocks of 128 rows: the 128-row tiles fill the 132 SMs
    hq, hk, hv = (testing.host_values((B, S, H, D), dtype, rng) for _ in range(3))
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk, hv))
    assert isinstance(_plan_of(q, k, v, HALF_OR_MMA), FwdWgmmaHalfConfig)
    qr = q[:, ::-1]
    assert isinstance(_plan_of(qr, k, v, HALF_OR_MMA), FwdMmaConfig)
    out = testing.to_host(cupyattn.attention(qr, k, v, causal=True))
    from cupyattn.reference import attention_reference, logit_bound

    hqr = np.ascontiguousarray(hq[:, ::-1])
    ref, _ = attention_reference(hqr, hk, hv, causal=True)
    ref_p, _ = attention_reference(hqr, hk, hv, causal=True, precision=dtype)
    assert testing.compare(out, ref, ref_p, dtype, S, logit_bound=logit_bound(hqr, hk)).ok


def test_planned_by_default_on_sm_90():
    from cupyattn.device import current_device

    for dtype in HALF:
        problem = AttentionProblem(dtype, 128, 128, True, 4, 16, 16, 4096, 4096)
        assert isinstance(plan_forward(problem, current_device()).config, FwdWgmmaHalfConfig)
