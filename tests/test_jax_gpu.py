"""cupyattn from JAX, eager and under jax.jit, grad and vmap, against the float64
references and JAX's own attention. Skipped without jax or without a GPU that JAX sees."""

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


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("jit", [False, True])
def test_forward_and_grad_match_the_references(dtype, causal, jit):
    rng = np.random.default_rng(0)
    B, Sq, Sk, Hq, Hkv, D = 2, 50, 70, 4, 2, 64
    hq, hk, hv, hdo = (
        testing.host_values(s, dtype, rng) for s in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D))
    )
    q, k, v, dout = (jnp.asarray(x, dtype=dtype) for x in (hq, hk, hv, hdo))
    staged = jax.jit if jit else (lambda f: f)
    out, vjp = staged(lambda a, b, c: jax.vjp(lambda a, b, c: ca_jax.attention(a, b, c, causal), a, b, c))(q, k, v)
    bound = logit_bound(hq, hk)
    ref, _ = attention_reference(hq, hk, hv, causal=causal)
    ref_p, _ = attention_reference(hq, hk, hv, causal=causal, precision=dtype)
    cmp = testing.compare(np.asarray(out, np.float32), ref, ref_p, dtype, Sk, logit_bound=bound)
    assert cmp.ok, str(cmp)
    grads = staged(vjp)(dout)
    refs = attention_backward_reference(hdo, hq, hk, hv, causal=causal)
    refs_p = attention_backward_reference(hdo, hq, hk, hv, causal=causal, precision=dtype)
    for name, g, r, rp in zip(("dq", "dk", "dv"), grads, refs, refs_p):
        cmp = testing.compare(
            np.asarray(g, np.float32), r, rp, dtype, max(Sq * 2, Sk, D), factor=3.0, logit_bound=bound
        )
        assert cmp.ok, f"{name}: {cmp}"


def test_jit_of_grad_gives_the_eager_gradients_bit_for_bit():
    rng = np.random.default_rng(1)
    q, k, v = (jnp.asarray(testing.host_values((2, s, 4, 64), "bfloat16", rng), "bfloat16") for s in (33, 130, 130))

    def loss(q, k, v):
        return (ca_jax.attention(q, k, v, causal="top_left").astype("float32") ** 2).sum()

    eager = jax.grad(loss, (0, 1, 2))(q, k, v)
    staged = jax.jit(jax.grad(loss, (0, 1, 2)))
    for _ in range(2):  # compiled once, run twice (new result buffers each time)
        for name, a, b in zip(("dq", "dk", "dv"), eager, staged(q, k, v)):
            assert np.array_equal(np.asarray(a), np.asarray(b)), name


def test_vmap_over_a_leading_axis_is_the_call_on_the_folded_batch():
    """vmap with q mapped and k, v shared: out and gradients are those of one call on the
    batch that folds the mapped axis in (k, v repeated)."""
    rng = np.random.default_rng(2)
    V, B, S, H, D = 3, 2, 40, 2, 64
    q = jnp.asarray(testing.host_values((V, B, S, H, D), "float32", rng))
    k, v = (jnp.asarray(testing.host_values((B, 60, H, D), "float32", rng)) for _ in range(2))

    def loss(q, k, v):
        return (ca_jax.attention(q, k, v, causal=True) ** 2).sum()

    mapped = jax.jit(jax.vmap(jax.value_and_grad(loss, (0, 1, 2)), in_axes=(0, None, None)))
    values, grads = mapped(q, k, v)
    for i in range(V):  # (per example: the planner may tile a batch of B otherwise than one of V * B)
        value, want = jax.value_and_grad(loss, (0, 1, 2))(q[i], k, v)
        np.testing.assert_allclose(values[i], value, rtol=1e-5)
        for name, got, w in zip(("dq", "dk", "dv"), grads, want):
            np.testing.assert_allclose(np.asarray(got[i]), np.asarray(w), rtol=1e-5, atol=1e-6, err_msg=name)
    folded = ca_jax.attention(q.reshape(V * B, S, H, D), *(jnp.tile(x, (V, 1, 1, 1)) for x in (k, v)), causal=True)
    out = jax.vmap(lambda q: ca_jax.attention(q, k, v, causal=True))(q)
    assert np.array_equal(np.asarray(out).reshape(folded.shape), np.asarray(folded))


def test_a_small_transformer_trains_like_xla_attention_for_20_steps():
    """A one-block causal transformer in plain JAX, 20 SGD steps under jit, with cupyattn and
    with jax.nn.dot_product_attention(implementation="xla"): the losses agree step by step
    (matrix products in full float32, as cupyattn's default float32 mode computes)."""
    B, S, E, H = 2, 64, 128, 4
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    params = {n: jax.random.normal(key, (E, E)) * E**-0.5 for n, key in zip(("wq", "wk", "wv", "wo", "w1"), keys)}
    x = jax.random.normal(keys[5], (B, S, E))
    target = jnp.roll(x, -1, axis=1)

    def model(params, x, attend):
        heads = lambda w: (x @ w).reshape(B, S, H, E // H)
        a = attend(heads(params["wq"]), heads(params["wk"]), heads(params["wv"])).reshape(B, S, E)
        h = x + a @ params["wo"]
        return h + jax.nn.gelu(h @ params["w1"])

    ours = lambda q, k, v: ca_jax.attention(q, k, v, causal=True)
    xla = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    losses = {}
    for name, attend in (("cupyattn", ours), ("xla", xla)):

        @jax.jit
        def step(p, attend=attend):
            value, grads = jax.value_and_grad(lambda p: jnp.mean((model(p, x, attend) - target) ** 2))(p)
            return value, jax.tree.map(lambda a, g: a - 0.1 * g, p, grads)

        p, losses[name] = params, []
        with jax.default_matmul_precision("highest"):
            for _ in range(20):
                value, p = step(p)
                losses[name].append(float(value))
    np.testing.assert_allclose(losses["cupyattn"], losses["xla"], rtol=2e-4)
    assert losses["cupyattn"][-1] < losses["cupyattn"][0]


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


def test_the_policy_reaches_the_forward_and_the_backward_planner():
    """A policy without any forward family fails the forward; one without any dK/dV tile
    lets the forward run and fails the backward: both passes plan with it."""
    from cupyattn.plan import Policy

    q, k, v = (jnp.ones((1, 40, 2, 64), dtype="float16") for _ in range(3))
    # (the planner runs when XLA calls back, and JAX reports its error as a runtime error)
    with pytest.raises(Exception, match="no forward configuration fits"):
        ca_jax.attention(q, k, v, policy=Policy(families={"wgmma"})).block_until_ready()  # wgmma: float32 alone
    no_dkdv = Policy(tiles={"bwd_dkdv_wgmma_half": (), "bwd_dkdv_mma": (), "bwd_dkdv_simt": ()})
    ca_jax.attention(q, k, v, policy=no_dkdv).block_until_ready()
    with pytest.raises(Exception, match="no backward dK/dV configuration fits"):
        jax.grad(lambda a: ca_jax.attention(a, k, v, policy=no_dkdv).sum().astype("float32"))(q).block_until_ready()
