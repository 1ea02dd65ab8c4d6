"""Registers and spills of every tensor-core tile candidate, per architecture, without a GPU.

Compiles each candidate of FWD_MMA_TILES, BWD_DKDV_MMA_TILES and BWD_DQ_MMA_TILES at
head dims 32..256 (causal; float16 by default, or the --modes given: dtype:precision,
e.g. float32:fp32 for 3xTF32) for each architecture through NVRTC and ptxas
(-Xptxas=-v), then prints, per kernel family and architecture, the fewest
accumulators per lane that spilled and the most that did not: the evidence behind
the register budgets in cupyattn/plan.py (``MmaConfig.register_budget``), and
whether the planner's budget would admit a spilling tile.

    PYTHONPATH=. python scripts/spill_map.py [--archs sm_80,sm_90,sm_100,sm_120] [--jsonl FILE]
        [--modes float16:fp16,float32:fp32,float32:tf32,float32:bf16]
"""

import argparse
import collections
import itertools
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyattn import plan as P  # noqa: E402
from cupyattn.compile import compile_only  # noqa: E402

FAMILIES = ((P.FwdMmaConfig, "FWD_MMA_TILES"), (P.BwdDkdvMmaConfig, "BWD_DKDV_MMA_TILES"),
            (P.BwdDqMmaConfig, "BWD_DQ_MMA_TILES"))


def candidates(head_dims, modes):
    for (dtype, precision), d, (cls, attr) in itertools.product(modes, head_dims, FAMILIES):
        for tile in getattr(P, attr):
            cfg = cls(dtype, precision, d, *tile, True)
            if cfg.valid:
                yield cfg


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--archs", default="sm_80,sm_86,sm_89,sm_90,sm_100,sm_120")
    parser.add_argument("--dims", default="32,64,96,128,160,192,224,256")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--jsonl", default=None)
    parser.add_argument("--modes", default="float16:fp16", help="dtype:precision pairs, comma-separated")
    args = parser.parse_args()
    archs = args.archs.split(",")
    modes = [tuple(m.split(":")) for m in args.modes.split(",")]
    dims = [int(d) for d in args.dims.split(",")]
    work = list(itertools.product(candidates(dims, modes), archs))

    def compile_one(item):
        cfg, arch = item
        r = compile_only(cfg, arch)
        cc = (int(arch[3:-1]), int(arch[-1]))
        return dict(name=cfg.name_expression, family=f"{cfg.KERNEL.split('::')[1]} {cfg.precision}", arch=arch,
                    accumulators=cfg.register_load[0], admitted=cfg.fits_registers(cc),
                    registers=r.registers, spills=r.spills)

    with ThreadPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(compile_one, work))
    if args.jsonl:
        Path(args.jsonl).write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["family"], r["arch"])].append(r)
    # "accumulators": what the register budget bounds (MmaConfig.register_load: accumulators
    # per lane, some counted more than once in 3xTF32).
    print("| kernel | arch | fewest accumulators that spilled | most that did not | admitted tiles that spill |")
    print("|---|---|---|---|---|")
    for (family, arch), rs in sorted(groups.items()):
        spilled = [r["accumulators"] for r in rs if r["spills"]]
        clean = [r["accumulators"] for r in rs if not r["spills"]]
        bad = [r["name"] for r in rs if r["spills"] and r["admitted"]]
        print(f"| {family} | {arch} | {min(spilled) if spilled else '-'} | {max(clean) if clean else '-'} "
              f"| {', '.join(bad) or 'none'} |")


if __name__ == "__main__":
    main()
