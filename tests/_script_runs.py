"""Running the repository's scripts from tests (CPU only)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/``name`` run with ``args``, the checkout on PYTHONPATH; its output captured."""
    return subprocess.run([sys.executable, str(ROOT / "scripts" / name), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def assert_copy_compiles_without_spills(name: str, *args: str) -> None:
    """``name`` with --compile-only (a modified copy of the tree, its planned dK/dV and dQ
    kernels compiled for sm_90a) prints both kernels with 0 bytes spilled; skipped without NVRTC."""
    res = script(name, *args, "--compile-only")
    if res.returncode != 0 and "libnvrtc" in res.stdout + res.stderr:
        pytest.skip("no NVRTC")
    assert res.returncode == 0, res.stdout + res.stderr
    lines = [line for line in res.stdout.splitlines() if "registers" in line]
    assert len(lines) == 2 and all(line.endswith(" 0 bytes spilled") for line in lines), res.stdout
