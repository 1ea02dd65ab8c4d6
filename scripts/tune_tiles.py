"""Time every tensor-core tile candidate that fits this GPU, one kernel family at a time.

Which tile of a kernel family is fastest on this GPU? For each head dim, a planner
Policy gives the family under test one candidate tile and the other family of the same
pass none (the other passes keep their default choice), and the whole call is timed
(median of CUDA events, fresh inputs, B=4, H=16). The table orders the candidates by
time; the planner's tile orders are written from it. From a checkout:

    PYTHONPATH=. python scripts/tune_tiles.py [--dtype float16] [--precision fp32] [--causal] [--json FILE]
        [--tiles 16x128x8,32x128x8]  (these tiles instead of each family's list: candidates before
        they enter it)

Families: forward, wgmma, wgmma_half, dkdv, dkdv_wgmma, dkdv_wgmma_half, dq, dq_wgmma, dq_wgmma_half,
fused (deterministic=False). The backward families other than fused time the two passes (the
deterministic fused pass taken out of the way).
"""

import argparse
import json
from pathlib import Path

import cupy

import cupyattn
from cupyattn import plan as P
from cupyattn.device import current_device
from cupyattn.plan import Policy
from cupyattn.testing import device_values, median_ms

FAMILIES = {  # name: (tile table, policy tile key, config class, backward?, the other family's key of the pass)
    "forward": ("FWD_MMA_TILES", "fwd_mma", P.FwdMmaConfig, False, "fwd_wgmma"),
    "wgmma": ("FWD_WGMMA_TILES", "fwd_wgmma", P.FwdWgmmaConfig, False, "fwd_mma"),  # float32 fp32 / tf32 on sm_90
    "dkdv": ("BWD_DKDV_MMA_TILES", "bwd_dkdv_mma", P.BwdDkdvMmaConfig, True, "bwd_dkdv_wgmma"),
    "dkdv_wgmma": ("BWD_DKDV_WGMMA_TILES", "bwd_dkdv_wgmma", P.BwdDkdvWgmmaConfig, True, "bwd_dkdv_mma"),
    "dq": ("BWD_DQ_MMA_TILES", "bwd_dq_mma", P.BwdDqMmaConfig, True, "bwd_dq_wgmma"),
    "dq_wgmma": ("BWD_DQ_WGMMA_TILES", "bwd_dq_wgmma", P.BwdDqWgmmaConfig, True, "bwd_dq_mma"),
    # float16 / bfloat16 on sm_90 (TMA-loaded tiles)
    "wgmma_half": ("FWD_WGMMA_HALF_TILES", "fwd_wgmma_half", P.FwdWgmmaHalfConfig, False, None),
    "dkdv_wgmma_half": ("BWD_DKDV_WGMMA_HALF_TILES", "bwd_dkdv_wgmma_half", P.BwdDkdvWgmmaHalfConfig, True, None),
    "dq_wgmma_half": ("BWD_DQ_WGMMA_HALF_TILES", "bwd_dq_wgmma_half", P.BwdDqWgmmaHalfConfig, True, None),
    # dK, dV and dQ in one pass (deterministic=False; float32 fp32 / tf32 on sm_90)
    "fused": ("BWD_FUSED_WGMMA_TILES", "bwd_fused_wgmma", P.BwdFusedWgmmaConfig, True, None),
}
# The fused pass timed at every head dim, not only where it is planned.
FUSED_EVERYWHERE = {(m, d) for m in P.PRECISIONS for d in range(16, 257, 16)}


def parse_tiles(text: str) -> set:
    """ "16x128x8,32x64x4" -> {(16, 128, 8), (32, 64, 4)}."""
    try:
        tiles = {tuple(int(x) for x in item.split("x")) for item in text.split(",") if item}
    except ValueError:
        tiles = {()}
    if not tiles or any(len(t) != 3 for t in tiles):
        raise argparse.ArgumentTypeError(
            f"expected block_m x block_n x warps, comma-separated (e.g. 16x128x8), got {text!r}"
        )
    return tiles


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--precision", default=None, help="for float32: fp32, tf32, bf16 or fp16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--families", default="forward,dkdv,dq")
    parser.add_argument(
        "--tiles",
        type=parse_tiles,
        default=None,
        help="block_m x block_n x warps, comma-separated: time these tiles (listed or not) instead of the list",
    )
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    B, H, S = 4, 16, args.seqlen
    spec = current_device()
    precision = P.parse_precision(args.precision, args.dtype)[0]
    opts = dict(causal=args.causal, precision=precision)
    rows = []
    for family in args.families.split(","):
        attr, key, cls, backward, rival = FAMILIES[family]
        for D in (int(d) for d in args.dims.split(",")):
            rng = cupy.random.default_rng(1)
            q, k, v, do = (device_values((B, S, H, D), args.dtype, rng) for _ in range(4))
            for tile in getattr(P, attr) if args.tiles is None else sorted(args.tiles):
                cfg = cls(args.dtype, precision, cls.head_dim_pad_for(D, *tile), *tile, args.causal)
                if not cfg.valid or cfg.layout.total > spec.smem_per_block_optin:
                    continue
                # This tile alone for its family, the other family of the pass out of the way.
                policy = Policy(
                    tiles={key: [tile], **({rival: []} if rival else {})},
                    fused_where=FUSED_EVERYWHERE,
                    ordered_fused_where=frozenset(),
                )
                try:
                    if backward:
                        fused = family == "fused"
                        out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
                        ms = median_ms(
                            lambda: cupyattn.attention_backward(
                                do, q, k, v, out, lse, deterministic=not fused, policy=policy, **opts
                            ),
                            repeats=10,
                            warmup=2,
                        )
                        bplan = P.plan_backward(
                            P.AttentionProblem(
                                args.dtype,
                                D,
                                D,
                                args.causal,
                                B,
                                H,
                                H,
                                S,
                                S,
                                precision=(precision,),
                                deterministic=not fused,
                            ),
                            spec,
                            policy=policy,
                        )
                        chosen = (bplan.dq if family.startswith("dq") else bplan.dkdv).config
                    else:
                        ms = median_ms(lambda: cupyattn.attention(q, k, v, policy=policy, **opts), repeats=10, warmup=2)
                        chosen = P.plan_forward(
                            P.AttentionProblem(args.dtype, D, D, args.causal, B, H, H, S, S, precision=(precision,)),
                            spec,
                            policy=policy,
                        ).config
                    assert chosen == cfg, (chosen, cfg)
                    row = dict(
                        family=family, D=D, tile=list(tile), ms=ms, name=cfg.name_expression, smem=cfg.layout.total
                    )
                except Exception as exc:  # a candidate that fails to compile or launch is reported, not fatal
                    row = dict(family=family, D=D, tile=list(tile), ms=None, error=str(exc)[:300])
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        f"\n{args.dtype} ({precision}) B={B} H={H} S={S} causal={args.causal}: whole-call ms "
        "(backward: delta + dK/dV + dQ), fastest first"
    )
    for family in args.families.split(","):
        for D in (int(d) for d in args.dims.split(",")):
            timed = sorted(
                (r for r in rows if r["family"] == family and r["D"] == D and r["ms"]), key=lambda r: r["ms"]
            )
            print(f"{family} D={D}: " + ", ".join(f"{tuple(r['tile'])} {r['ms']:.3f}" for r in timed))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
