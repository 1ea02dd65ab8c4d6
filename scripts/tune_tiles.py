"""Time every tensor-core tile candidate that fits this GPU, one kernel family at a time.

For each head dim, the planner is restricted to one candidate tile of the family
under test (the other families keep their default choice) and the call is timed
(median of CUDA events, fresh inputs). The table orders the candidates by time; the
planner's preference lists in cupyattn/plan.py are written from it.

    PYTHONPATH=. python scripts/tune_tiles.py [--dtype float16] [--precision fp32] [--causal] [--json FILE]
        [--tiles 16x128x8,32x128x8]  (only these of each family's tiles)

Families: forward, wgmma, dkdv, dkdv_wgmma, dq, dq_wgmma, fused (deterministic=False).
"""

import argparse
import json
import sys
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupyattn  # noqa: E402
from cupyattn import plan as P  # noqa: E402
from cupyattn.device import current_device  # noqa: E402
from cupyattn.testing import device_values, median_ms  # noqa: E402

FAMILIES = {  # name: (tile table attribute, config class, backward?, the other family of the pass)
    "forward": ("FWD_MMA_TILES", P.FwdMmaConfig, False, "FWD_WGMMA_TILES"),
    "wgmma": ("FWD_WGMMA_TILES", P.FwdWgmmaConfig, False, "FWD_MMA_TILES"),  # float32 fp32 / tf32 on sm_90
    "dkdv": ("BWD_DKDV_MMA_TILES", P.BwdDkdvMmaConfig, True, "BWD_DKDV_WGMMA_TILES"),
    "dkdv_wgmma": ("BWD_DKDV_WGMMA_TILES", P.BwdDkdvWgmmaConfig, True, "BWD_DKDV_MMA_TILES"),
    "dq": ("BWD_DQ_MMA_TILES", P.BwdDqMmaConfig, True, "BWD_DQ_WGMMA_TILES"),
    "dq_wgmma": ("BWD_DQ_WGMMA_TILES", P.BwdDqWgmmaConfig, True, "BWD_DQ_MMA_TILES"),
    # dK, dV and dQ in one pass (deterministic=False; float32 fp32 / tf32 on sm_90)
    "fused": ("BWD_FUSED_WGMMA_TILES", P.BwdFusedWgmmaConfig, True, None),
}


def _restrict(attr, tiles):
    setattr(P, attr, tuple(tiles))
    P.plan_forward.cache_clear()
    P.plan_backward.cache_clear()


def parse_tiles(text: str) -> set:
    """"16x128x8,32x64x4" -> {(16, 128, 8), (32, 64, 4)}."""
    try:
        tiles = {tuple(int(x) for x in item.split("x")) for item in text.split(",") if item}
    except ValueError:
        tiles = {()}
    if not tiles or any(len(t) != 3 for t in tiles):
        raise SystemExit(f"--tiles: expected block_m x block_n x warps, comma-separated (e.g. 16x128x8), got {text!r}")
    return tiles


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--precision", default=None, help="for float32: fp32, tf32, bf16 or fp16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--families", default="forward,dkdv,dq")
    parser.add_argument("--tiles", default=None,
                        help="block_m x block_n x warps, comma-separated: time only these listed tiles")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    B, H, S = 4, 16, args.seqlen
    spec = current_device()
    originals = {attr: getattr(P, attr) for attr, *_ in FAMILIES.values()}  # every family's tiles
    # The fused pass timed at every head dim, not only where it is planned.
    P.BWD_FUSED_WHERE_FASTER = {(m, d) for m in P.PRECISIONS for d in range(16, 257, 16)}
    precision = P.parse_precision(args.precision, args.dtype)[0]
    opts = dict(causal=args.causal, precision=precision)
    only = parse_tiles(args.tiles) if args.tiles else None
    rows = []
    for family in args.families.split(","):
        attr, cls, backward, rival = FAMILIES[family]
        # The other kernel family of the same pass (plan._forward_families,
        # plan._backward_families) out of the way.
        if rival:
            _restrict(rival, ())
        for D in (int(d) for d in args.dims.split(",")):
            rng = cupy.random.default_rng(1)
            q, k, v, do = (device_values((B, S, H, D), args.dtype, rng) for _ in range(4))
            for tile in originals[attr]:
                if only is not None and tuple(tile) not in only:
                    continue
                cfg = cls(args.dtype, precision, cls.head_dim_pad_for(D, *tile), *tile, args.causal)
                if not cfg.valid or cfg.layout.total > spec.smem_per_block_optin:
                    continue
                _restrict(attr, [tile])
                try:
                    if backward:
                        fused = family == "fused"
                        out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
                        ms = median_ms(lambda: cupyattn.attention_backward(do, q, k, v, out, lse,
                                                                           deterministic=not fused, **opts),
                                       repeats=10, warmup=2)
                        bplan = P.plan_backward(P.AttentionProblem(args.dtype, D, D, args.causal, B, H, H, S, S,
                                                                   precision=(precision,), deterministic=not fused),
                                                spec)
                        chosen = (bplan.dq if family.startswith("dq") else bplan.dkdv).config
                    else:
                        ms = median_ms(lambda: cupyattn.attention(q, k, v, **opts), repeats=10, warmup=2)
                        chosen = P.plan_forward(P.AttentionProblem(args.dtype, D, D, args.causal, B, H, H, S, S,
                                                                   precision=(precision,)), spec).config
                    assert chosen == cfg, (chosen, cfg)
                    row = dict(family=family, D=D, tile=list(tile), ms=ms, name=cfg.name_expression,
                               smem=cfg.layout.total)
                except Exception as exc:  # a candidate that fails to compile or launch is reported, not fatal
                    row = dict(family=family, D=D, tile=list(tile), ms=None, error=str(exc)[:300])
                rows.append(row)
                print(json.dumps(row), flush=True)
            _restrict(attr, originals[attr])
        if rival:
            _restrict(rival, originals[rival])
    print(f"\n{args.dtype} ({precision}) B={B} H={H} S={S} causal={args.causal}: whole-call ms "
          "(backward: delta + dK/dV + dQ), fastest first")
    for family in args.families.split(","):
        for D in (int(d) for d in args.dims.split(",")):
            timed = sorted((r for r in rows if r["family"] == family and r["D"] == D and r["ms"]),
                           key=lambda r: r["ms"])
            print(f"{family} D={D}: " + ", ".join(f"{tuple(r['tile'])} {r['ms']:.3f}" for r in timed))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
