"""cupyattn from JAX: eager forward and jax.grad against the float64 references.
Skipped without jax or without a GPU that JAX sees."""

import os

import numpy as np
import pytest

from cupyattn import testing
from cupyattn.reference import attention_backward_reference, attention_reference, logit_bound

pytestmark = pytest.mark.gpu
# JAX would take 75% of the GPU's memory on first use, starving the other test workers.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")
if not any(d.platform == "gpu" for d in jax.devices()):
    pytest.skip("JAX sees no GPU", allow_module_level=True)

import cupyattn.jax as ca_jax  # noqa: E402


@pytest.mark.parametrize("dtype", ["float16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_grad_match_the_references(dtype, causal):
    rng = np.random.default_rng(0)
    B, Sq, Sk, Hq, Hkv, D = 2, 50, 70, 4, 2, 64
    hq, hk, hv, hdo = (
        testing.host_values(s, dtype, rng) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D))
    )
    q, k, v, dout = (jnp.asarray(x, dtype=dtype) for x in (hq, hk, hv, hdo))
    out = ca_jax.attention(q, k, v, causal)
    bound = logit_bound(hq, hk)
    ref, _ = attention_reference(hq, hk, hv, causal=causal)
    ref_p, _ = attention_reference(hq, hk, hv, causal=causal, precision=dtype)
    cmp = testing.compare(np.asarray(out, np.float32), ref, ref_p, dtype, Sk, logit_bound=bound)
    assert cmp.ok, str(cmp)
    _, vjp = jax.vjp(lambda a, b, c: ca_jax.attention(a, b, c, causal), q, k, v)
    grads = vjp(dout)
    refs = attention_backward_reference(hdo, hq, hk, hv, causal=causal)
    refs_p = attention_backward_reference(hdo, hq, hk, hv, causal=causal, precision=dtype)
    for name, g, r, rp in zip(("dq", "dk", "dv"), grads, refs, refs_p):
        cmp = testing.compare(
            np.asarray(g, np.float32), r, rp, dtype, max(Sq * 2, Sk, D), factor=3.0, logit_bound=bound
        )
        assert cmp.ok, f"{name}: {cmp}"


@pytest.mark.parametrize("precision", ["tf32", ["bf16", "fp32"]])
def test_precision_reaches_the_forward_and_the_backward(precision):
    import cupy

    import cupyattn

    rng = np.random.default_rng(8)
    hq, hk, hv, hdo = (testing.host_values((1, 70, 2, 64), "float32", rng) for _ in range(4))
    q, k, v, dout = (jnp.asarray(x) for x in (hq, hk, hv, hdo))
    out, vjp = jax.vjp(lambda a, b, c: ca_jax.attention(a, b, c, True, precision=precision), q, k, v)
    cq, ck, cv, cdo = (cupy.asarray(x) for x in (hq, hk, hv, hdo))
    want, lse = cupyattn.attention(cq, ck, cv, causal=True, precision=precision, return_lse=True)
    want_grads = cupyattn.attention_backward(cdo, cq, ck, cv, want, lse, causal=True, precision=precision)
    for name, g, w in zip(("out", "dq", "dk", "dv"), (out, *vjp(dout)), (want, *want_grads)):
        assert np.array_equal(np.asarray(g), w.get()), name
    assert not np.array_equal(np.asarray(out), np.asarray(ca_jax.attention(q, k, v, True))), "default mode"


def test_under_jit_it_says_why_it_cannot_run():
    q = jnp.ones((1, 8, 1, 16), dtype="float16")
    with pytest.raises(TypeError, match="runs eagerly"):
        jax.jit(lambda x: ca_jax.attention(x, x, x))(q)


def test_the_policy_reaches_the_forward_and_the_backward_planner():
    """A policy without any forward family fails the forward; one without any dK/dV tile
    lets the forward run and fails the backward: both passes plan with it."""
    from cupyattn.plan import PlanError, Policy

    q, k, v = (jnp.ones((1, 40, 2, 64), dtype="float16") for _ in range(3))
    with pytest.raises(PlanError, match="no forward configuration fits"):
        ca_jax.attention(q, k, v, policy=Policy(families={"wgmma"}))  # wgmma runs float32 alone
    no_dkdv = Policy(tiles={"bwd_dkdv_wgmma_half": (), "bwd_dkdv_mma": (), "bwd_dkdv_simt": ()})
    ca_jax.attention(q, k, v, policy=no_dkdv)
    with pytest.raises(PlanError, match="no backward dK/dV configuration fits"):
        jax.grad(lambda a: ca_jax.attention(a, k, v, policy=no_dkdv).sum().astype("float32"))(q)
