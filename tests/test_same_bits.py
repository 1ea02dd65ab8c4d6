"""scripts/same_bits.py's comparison (the GPU part runs on a device: BENCHMARKS.md)."""

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from same_bits import B, CASES, H, build_parser, differing, lengths, worker_command  # noqa: E402


def test_identical_arrays_are_the_same_nan_included():
    x = np.array([1.0, np.nan, -2.5, 0.0], dtype=np.float32)
    assert differing({"a": x}, {"a": x.copy()}) == []


def test_one_ulp_and_the_sign_of_zero_differ():
    x = np.array([1.0, 0.0], dtype=np.float32)
    ulp = x.copy()
    ulp[0] = np.nextafter(np.float32(1.0), np.float32(2.0))
    negative_zero = x.copy()
    negative_zero[1] = -0.0
    assert [k for k, _ in differing({"a": x, "b": x}, {"a": ulp, "b": negative_zero})] == ["a", "b"]
    (_, delta), = differing({"a": x}, {"a": ulp})
    assert delta == np.spacing(np.float32(1.0))


def test_shape_dtype_or_a_missing_array_differ():
    x = np.zeros((2, 3), dtype=np.float32)
    got = differing({"shape": x, "dtype": x, "gone": x}, {"shape": x.reshape(3, 2), "dtype": x.astype(np.float64)})
    assert [k for k, _ in got] == ["dtype", "gone", "shape"]
    assert all(np.isnan(d) for _, d in got)


def test_the_worker_command_line_parses_without_before():
    # The worker is started without --before; a required --before made it exit with a
    # usage error (status 2) on the first H200 run of this script.
    args = build_parser().parse_args(worker_command("some/tree", "out.npz")[2:])
    assert args.worker == ["some/tree", "out.npz"]


def test_the_comparison_without_before_is_a_usage_error(monkeypatch, capsys):
    import pytest

    import same_bits
    monkeypatch.setattr(sys, "argv", ["same_bits.py"])
    with pytest.raises(SystemExit) as exit_info:
        same_bits.main()
    assert exit_info.value.code == 2
    assert "--before" in capsys.readouterr().err


def test_every_case_runs_the_wgmma_kernels_on_the_h200():
    # The comparison is for kernel changes, and the changes of late are in the wgmma
    # kernels: at H=4 and Sq=1000 the planner gave head dim 64's backward and some
    # forwards / dQ passes to mma.sync, which such a change never reaches.
    from cupyattn.device import named_device
    from cupyattn.plan import AttentionProblem, plan_backward, plan_forward

    h200 = named_device("h200")
    for d, causal, precision in CASES:
        problem = AttentionProblem("float32", d, d, causal, B, H, H, *lengths(d), precision=(precision,))
        backward = plan_backward(problem, h200)
        kernels = [plan_forward(problem, h200).config, backward.dkdv.config, backward.dq.config]
        assert all("Wgmma" in type(c).__name__ for c in kernels), (d, causal, precision, kernels)
