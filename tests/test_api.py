"""Launch-path checks that need no GPU."""

import pytest

from cupyattn import api
from cupyattn.device import named_device
from cupyattn.plan import FwdMmaConfig


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
