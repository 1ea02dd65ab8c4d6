"""Launch-path checks that need no GPU."""

import re
import struct

import numpy as np
import pytest

from cupyattn import api
from cupyattn.device import named_device
from cupyattn.launch import pack
from cupyattn.plan import FwdMmaConfig
from cupyattn.plan.policy import Policy


def test_grids_past_the_limit_are_refused_before_compiling(monkeypatch):
    """A shape needing 2**31 or more blocks gets a clear error, never a launch."""
    monkeypatch.setattr(api, "get_kernel", lambda *args: pytest.fail("compiled or launched"))
    cfg = FwdMmaConfig("float16", "fp16", 64, 128, 64, 4, True)
    with pytest.raises(ValueError, match=r"^q: 2147483648 blocks exceed the grid limit of 2\*\*31 - 1$"):
        api._launch(cfg, named_device("h200"), 2**31, "q", ())


def test_a_policy_that_is_not_one_is_refused_before_anything_else():
    for call in (
        lambda **kw: api.attention(None, None, None, **kw),
        lambda **kw: api.attention_backward(None, None, None, None, None, None, **kw),
    ):
        with pytest.raises(TypeError, match=r"^policy: expected a cupyattn.plan.Policy or None, got dict$"):
            call(policy={"families": {"mma"}})


def test_packed_arguments_sit_in_8_byte_slots_of_their_own_bytes():
    maps = np.zeros(1, np.dtype([("a", np.uint64, 16)]))
    maps["a"] = np.arange(16)
    data, offsets = pack((np.uint64(2**63 + 5), np.int32(-2), np.float32(1.5), np.int64(-7), maps))
    assert offsets == (0, 8, 16, 24, 32) and len(data) == 32 + 128
    assert struct.unpack_from("<Qi4xf4xq", data) == (2**63 + 5, -2, 1.5, -7)
    assert data[32:] == maps.tobytes()
    with pytest.raises(TypeError, match="kernel arguments are NumPy scalars or arrays, got int"):
        pack((5,))


def test_forward_keys_tell_apart_options_that_compare_equal():
    """True == 1 == 1.0, but causal=1 and scale=True are refused where True and 1.0 are not:
    a launch remembered for one is never repeated for the other."""
    arrays = [((1, 8, 2, 64), (2048, 256, 128, 2), "float16", True, 0)] * 3
    options = dict(causal=True, scale=1.0, layout="bshd", smem_limit=None, precision=None, policy=None)
    key = api.forward_key(*arrays, None, None, **options)
    assert key == api.forward_key(*arrays, None, None, **options)
    assert key != api.forward_key(*arrays, None, None, **{**options, "causal": 1})
    assert key != api.forward_key(*arrays, None, None, **{**options, "scale": True})
    assert key != api.forward_key(*arrays, None, None, **{**options, "policy": Policy(families={"mma"})})
    unhashable = api.forward_key(*arrays, None, None, **{**options, "precision": ["fp32"]})
    assert api.known_forward(unhashable) is None  # never remembered, never an error


def test_backward_keys_tell_apart_options_and_given_gradients():
    """As the forward's: deterministic=1 is refused where True is not, gradients the call makes
    (None) differ from given ones, and an unhashable option is never remembered."""
    arrays = [((1, 8, 2, 64), (2048, 256, 128, 2), "float16", True, 0)] * 6
    options = dict(
        causal=True, scale=None, layout="bshd", deterministic=True, smem_limit=None, precision=None, policy=None
    )
    key = api.backward_key(*arrays, None, None, None, **options)
    assert key == api.backward_key(*arrays, None, None, None, **options)
    assert key != api.backward_key(*arrays, None, None, None, **{**options, "deterministic": 1})
    assert key != api.backward_key(*arrays, None, None, None, **{**options, "deterministic": False})
    assert key != api.backward_key(*arrays, arrays[0], None, None, **options)
    unhashable = api.backward_key(*arrays, None, None, None, **{**options, "precision": ["fp32"]})
    assert api.known_backward(unhashable) is None


@pytest.mark.parametrize(
    "shapes, dtypes, options, error, message",
    [
        (((2, 16, 64), (2, 16, 2, 64), (2, 16, 2, 64)), "fp16", {}, ValueError, "q: expected 4 dimensions"),
        (None, ("float16", "float32", "float16"), {}, TypeError, "k: expected dtype float16 (the dtype of q)"),
        (None, ("float64",) * 3, {}, TypeError, "q: expected dtype float16, bfloat16 or float32, got float64"),
        (((2, 16, 4, 64), (3, 16, 2, 64), (2, 16, 2, 64)), "fp16", {}, ValueError, "expected batch 2"),
        (((2, 16, 4, 64), (2, 16, 3, 64), (2, 16, 3, 64)), "fp16", {}, ValueError, "divides the 4 heads of q, got 3"),
        (((2, 16, 4, 64), (2, 17, 2, 64), (2, 16, 2, 64)), "fp16", {}, ValueError, "same seqlen and heads"),
        (((2, 16, 4, 257), (2, 16, 2, 257), (2, 16, 2, 64)), "fp16", {}, ValueError, "q: expected head_dim 1..256"),
        (None, "fp16", {"causal": "diagonal"}, ValueError, "causal: expected False, True"),
        (None, "fp16", {"scale": float("nan")}, ValueError, "scale: expected a finite real number"),
        (None, "fp16", {"layout": "sbhd"}, ValueError, "layout: expected 'bshd' or 'bhsd'"),
        (None, "fp16", {"precision": "tf32"}, ValueError, "precision"),
    ],
)
def test_shapes_and_options_are_checked_without_arrays(shapes, dtypes, options, error, message):
    """check_shapes gives attention's errors from shapes, dtype names and options alone."""
    shapes = shapes or ((2, 16, 4, 64), (2, 16, 2, 64), (2, 16, 2, 64))
    dtypes = ("float16",) * 3 if dtypes == "fp16" else dtypes
    kwargs = dict(causal=False, scale=None, layout="bshd", precision=None) | options
    with pytest.raises(error, match=re.escape(message)):
        api.check_shapes(*shapes, dtypes, **kwargs)


def test_checked_shapes_give_the_problems_sizes_in_either_layout():
    got = api.check_shapes(
        (2, 4, 33, 64), (2, 2, 70, 64), (2, 2, 70, 32), ("bfloat16",) * 3, causal="top_left", scale=None, layout="bhsd"
    )
    assert got == api.Shapes("bfloat16", 2, 33, 70, 4, 2, 64, 32, 0, 0.125, ("bf16",))
