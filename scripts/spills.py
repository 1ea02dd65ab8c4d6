"""Which tensor-core tiles ptxas spills registers in: compiles only (NVRTC), no GPU.

One subcommand per question:

  planned  Do the tiles the planner picks spill? Every mma.sync tile planned on each
           architecture's named GPU (B=4, H=16, S=4096, each dtype and float32 mode,
           causal and not; 3xTF32 also at --fp32-dims), printed with the bytes it
           spills; tests/test_compile.py allows only those in its SPILL_ALLOWANCE. For
           after a kernel edit, and on a machine whose NVRTC differs from CI's.
           --results keeps each compile's spills in a JSON-lines file (by kernel-files
           hash, architecture and name) and reads it back, so a run cut short, or one
           after a planner-only change, compiles only what it has not seen.
  map      Where do the mma.sync register budgets (MmaConfig.register_budget) come
           from? Every candidate tile at --dims (causal), per kernel and architecture:
           the fewest accumulators per lane (MmaConfig.register_load) that spilled, the
           most that did not, and any tile the budget admits that spills.
  rules    Are the wgmma register rules (register_reason) right? Every listed wgmma tile
           ("fp32" and "tf32") that fits the device's shared memory and that a rule
           keeps out, compiled for sm_90a; one that does not spill is RULE TOO STRICT
           (a candidate for tune_tiles.py --tiles). --admitted also compiles the tiles
           the rules let through: RULE TOO LOOSE where one spills. A tile whose SASS has
           empty HGMMAs (ptxas dropped wgmmas: a miscompile) is EMPTY HGMMA, whatever
           its rule (needs cuobjdump). --list prints the tiles and rules, compiling none.

From a checkout (or with the package installed, without PYTHONPATH):

    PYTHONPATH=. python scripts/spills.py planned [--archs sm_80,sm_90] [--jobs 2] [--results FILE]
    PYTHONPATH=. python scripts/spills.py map [--archs sm_80,sm_90] [--dims 32,64,128]
        [--modes float16:fp16,float32:fp32,float32:tf32,float32:bf16] [--jsonl FILE]
    PYTHONPATH=. python scripts/spills.py rules [--device h200] [--dims 64,128,256] [--causal both]
        [--families dkdv,dq,fwd,fused] [--admitted] [--list] [--jobs 2]
"""

import argparse
import collections
import itertools
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from cupyattn import plan as P
from cupyattn.compile import compile_only, empty_wgmmas, kernels_hash, sass
from cupyattn.device import named_device

MMA_ARCHS = "sm_80,sm_86,sm_89,sm_90,sm_100,sm_120"
MMA_FAMILIES = (
    (P.FwdMmaConfig, "FWD_MMA_TILES"),
    (P.BwdDkdvMmaConfig, "BWD_DKDV_MMA_TILES"),
    (P.BwdDqMmaConfig, "BWD_DQ_MMA_TILES"),
)
WGMMA_FAMILIES = {
    "dkdv": (P.BwdDkdvWgmmaConfig, "BWD_DKDV_WGMMA_TILES"),
    "dq": (P.BwdDqWgmmaConfig, "BWD_DQ_WGMMA_TILES"),
    "fwd": (P.FwdWgmmaConfig, "FWD_WGMMA_TILES"),
    "fused": (P.BwdFusedWgmmaConfig, "BWD_FUSED_WGMMA_TILES"),
}


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",") if x]


def _spills(job):
    cfg, arch = job
    return compile_only(cfg, arch).spills


