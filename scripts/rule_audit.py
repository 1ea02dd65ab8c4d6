"""Register rules against ptxas: which listed wgmma tiles a rule keeps out that compile clean.

plan.py's register rules (``register_reason``) keep tiles that would spill out of the
plans without compiling them; each was written from the tiles of one schedule (the split
stage, the ring, words or parts), and a rule can outlive the schedule it was measured
on (the seventeenth session found the ring's wider tiles kept out by the split stage's
rule; BENCHMARKS.md). This compiles (NVRTC, no GPU) every listed wgmma tile that fits
the device's shared memory and that a register rule alone keeps out, at the head dims
and causal settings asked for, and prints each with its registers and spills; those
that do not spill are marked RULE TOO STRICT (candidates for tune_tiles.py --tiles,
after the listed-tile GPU tests have run them). --admitted also compiles the tiles the
rules let through and marks those that spill RULE TOO LOOSE. Any tile whose SASS has
empty HGMMAs (compile.empty_wgmmas: ptxas dropped wgmmas, a miscompile) is marked
EMPTY HGMMA, whatever its rule says (needs cuobjdump).

    PYTHONPATH=. python scripts/rule_audit.py [--dims 64,128,256] [--causal both]
        [--families dkdv,dq,fwd,fused] [--admitted] [--jobs 2]
"""

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyattn import plan as P  # noqa: E402
from cupyattn.compile import compile_only, empty_wgmmas, sass  # noqa: E402
from cupyattn.device import named_device  # noqa: E402

FAMILIES = {
    "dkdv": (P.BwdDkdvWgmmaConfig, "BWD_DKDV_WGMMA_TILES"),
    "dq": (P.BwdDqWgmmaConfig, "BWD_DQ_WGMMA_TILES"),
    "fwd": (P.FwdWgmmaConfig, "FWD_WGMMA_TILES"),
    "fused": (P.BwdFusedWgmmaConfig, "BWD_FUSED_WGMMA_TILES"),
}


def audited_tiles(device, dims, causals, families=tuple(FAMILIES), admitted=False) -> list:
    """(config, the rule's reason or None) for each listed wgmma tile of ``families`` in
    "fp32" and "tf32" at ``dims`` (padded as the planner pads) that the kernel accepts and
    that fits ``device``'s shared memory: those a register rule keeps out, and with
    ``admitted`` those it lets through too."""
    out = []
    for family in families:
        cls, attr = FAMILIES[family]
        for precision in ("fp32", "tf32"):
            for d in dims:
                for tile in getattr(P, attr):
                    for causal in causals:
                        cfg = cls("float32", precision, cls.head_dim_pad_for(d, *tile), *tile, causal)
                        if not cfg.valid or cfg.layout.total > device.smem_per_block_optin:
                            continue
                        why = cfg.register_reason(device.compute_capability)
                        if why is not None or admitted:
                            out.append((cfg, why))
    return list({cfg: (cfg, why) for cfg, why in out}.values())  # each padded tile once


def verdict(why, spills: int, empty_hgmmas: int = 0) -> str:
    if empty_hgmmas:
        return "EMPTY HGMMA"
    if why is not None and spills == 0:
        return "RULE TOO STRICT"
    if why is None and spills > 0:
        return "RULE TOO LOOSE"
    return "ok"


def _compile(job):
    cfg, arch = job
    report = compile_only(cfg, arch)
    return report.registers, report.spills, len(empty_wgmmas(sass(report)))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="h200", help="a named sm_90 GPU")
    parser.add_argument("--dims", default="64,96,128,160,192,224,256")
    parser.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--admitted", action="store_true", help="also compile the tiles the rules let through")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    device = named_device(args.device)
    if device.compute_capability != (9, 0):
        raise SystemExit(f"--device: the wgmma kernels run on sm_90 only; {args.device} is "
                         f"sm_{device.compute_capability[0]}{device.compute_capability[1]}")
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    tiles = audited_tiles(device, [int(d) for d in args.dims.split(",")], causals,
                          tuple(args.families.split(",")), args.admitted)
    print(f"compiling {len(tiles)} tiles for sm_90a", file=sys.stderr, flush=True)
    arch = f"sm_{device.compute_capability[0]}{device.compute_capability[1]}"
    with ProcessPoolExecutor(args.jobs) as pool:
        for (cfg, why), (registers, spills, empty) in zip(tiles, pool.map(_compile, [(cfg, arch) for cfg, _ in tiles])):
            print(f"{verdict(why, spills, empty):<15} {cfg.name_expression}: {registers} registers, {spills} bytes spilled"
                  f"{f', {empty} empty HGMMAs' if empty else ''}{f' | rule: {why}' if why else ''}", flush=True)


if __name__ == "__main__":
    main()
