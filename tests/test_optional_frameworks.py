"""Optional frameworks stay optional: importing cupyattn never imports torch or jax."""

import subprocess
import sys


def test_import_cupyattn_does_not_import_torch_or_jax():
    code = "import sys, cupyattn, cupyattn.api; print(sorted(m for m in ('torch', 'jax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_the_adapters_name_their_framework_when_it_is_missing():
    import importlib.util

    for framework in ("torch", "jax"):
        if importlib.util.find_spec(framework) is not None:
            continue  # installed here: the GPU tests cover the adapter
        code = f"import cupyattn.{framework}"
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.returncode != 0 and f"No module named '{framework}'" in out.stderr, out.stderr