def planned(args):
    seen = {}  # (arch, name) -> bytes spilled, for these kernel files
    if args.results and Path(args.results).is_file():
        for line in Path(args.results).read_text().splitlines():
            r = json.loads(line)
            if r["kernels"] == kernels_hash():
                seen[r["arch"], r["name"]] = r["spills"]
    tiles = []
    for arch in args.archs.split(","):
        device = named_device(arch)
        configs = P.planned_configs(
            device, _ints(args.dims), ("float16", "bfloat16", "float32"), causals=(False, True), precisions=P.PRECISIONS
        )
        configs.update(
            P.planned_configs(device, _ints(args.fp32_dims), ("float32",), causals=(False, True), precisions=("fp32",))
        )
        tiles += [(cfg, arch) for cfg in configs.values() if isinstance(cfg, P.MmaConfig)]
    jobs = [(cfg, arch) for cfg, arch in tiles if (arch, cfg.name_expression) not in seen]
    print(f"{len(tiles)} planned tiles, compiling {len(jobs)}", file=sys.stderr, flush=True)
    log = open(args.results, "a") if args.results else None
    with ProcessPoolExecutor(args.jobs) as pool:
        for (cfg, arch), spills in zip(jobs, pool.map(_spills, jobs)):
            seen[arch, cfg.name_expression] = spills
            if log:
                log.write(
                    json.dumps({"kernels": kernels_hash(), "arch": arch, "name": cfg.name_expression, "spills": spills})
                    + "\n"
                )
                log.flush()
    for cfg, arch in tiles:
        if seen[arch, cfg.name_expression]:
            print(f"{arch} {cfg.name_expression}: {seen[arch, cfg.name_expression]} bytes spilled")


def _map_row(job):
    cfg, arch = job
    r = compile_only(cfg, arch)
    cc = (int(arch[3:-1]), int(arch[-1]))
    return dict(
        name=cfg.name_expression,
        family=f"{cfg.KERNEL.split('::')[1]} {cfg.precision}",
        arch=arch,
        accumulators=cfg.register_load[0],
        admitted=cfg.fits_registers(cc),
        registers=r.registers,
        spills=r.spills,
    )


