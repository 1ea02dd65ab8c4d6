"""Running the repository's scripts from tests (CPU only)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def script(name: str, *args: str) -> subprocess.CompletedProcess:
    """scripts/``name`` run with ``args``, the checkout on PYTHONPATH; its output captured."""
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / name), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
