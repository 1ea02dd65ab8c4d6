"""Where does one case's kernel time go? One forward and one backward at a chosen shape,
after a warm-up pair: a target for Nsight Compute. Prints the planned kernels' names.

The warm-up pair compiles and loads every kernel, so the profiler sees the second
pair only (skip the warm-up launches with --launch-skip). On a GPU machine, from a
checkout:

    PYTHONPATH=. ncu --clock-control none -k 'regex:attn_(fwd|bwd_dkdv|bwd_dq)_(mma|wgmma)' \\
        --launch-skip 3 --launch-count 3 --section SpeedOfLight --section WarpStateStats \\
        python3 scripts/profile_case.py --dim 128 --seqlen 4096

With --fa3 the same shape runs through FlashAttention-3 instead (flash_attn3_jax, float16 /
bfloat16, head dims up to 128): one forward, then two backwards, each three launches of
JAX's `device_kernel` (preprocess, main pass, dQ conversion), so that `-k regex:device_kernel
--launch-skip 4 --launch-count 3` profiles the second backward.
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
    parser.add_argument("--fa3", action="store_true", help="FlashAttention-3's kernels (flash_attn3_jax) instead")
    args = parser.parse_args()
    if args.fa3:
        return fa3_case(args)
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


def fa3_case(args):
    """FlashAttention-3's forward once, then its backward twice, at the shape of args."""
    import jax
    import jax.numpy as jnp
    from flash_attn3_jax import flash as fa3

    shape = (args.batch, args.seqlen, args.heads, args.dim)
    keys = jax.random.split(jax.random.PRNGKey(0), 4)
    q, k, v, do = (jax.random.normal(key, shape, getattr(jnp, args.dtype)) for key in keys)
    options = dict(softmax_scale=args.dim**-0.5, is_causal=args.causal, window_size=(-1, -1))
    out, lse = jax.jit(lambda q, k, v: fa3._flash_mha_fwd(q, k, v, **options))(q, k, v)
    backward = jax.jit(lambda do, q, k, v, o, lse: fa3._flash_mha_bwd(do, q, k, v, o, lse, **options))
    for _ in range(2):
        jax.block_until_ready(backward(do, q, k, v, out, lse))


if __name__ == "__main__":
    main()