def spill_map(args):
    modes = [tuple(m.split(":")) for m in args.modes.split(",")]
    candidates = [
        cls(dtype, precision, d, *tile, True)
        for (dtype, precision), d, (cls, attr) in itertools.product(modes, _ints(args.dims), MMA_FAMILIES)
        for tile in getattr(P, attr)
    ]
    jobs = [(cfg, arch) for cfg in candidates if cfg.valid for arch in args.archs.split(",")]
    print(f"compiling {len(jobs)} tiles", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        rows = list(pool.map(_map_row, jobs))
    if args.jsonl:
        Path(args.jsonl).write_text("".join(json.dumps(r) + "\n" for r in rows))
    groups = collections.defaultdict(list)
    for r in rows:
        groups[(r["family"], r["arch"])].append(r)
    print("| kernel | arch | fewest accumulators that spilled | most that did not | admitted tiles that spill |")
    print("|---|---|---|---|---|")
    for (family, arch), rs in sorted(groups.items()):
        spilled = [r["accumulators"] for r in rs if r["spills"]]
        clean = [r["accumulators"] for r in rs if not r["spills"]]
        bad = [r["name"] for r in rs if r["spills"] and r["admitted"]]
        print(
            f"| {family} | {arch} | {min(spilled) if spilled else '-'} | {max(clean) if clean else '-'} "
            f"| {', '.join(bad) or 'none'} |"
        )


def audited_tiles(device, dims, causals, families, admitted: bool) -> list:
    """(config, the rule's reason or None) for each listed wgmma tile of ``families`` in
    "fp32" and "tf32" at ``dims`` (padded as the planner pads) that the kernel accepts and
    that fits ``device``'s shared memory: those a register rule keeps out, and with
    ``admitted`` those it lets through too; each padded tile once."""
    out = {}
    for family in families:
        cls, attr = WGMMA_FAMILIES[family]
        for precision, d, tile, causal in itertools.product(("fp32", "tf32"), dims, getattr(P, attr), causals):
            cfg = cls("float32", precision, cls.head_dim_pad_for(d, *tile), *tile, causal)
            if not cfg.valid or cfg.layout.total > device.smem_per_block_optin:
                continue
            why = cfg.register_reason(device.compute_capability)
            if why is not None or admitted:
                out[cfg] = why
    return list(out.items())


def verdict(why, spills: int, empty_hgmmas: int) -> str:
    if empty_hgmmas:
        return "EMPTY HGMMA"
    if why is not None and spills == 0:
        return "RULE TOO STRICT"
    if why is None and spills > 0:
        return "RULE TOO LOOSE"
    return "ok"


def _rules_row(job):
    cfg, arch = job
    report = compile_only(cfg, arch)
    return report.registers, report.spills, len(empty_wgmmas(sass(report)))


def rules(args, parser):
    device = named_device(args.device)
    if device.compute_capability != (9, 0):
        parser.error(
            f"--device: expected a named sm_90 GPU (the wgmma kernels run on sm_90 only), got "
            f"{args.device}, {device.arch}"
        )
    families = args.families.split(",")
    unknown = [f for f in families if f not in WGMMA_FAMILIES]
    if unknown:
        parser.error(f"--families: expected some of {','.join(WGMMA_FAMILIES)}, got {args.families}")
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    tiles = audited_tiles(device, _ints(args.dims), causals, families, args.admitted)
    if args.list:
        for cfg, why in tiles:
            print(
                f"{cfg.precision} {cfg.head_dim_pad} {cfg.block_m}x{cfg.block_n}x{cfg.num_warps} "
                f"{'causal' if cfg.causal else 'full'}: {cfg.name_expression}"
                f" | rule: {why if why else 'admitted'}"
            )
        return
    print(f"compiling {len(tiles)} tiles for sm_90a", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(args.jobs) as pool:
        results = pool.map(_rules_row, [(cfg, device.arch) for cfg, _ in tiles])
        for (cfg, why), (registers, spills, empty) in zip(tiles, results):
            print(
                f"{verdict(why, spills, empty):<15} {cfg.name_expression}: {registers} registers, "
                f"{spills} bytes spilled{f', {empty} empty HGMMAs' if empty else ''}"
                f"{f' | rule: {why}' if why else ''}",
                flush=True,
            )


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("planned", help="the planned mma.sync tiles that spill")
    p.add_argument("--archs", default=MMA_ARCHS)
    p.add_argument("--dims", default="32,64,96,128,160,192,256")
    p.add_argument(
        "--fp32-dims",
        default=",".join(str(d) for d in range(144, 257, 16)),
        help='head dims where 3xTF32 (float32 "fp32") is also compiled',
    )
    p.add_argument("--results", default=None, help="JSON-lines file of compiles kept between runs")
    p.add_argument("--jobs", type=int, default=2)
    m = sub.add_parser("map", help="accumulators per lane that spill, per mma.sync kernel and architecture")
    m.add_argument("--archs", default=MMA_ARCHS)
    m.add_argument("--dims", default="32,64,96,128,160,192,224,256")
    m.add_argument("--modes", default="float16:fp16", help="dtype:precision pairs, comma-separated")
    m.add_argument("--jsonl", default=None, help="write every compile's row here")
    m.add_argument("--jobs", type=int, default=2)
    r = sub.add_parser("rules", help="the wgmma tiles a register rule keeps out, compiled")
    r.add_argument("--device", default="h200", help="a named sm_90 GPU")
    r.add_argument("--dims", default="64,96,128,160,192,224,256")
    r.add_argument("--causal", choices=("no", "yes", "both"), default="both")
    r.add_argument("--families", default=",".join(WGMMA_FAMILIES))
    r.add_argument("--admitted", action="store_true", help="also the tiles the rules let through")
    r.add_argument("--list", action="store_true", help="print the tiles and rules, compiling none")
    r.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    if args.command == "planned":
        planned(args)
    elif args.command == "map":
        spill_map(args)
    else:
        rules(args, parser)


if __name__ == "__main__":
    main()
