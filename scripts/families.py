"""A pass as planned next to the same call with the wgmma kernels taken away (mma.sync's
tiles only), at several sequence lengths: where does wgmma stop paying?

    PYTHONPATH=. python scripts/families.py [--pass fwd|bwd] [--dims 64] [--seqlens 512,1024,2048,4096]
        [--batch 4] [--wgmma-from ROWS]

The wgmma kernels are taken away by a planner Policy (families mma.sync and SIMT).
--wgmma-from: plan the backward's wgmma tiles first from this many streamed rows
(Policy.wgmma_backward_min_rows) instead, so that "as planned" is wgmma below it too.
"""

import argparse

import cupy

import cupyattn
from cupyattn import plan as P
from cupyattn.device import current_device
from cupyattn.plan import Policy
from cupyattn.testing import device_values, median_ms


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pass", dest="pass_", choices=("fwd", "bwd"), default="bwd")
    parser.add_argument("--dims", default="64")
    parser.add_argument("--seqlens", default="512,1024,2048,4096")
    parser.add_argument("--precisions", default="tf32,fp32")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--wgmma-from", type=int, default=None)
    args = parser.parse_args()
    thresholds = {} if args.wgmma_from is None else {"wgmma_backward_min_rows": args.wgmma_from}
    policies = (Policy(**thresholds), Policy(families={"mma", "simt"}, **thresholds))  # as planned, mma.sync only
    B, H = args.batch, 16
    spec = current_device()
    print(
        f"{args.pass_}, B={B}, H={H}\n| mode | D | S | causal | as planned ms | kernels | mma.sync only ms | ratio |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for precision in args.precisions.split(","):
        for D in (int(d) for d in args.dims.split(",")):
            for S in (int(s) for s in args.seqlens.split(",")):
                rng = cupy.random.default_rng(1)
                q, k, v, do = (device_values((B, S, H, D), "float32", rng) for _ in range(4))
                for causal in (False, True):
                    opts = dict(causal=causal, precision=precision)
                    times, kernels = [], None
                    for policy in policies:
                        if args.pass_ == "fwd":
                            call = lambda: cupyattn.attention(q, k, v, policy=policy, **opts)  # noqa: E731
                        else:
                            out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
                            call = lambda: cupyattn.attention_backward(
                                do,
                                q,
                                k,
                                v,
                                out,
                                lse,  # noqa: E731
                                policy=policy,
                                **opts,
                            )
                        if kernels is None:
                            problem = P.AttentionProblem("float32", D, D, causal, B, H, H, S, S, precision=(precision,))
                            plans = (
                                (P.plan_forward(problem, spec, policy=policy),)
                                if args.pass_ == "fwd"
                                else P.plan_backward(problem, spec, policy=policy).plans
                            )
                            kernels = "+".join("wgmma" if isinstance(p.config, P.WgmmaConfig) else "mma" for p in plans)
                        times.append(median_ms(call, repeats=10, warmup=2))
                    print(
                        f"| {precision} | {D} | {S} | {causal} | {times[0]:.3f} | {kernels} | {times[1]:.3f} | "
                        f"{times[1] / times[0]:.2f}x |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
