"""scripts/ab_trees.py without a GPU: its usage errors, and `bits --compare` on result
files written here (the timing and the trees' results need a device)."""

import numpy as np
from _script_runs import script


def _compare(tmp_path, before: dict, after: dict):
    np.savez(tmp_path / "before.npz", **before)
    np.savez(tmp_path / "after.npz", **after)
    return script("ab_trees.py", "bits", "--compare", str(tmp_path / "before.npz"), str(tmp_path / "after.npz"))


def test_identical_arrays_are_the_same_nan_included(tmp_path):
    x = np.array([1.0, np.nan, -2.5, 0.0], dtype=np.float32)
    res = _compare(tmp_path, {"a": x}, {"a": x.copy()})
    assert res.returncode == 0 and res.stdout.splitlines() == ["bitwise: 1 same, 0 differ"], res.stdout + res.stderr


def test_one_ulp_and_the_sign_of_zero_differ(tmp_path):
    x = np.array([1.0, 0.0], dtype=np.float32)
    ulp, negative_zero = x.copy(), x.copy()
    ulp[0] = np.nextafter(np.float32(1.0), np.float32(2.0))
    negative_zero[1] = -0.0
    res = _compare(tmp_path, {"a": x, "b": x, "c": x}, {"a": ulp, "b": negative_zero, "c": x})
    assert res.returncode == 1
    assert res.stdout.splitlines() == [
        f"DIFF a: max |before - after| {np.spacing(np.float32(1.0)):.3e}",
        "DIFF b: max |before - after| 0.000e+00",
        "bitwise: 1 same, 2 differ",
    ]


def test_shape_dtype_or_a_missing_array_differ(tmp_path):
    x = np.zeros((2, 3), dtype=np.float32)
    res = _compare(
        tmp_path, {"shape": x, "dtype": x, "gone": x}, {"shape": x.reshape(3, 2), "dtype": x.astype(np.float64)}
    )
    assert res.returncode == 1
    assert [line.split(":")[0] for line in res.stdout.splitlines()] == [
        "DIFF dtype",
        "DIFF gone",
        "DIFF shape",
        "bitwise",
    ]
    assert all(line.endswith("nan") for line in res.stdout.splitlines()[:3])


def test_a_comparison_without_before_or_with_a_tree_that_is_none_is_a_usage_error(tmp_path):
    for command in ("time", "bits"):
        res = script("ab_trees.py", command)
        assert res.returncode == 2 and "--before: expected the directory of the earlier tree" in res.stderr
        res = script("ab_trees.py", command, "--before", str(tmp_path))
        assert res.returncode == 2 and "expected a directory with cupyattn/ and kernels/" in res.stderr
