"""Which planned tensor-core tiles ptxas spills, causal and not, per architecture.

Compiles (NVRTC, no GPU) every tile the planner picks on each named GPU's
architecture, for the head dims, dtypes, float32 precision modes and both causal
settings that tests/test_compile.py checks, and prints those that spill, marked with
whether that test allows them (SPILL_ALLOWANCE). Useful after a kernel edit, and on
a machine whose NVRTC differs from CI's (the spills differ between 13.0 and 13.5).

    PYTHONPATH=. python scripts/planned_spills.py [--archs sm_80,sm_90] [--jobs 2] [--results FILE]

--results keeps each compile's spills in a JSON-lines file (by kernel-files hash,
architecture and name) and reads it back on the next run, so a run cut short, or one
after a change to plan.py only, compiles only what it has not seen.
"""

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from cupyattn import plan as P  # noqa: E402
from cupyattn.compile import compile_only, kernels_hash  # noqa: E402
from cupyattn.device import named_device  # noqa: E402
from test_compile import ARCH_DEVICES, FP32_WIDE_DIMS, HEAD_DIMS, SPILL_ALLOWANCE  # noqa: E402


def planned_mma(arch: str) -> list:
    device = named_device(ARCH_DEVICES[arch])
    configs = P.planned_configs(device, HEAD_DIMS, ("float16", "bfloat16", "float32"),
                                causals=(False, True), precisions=P.PRECISIONS)
    configs.update(P.planned_configs(device, FP32_WIDE_DIMS, ("float32",), causals=(False, True),
                                     precisions=("fp32",)))
    return [cfg for cfg in configs.values() if isinstance(cfg, P.MmaConfig)]


def _spills(job):
    arch, cfg = job
    return arch, cfg.name_expression, compile_only(cfg, arch).spills


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", default="sm_80,sm_86,sm_89,sm_90,sm_100,sm_120")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--results", default=None)
    args = parser.parse_args()
    seen = {}  # (arch, name) -> bytes spilled, for these kernel files
    if args.results and Path(args.results).is_file():
        for line in Path(args.results).read_text().splitlines():
            r = json.loads(line)
            if r["kernels"] == kernels_hash():
                seen[r["arch"], r["name"]] = r["spills"]
    planned = [(arch, cfg) for arch in args.archs.split(",") for cfg in planned_mma(arch)]
    jobs = [(arch, cfg) for arch, cfg in planned if (arch, cfg.name_expression) not in seen]
    print(f"{len(planned)} planned tiles, compiling {len(jobs)}", file=sys.stderr, flush=True)
    log = open(args.results, "a") if args.results else None
    with ProcessPoolExecutor(args.jobs) as pool:
        for arch, name, spills in pool.map(_spills, jobs):
            seen[arch, name] = spills
            if log:
                log.write(json.dumps({"kernels": kernels_hash(), "arch": arch, "name": name, "spills": spills}) + "\n")
                log.flush()
    for arch, cfg in planned:
        spills = seen[arch, cfg.name_expression]
        if spills:
            allowed = SPILL_ALLOWANCE.get((arch, cfg.name_expression))
            note = f"allowed up to {allowed[0]}: {allowed[1]}" if allowed else "NOT ALLOWED"
            print(f"{arch} {cfg.name_expression}: {spills} bytes ({note})")


if __name__ == "__main__":
    main()
