#!/usr/bin/env bash
# The GPU test run: the self-check, then the GPU tests (parallel compiles), logs under $OUT.
# Usage on the GPU machine, from the checkout: bash scripts/gpu_tests.sh [pytest args]
set -uo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1 CUPY_CACHE_DIR="$PWD/.cupy_cache"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # JAX (tests/test_jax_gpu.py) must not take 75% of the GPU
OUT=${OUT:-/tmp/cupyattn-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu --format=csv,noheader
python3 -m cupyattn check 2>&1 | tee "$OUT/check.log"
python3 -m pytest -n 16 -q -m gpu -p no:cacheprovider -p no:benchmark "$@" 2>&1 | tee "$OUT/pytest.log" | tail -40
status=${PIPESTATUS[0]}
# (a second -q in the arguments hides pytest's own summary line: this one stays)
echo "pytest exit status: $status (0: no selected test failed or errored)" | tee -a "$OUT/pytest.log"
exit "$status"
