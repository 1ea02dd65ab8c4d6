"""What does a first call pay to compile? Cold and warm compile times of the
configurations this GPU uses.

Cold: a fresh, empty CuPy disk cache (NVRTC runs for every configuration).
Warm: a new process reading the same disk cache (what a second run of a
training script pays). Usage on a GPU: PYTHONPATH=. python scripts/compile_times.py
"""

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from cupyattn.compile import get_kernel
from cupyattn.device import current_device
from cupyattn.plan import planned_configs
spec = current_device()
configs = planned_configs(spec, (64, 128, 256), ("float16", "bfloat16", "float32"))
times = {}
for name, c in configs.items():
    t = time.perf_counter()
    get_kernel(c, spec)
    times[name] = time.perf_counter() - t
print(json.dumps(times))
"""


def run(cache_dir):
    env = dict(os.environ, CUPY_CACHE_DIR=cache_dir, PYTHONPATH=str(REPO))
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout), time.perf_counter() - t


def main():
    with tempfile.TemporaryDirectory() as cache:
        cold, cold_wall = run(cache)
        warm, warm_wall = run(cache)
    print(f"{'configuration':<72} {'cold s':>7} {'warm s':>7}")
    for name in cold:
        print(f"{name:<72} {cold[name]:>7.2f} {warm[name]:>7.3f}")
    print(
        f"{len(cold)} configurations: cold {sum(cold.values()):.1f}s total "
        f"(median {sorted(cold.values())[len(cold) // 2]:.2f}s), warm {sum(warm.values()):.2f}s total; "
        f"whole process cold {cold_wall:.1f}s, warm {warm_wall:.1f}s"
    )


if __name__ == "__main__":
    main()
