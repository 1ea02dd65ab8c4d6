"""explain / caps: structured results, text, JSON, the committed report, the CLI."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import cupyattn
from cupyattn.explain import capabilities, explain, named_devices_markdown

REPO = Path(__file__).resolve().parents[1]


def test_explain_backward_on_rtx6000ada_lists_every_buffer_and_fits():
    e = explain(128, "float32", backward=True, device="rtx6000ada", compile=False)
    assert [k.role for k in e.kernels] == ["backward dK/dV", "backward dQ"]
    for k in e.kernels:
        assert k.limit == 101376 and k.total <= k.limit
        assert k.total == k.buffers[-1].offset + k.buffers[-1].bytes
        assert all(r.over_by > 0 for r in k.rejected)
        text = str(k)
        for b in k.buffers:
            assert b.name in text and str(b.bytes) in text
    assert e.total == e.kernels[0].total and e.compiled is None


def test_explain_with_smem_limit_and_rejections():
    e = explain(256, "float32", device="h200", smem_limit=65536, compile=False)
    assert e.limit == 65536 and e.total <= 65536
    assert e.rejected and "over the limit" in str(e)


def test_explain_names_tiles_skipped_for_registers_in_text_and_json():
    e = explain(128, "float16", causal=True, device="h200", compile=False)
    name = "cupyattn::attn_fwd_mma<__half, cupyattn::MmaHalf<__half>, 128, 128, 64, 4, true>"
    assert f"skipped {name}: two 16-row m-tiles per warp" in str(e)
    skipped = json.loads(json.dumps(e.to_dict()))["kernels"][0]["skipped_for_registers"]
    assert {"name_expression": name, "reason": dict(e.kernels[0].plan.register_skipped)[name]} in skipped


def test_explain_says_how_warps_share_a_d_split_tile_in_text_and_json():
    # "fp32" at 256 on the H200: pairs of warpgroups share 64 keys (dK/dV) and 64 query
    # rows (dQ), each with half the columns; at 128 one warpgroup owns its rows.
    e = explain(256, "float32", backward=True, device="h200", compile=False)
    kernels = json.loads(json.dumps(e.to_dict()))["kernels"]
    assert [k["work_split"] is not None for k in kernels] == [True, True]
    assert "work split: two warpgroups share each 64 keys, each keeping dK's and dV's 128 of 256" in str(e)
    assert "the first computes S, the second dP" in kernels[1]["work_split"]
    assert all(k.plan.describe().count("work split:") == 1 for k in e.kernels)
    e = explain(128, "float32", backward=True, device="h200", compile=False)
    assert "work split" not in str(e) and all(k.plan.work_split is None for k in e.kernels)
    # mma.sync's pairs of warps (float16 at 256 on an A100) say so too.
    e = explain(256, "float16", backward=True, device="a100", compile=False)
    assert "two warps share each 16 keys" in str(e.kernels[0])


def test_explain_compiles_for_the_named_architecture():
    pytest.importorskip("cupy")
    from test_compile import _nvrtc_reason

    if _nvrtc_reason():
        pytest.skip(_nvrtc_reason())
    e = explain(64, "float16", device="sm_89", compile=True)
    c = e.compiled
    assert c.arch == "sm_89" and c.registers > 0 and c.spills == 0
    k = e.kernels[0]
    assert k.blocks_per_sm_by_registers >= 1 and 0 < k.occupancy <= 1
    assert "registers" in str(e)
    assert json.loads(json.dumps(e.to_dict()))["kernels"][0]["compiled"]["registers"] == c.registers


def test_capability_matrix_rows_text_and_json():
    m = capabilities("t4", dtypes=("float32",), head_dims=(128, 256))
    assert len(m.rows) == 2 * 3  # forward, backward dK/dV, backward dQ per head dim
    assert all(r.kernel.total <= 65536 for r in m.rows)
    text = str(m)
    assert "attn_bwd_dq_simt<float, 256" in text and "65536 opt-in" in text
    data = json.loads(m.to_json())
    assert data["device"]["smem_per_block_optin"] == 65536 and len(data["rows"]) == 6
    assert cupyattn.capabilities is capabilities and cupyattn.explain is explain


def test_committed_capabilities_report_is_current():
    committed = (REPO / "docs" / "capabilities.md").read_text()
    assert committed == named_devices_markdown() + "\n", (
        "docs/capabilities.md is stale: run python scripts/device_caps.py"
    )


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "cupyattn", *args], capture_output=True, text=True, env=env, cwd=REPO)


def test_cli_caps_and_explain_on_named_devices():
    res = _cli("caps", "--device", "rtx6000ada", "--dtype", "float32", "--head-dim", "128")
    assert res.returncode == 0, res.stderr
    assert "101376 opt-in" in res.stdout and "attn_fwd_mma<float, cupyattn::MmaTf32<3>, 128" in res.stdout
    res = _cli(
        "explain", "--head-dim", "128", "--dtype", "float32", "--backward", "--device", "rtx6000ada", "--no-compile"
    )
    assert res.returncode == 0, res.stderr
    for name in ("k_tile", "v_tile", "q_tile", "do_tile", "of 101376 bytes opt-in", "precision: fp32: 3xTF32"):
        assert name in res.stdout
    res = _cli(
        "explain",
        "--head-dim",
        "128",
        "--dtype",
        "float32",
        "--precision",
        "bf16",
        "--device",
        "rtx6000ada",
        "--no-compile",
        "--json",
    )
    assert res.returncode == 0, res.stderr
    kernel = json.loads(res.stdout)["kernels"][0]
    assert kernel["precision"] == "bf16" and kernel["buffers"][0]["dtype"] == "bfloat16"
    assert "float32 staged as bfloat16" in kernel["buffers"][0]["note"]
    res = _cli("explain", "--device", "gtx480")
    assert res.returncode != 0 and "unknown device name 'gtx480'" in res.stderr
    # deterministic=False on an H100: one fused dK/dV/dQ pass, its K^T and dS tiles shown.
    res = _cli(
        "explain",
        "--head-dim",
        "64",
        "--dtype",
        "float32",
        "--precision",
        "tf32",
        "--backward",
        "--nondeterministic",
        "--device",
        "h100",
        "--no-compile",
    )
    assert res.returncode == 0, res.stderr
    assert "backward dK/dV/dQ (fused): cupyattn::attn_bwd_fused_wgmma" in res.stdout
    assert "kt_tile" in res.stdout and "ds_tiles" in res.stdout and "backward dQ:" not in res.stdout
    # In bfloat16 at head dim 64, the half-precision fused pass and the launch that rounds dQ.
    res = _cli(
        "explain",
        "--head-dim",
        "64",
        "--dtype",
        "bfloat16",
        "--backward",
        "--nondeterministic",
        "--device",
        "h100",
        "--no-compile",
    )
    assert res.returncode == 0, res.stderr
    assert "backward dK/dV/dQ (fused): cupyattn::attn_bwd_fused_wgmma_half" in res.stdout
    assert "ds_tiles" in res.stdout and "attn_bwd_dq_convert" in res.stdout and "backward dQ:" not in res.stdout


def test_cli_without_gpu_says_so_in_one_line():
    from conftest import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is present")
    for cmd in (("check",), ("warmup",), ("caps", "--device", "current")):
        res = _cli(*cmd)
        assert res.returncode == 1
        assert len(res.stdout.strip().splitlines()) == 1 and "no usable GPU" in res.stdout
