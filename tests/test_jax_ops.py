"""cupyattn.jax traced without a GPU: result shapes under jit, grad and vmap, and the
errors a call gives when it is traced, before anything runs. Skipped without jax."""

import pytest

jax = pytest.importorskip("jax")
jnp = pytest.importorskip("jax.numpy")

import cupyattn.jax as ca_jax  # noqa: E402


def _shapes(*shapes, dtype="bfloat16"):
    return [jax.ShapeDtypeStruct(s, dtype) for s in shapes]


def test_results_have_the_shapes_of_out_and_the_gradients():
    q, k, v = _shapes((2, 40, 4, 64), (2, 70, 2, 64), (2, 70, 2, 32))
    out = jax.eval_shape(lambda q, k, v: ca_jax.attention(q, k, v, causal=True), q, k, v)
    assert (out.shape, out.dtype) == ((2, 40, 4, 32), jnp.bfloat16)

    def loss(q, k, v):
        return ca_jax.attention(q, k, v, causal="top_left", deterministic=False).astype("float32").sum()

    grads = jax.eval_shape(jax.jit(jax.grad(loss, (0, 1, 2))), q, k, v)
    assert [(g.shape, g.dtype) for g in grads] == [(x.shape, x.dtype) for x in (q, k, v)]


def test_vmap_maps_leading_axes_and_broadcasts_unmapped_arguments():
    q = _shapes((3, 2, 4, 40, 64))[0]  # vmapped over 3, layout bhsd
    k, v = _shapes((2, 2, 70, 64), (2, 2, 70, 64))
    mapped = jax.vmap(lambda q: ca_jax.attention(q, k, v, layout="bhsd"))
    out = jax.eval_shape(mapped, q)
    assert out.shape == (3, 2, 4, 40, 64)


@pytest.mark.parametrize(
    "shapes, options, error, message",
    [
        (((2, 40, 64), (2, 70, 2, 64), (2, 70, 2, 64)), {}, ValueError, "q: expected 4 dimensions"),
        (((2, 40, 3, 64), (2, 70, 2, 64), (2, 70, 2, 64)), {}, ValueError, "divides the 3 heads of q, got 2"),
        (((2, 40, 4, 64), (2, 70, 2, 64), (2, 70, 2, 64)), {"causal": "diagonal"}, ValueError, "causal: expected"),
        (((2, 40, 4, 64), (2, 70, 2, 64), (2, 70, 2, 64)), {"deterministic": 1}, TypeError, "deterministic: expected"),
        (((2, 40, 4, 64), (2, 70, 2, 64), (2, 70, 2, 64)), {"policy": {}}, TypeError, "policy: expected"),
    ],
)
def test_a_bad_call_fails_when_traced(shapes, options, error, message):
    args = _shapes(*shapes)
    with pytest.raises(error, match=message):
        jax.eval_shape(jax.jit(lambda q, k, v: ca_jax.attention(q, k, v, **options)), *args)


def test_gradients_under_vmap_have_the_mapped_shapes():
    q = _shapes((3, 2, 40, 4, 64), dtype="float32")[0]
    k, v = _shapes((2, 70, 2, 64), (2, 70, 2, 64), dtype="float32")

    def loss(q, k, v):
        return ca_jax.attention(q, k, v, causal=True).sum()

    grads = jax.eval_shape(jax.vmap(jax.grad(loss, (0, 1, 2)), in_axes=(0, None, None)), q, k, v)
    assert [g.shape for g in grads] == [(3, 2, 40, 4, 64), (3, 2, 70, 2, 64), (3, 2, 70, 2, 64)]


def test_arrays_off_the_gpu_are_refused_when_called():
    q, k, v = (jnp.ones(s, dtype="float16") for s in ((1, 8, 2, 16), (1, 8, 2, 16), (1, 8, 2, 16)))
    if any(d.platform == "gpu" for d in q.devices()):
        pytest.skip("the default device is a GPU here")
    with pytest.raises(ValueError, match="^q: expected an array on a CUDA GPU, got one on cpu$"):
        ca_jax.attention(q, k, v)
