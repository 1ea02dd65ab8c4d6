"""Where does one case's kernel time go? One forward and one backward at a chosen shape,
after a warm-up pair: a target for Nsight Compute. Prints the planned kernels' names.

The warm-up pair compiles and loads every kernel, so the profiler sees the second
pair only (skip the warm-up launches with --launch-skip). On a GPU machine, from a
checkout:

    PYTHONPATH=. ncu --clock-control none -k 'regex:attn_(fwd|bwd_dkdv|bwd_dq)_(mma|wgmma)' \\
        --launch-skip 3 --launch-count 3 --section SpeedOfLight --section WarpStateStats \\
        python3 scripts/profile_case.py --dim 128 --seqlen 4096
"""

import argparse

import cupy

import cupyattn
from cupyattn import testing


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--dtype", default="float16")
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--nondeterministic", action="store_true", help="the backward with deterministic=False")
    parser.add_argument("--precision", default=None, help="for float32: fp32, tf32, bf16 or fp16")
    args = parser.parse_args()
    import numpy as np

    rng = np.random.default_rng(0)
    shape = (args.batch, args.seqlen, args.heads, args.dim)
    q, k, v, do = (testing.to_device(testing.host_values(shape, args.dtype, rng), args.dtype) for _ in range(4))
    for _ in range(2):  # warm-up pair, then the profiled pair
        out, lse = cupyattn.attention(q, k, v, causal=args.causal, return_lse=True, precision=args.precision)
        cupyattn.attention_backward(
            do, q, k, v, out, lse, causal=args.causal, precision=args.precision, deterministic=not args.nondeterministic
        )
    cupy.cuda.Device().synchronize()
    problem = cupyattn.AttentionProblem(
        args.dtype,
        args.dim,
        args.dim,
        args.causal,
        args.batch,
        args.heads,
        args.heads,
        args.seqlen,
        args.seqlen,
        precision=cupyattn.plan.parse_precision(args.precision, args.dtype),
        deterministic=not args.nondeterministic,
    )
    spec = cupyattn.current_device()
    bwd = cupyattn.plan_backward(problem, spec)
    for plan in (cupyattn.plan_forward(problem, spec), bwd.dkdv, bwd.dq):
        if plan is not None:  # (no dQ pass where the dK/dV pass computes dQ too)
            print(plan.config.name_expression)


if __name__ == "__main__":
    main()
