"""Compile-only checks through NVRTC (no GPU needed): resources, layout agreement, packaging."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cupyattn import compile as cc
from cupyattn.device import named_device
from cupyattn.plan import (AttentionProblem, BwdDeltaConfig, FwdSimtConfig, check_expression,
                           plan_backward, plan_forward)


def _nvrtc_reason():
    try:
        from cupy.cuda import nvrtc

        nvrtc.getVersion()
    except Exception as exc:
        return f"NVRTC not available ({type(exc).__name__}: {exc})"
    if not cc.cuda_include_dirs():
        return "CUDA headers (cuda_fp16.h) not found; pip install 'cuda-toolkit[cudart]'"
    return None


pytestmark = pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))

# Representative forward configs: each dtype at head dims 64 / 128 / 256 as planned
# for a big (H100) and a small (T4-sized, 64 KiB) shared memory, causal and not.
REPRESENTATIVE = sorted({
    plan_forward(AttentionProblem(dtype, d, d, causal, 4, 16, 16, 4096, 4096), named_device(dev)).config
    for dtype in ("float16", "bfloat16", "float32")
    for d in (64, 128, 256)
    for dev, causal in (("h100", True), ("t4", False))
}, key=lambda c: c.name_expression)


REPRESENTATIVE_BWD = sorted({
    plan.config
    for dtype in ("float16", "float32")
    for d in (64, 128, 256)
    for dev, causal in (("h100", True), ("t4", False))
    for plan in plan_backward(AttentionProblem(dtype, d, d, causal, 4, 16, 16, 4096, 4096),
                              named_device(dev)).plans
} | {BwdDeltaConfig("bfloat16")}, key=lambda c: c.name_expression)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("config", REPRESENTATIVE + REPRESENTATIVE_BWD, ids=lambda c: c.name_expression.replace("cupyattn::", ""))
def test_planned_forward_compiles_without_spills(config, arch):
    report = cc.compile_only(config, arch)
    assert report.spills == 0, report.log
    assert report.stack_bytes == 0, report.log
    assert report.static_smem_bytes == 0  # all shared memory is the planned dynamic layout
    assert 0 < report.registers <= 255


def test_layout_check_rejects_a_planner_kernel_mismatch(monkeypatch):
    cfg = FwdSimtConfig("float32", 64, 64, 32, 32, 4, False)
    good = cfg.layout
    # A planner that forgot the k_tile row padding: the kernel must refuse to compile.
    broken = dataclasses.replace(good, buffers=(
        good.buffers[0],
        dataclasses.replace(good.buffers[1], shape=(32, 64)),
        dataclasses.replace(good.buffers[2], offset=good.buffers[2].offset - 32 * 4),
    ))
    monkeypatch.setattr(FwdSimtConfig, "layout", property(lambda self: broken))
    assert "check_layout" in check_expression(cfg)
    with pytest.raises(cc.CompileError, match="disagree on shared-memory buffer offsets"):
        cc.compile_only(cfg, "sm_80")


def test_kernel_source_carries_the_hash_of_every_kernel_file():
    cfg = FwdSimtConfig("float16", 64, 64, 32, 32, 4, False)
    src = cc.kernel_source(cfg)
    assert cc.kernels_hash() in src and '#include "attn_fwd_simt.cuh"' in src
    names = {p.name for p in cc.kernels_dir().glob("*.cu*")}
    assert {"common.cuh", "attn_fwd_simt.cuh"} <= names


def test_installed_package_finds_its_kernels(tmp_path):
    """A non-editable install must ship kernels/ inside the package."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import cupyattn, cupyattn.compile as c, pathlib; "
             "print(pathlib.Path(cupyattn.__file__).parent); print(c.kernels_dir())")
    res = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=env,
                         capture_output=True, text=True)
    if res.returncode != 0:
        pytest.skip("cupyattn is not installed in this environment (running from a checkout)")
    pkg, kernels = (Path(line) for line in res.stdout.split())
    repo = Path(__file__).resolve().parents[1]
    if pkg.parent == repo:
        pytest.skip("cupyattn is installed in editable mode")
    assert kernels == pkg / "kernels"
    assert (kernels / "attn_fwd_simt.cuh").is_file()
