"""Optional frameworks stay optional: importing cupyattn never imports torch or jax."""

import subprocess
import sys


def test_import_cupyattn_does_not_import_torch_or_jax():
    code = ("import sys, cupyattn, cupyattn.api; "
            "print(sorted(m for m in ('torch', 'jax') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
