"""The float64 model behind 3xTF32's per-k-step rounded adds (scripts/tf32_error_model.py):
a chain of truncated float32 additions costs several times the error of adding each
k-step apart, which keeps the float32 accuracy issue 6 asks for. CPU only."""

import importlib.util
from pathlib import Path

import numpy as np

from cupyattn import testing
from cupyattn.reference import attention_reference

_spec = importlib.util.spec_from_file_location(
    "tf32_error_model", Path(__file__).resolve().parents[1] / "scripts" / "tf32_error_model.py")
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


def test_split_parts_hold_the_operand_to_21_bits():
    x = testing.host_values((4096,), "float32", np.random.default_rng(1))
    big, small = model.split(x)
    assert np.all((big.astype(np.float32).view(np.uint32) & 0x1FFF) == 0)  # big is TF32
    assert np.max(np.abs(big + small - x) / np.abs(x)) < 2.0**-21


def test_truncated_chain_loses_float32_accuracy_and_per_k_step_adds_keep_it():
    rng = np.random.default_rng(0)
    S, D = 512, 64
    q, k, v = (testing.host_values((1, S, 2, D), "float32", rng) for _ in range(3))
    rows = np.sort(rng.choice(S, 16, replace=False))
    ref = attention_reference(q, k, v, rows=rows)[0]
    numpy_f32 = np.abs(attention_reference(q, k, v, rows=rows, precision="float32")[0] - ref).max()
    chain, per_k_step = (np.abs(model.forward(q, k, v, rows, per) - ref).max() / numpy_f32
                         for per in (False, True))
    # Against each other, not numpy: numpy's float32 error depends on the BLAS kernel the
    # CPU gets (OpenBLAS picks one per CPU; the chain measured 3.1-6.8x numpy's on one CI
    # machine, 1.6-3.1x on another, seeds 0-3), the per-k-step adds 0.3-0.6x (seeds 0-3).
    assert per_k_step <= 2.0, per_k_step  # issue 6's limit
    assert chain > 3 * per_k_step, (chain, per_k_step)  # seeds 0-3: 4.2-5.3x


def test_wide_score_pairs_are_as_accurate_as_one_k_step_a_fresh_accumulator():
    """words_by_rows with B's parts as rows (two k-steps' big·big and big·small products a
    fresh accumulator, small·big chained over all k-steps) against one k-step a fresh
    accumulator, on the head dims that take it: the same error within a few percent,
    and far from a chain of truncated adds."""
    rng = np.random.default_rng(2)
    for D in (136, 256):
        a = testing.host_values((2, 64, D), "float32", rng)
        b = testing.host_values((2, D, 256), "float32", rng)
        ref = a.astype(np.float64) @ b.astype(np.float64)

        def rms(x):
            return np.sqrt(((x.astype(np.float64) - ref) ** 2).mean())

        per_k_step, wide, chain = (rms(model.product(a, b, per_k_step=True)), rms(model.wide_product(a, b)),
                                   rms(model.product(a, b, per_k_step=False)))
        assert wide <= 1.1 * per_k_step, (D, wide, per_k_step)  # seeds 0-3: 0.95-1.04x
        assert chain > 5 * wide, (D, chain, wide)  # seeds 0-3: 9.9-17.7x
