"""Shared-memory bank conflicts of a wgmma kernel, without a GPU: the kernel's PTX run on
the CPU (tests/_ptx_emulator.py, one block of B=1, H=1, Sq=37, Sk=64), and for each
shared load or store statement the wavefronts its warps' accesses take against the
fewest their width allows (1 for 4 bytes a lane, 2 for 8, 4 for 16). Prints the
statements that take more (most first), then the totals.

    PYTHONPATH=. python scripts/shared_wavefronts.py --pass dkdv --precision fp32 --head-dim 256 \\
        [--causal] [--rows-staged]

The kernel is the one the planner takes on the H200 at B=4, H=16, S=4096 (--rows-staged:
with the producer making the transposed tiles, plan.*.PRODUCER_MAKES_TRANSPOSED).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def fewest(statement: str) -> int:
    return 4 if ".v4" in statement else 2 if ".v2" in statement else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pass", dest="kind", choices=["fwd", "dkdv", "dq"], required=True)
    parser.add_argument("--precision", choices=["fp32", "tf32"], default="fp32")
    parser.add_argument("--head-dim", type=int, default=256)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--rows-staged", action="store_true")
    args = parser.parse_args(argv)

    import test_emulated_kernels as emulated
    from cupyattn import plan as P
    from cupyattn.device import named_device

    for cls in (P.BwdDkdvWgmmaConfig, P.BwdDqWgmmaConfig):
        cls.PRODUCER_MAKES_TRANSPOSED = args.rows_staged
    D = args.head_dim
    problem = P.AttentionProblem("float32", D, D, args.causal, 4, 16, 16, 4096, 4096, precision=(args.precision,))
    q, k, v, dout, out, lse, offset = emulated._problem(1, 37, 64, 1, 1, D, args.causal, seed=1)
    wavefronts: dict = {}
    if args.kind == "fwd":
        cfg = P.plan_forward(problem, named_device("h200")).config
        emulated._emulated_forward(cfg, q, k, v, offset, wavefronts)
    elif args.kind == "dkdv":
        cfg = P.plan_backward(problem, named_device("h200")).dkdv.config
        emulated._emulated_dkdv(cfg, q, k, v, dout, out, lse, offset, wavefronts)
    else:
        cfg = P.plan_backward(problem, named_device("h200")).dq.config
        delta = np.einsum("bshd,bshd->bhs", dout, out).astype(np.float32)
        emulated._emulated_dq(cfg, q, k, v, dout, lse, delta, offset, wavefronts)
    print(cfg.name_expression)
    over = sorted(((sum(runs) / (fewest(s) * len(runs)), s, runs) for s, runs in wavefronts.items()
                   if max(runs) > fewest(s)), reverse=True)
    for ratio, statement, runs in over:
        print(f"  {ratio:5.2f}x  {' '.join(statement.split())}  ({len(runs)} warp runs, {max(runs)} wavefronts at most)")
    total = sum(sum(runs) for runs in wavefronts.values())
    least = sum(fewest(s) * len(runs) for s, runs in wavefronts.items())
    print(f"shared wavefronts: {total} where {least} would do ({total / least:.2f}x); "
          f"{len(over)} of {len(wavefronts)} statements over")
    return 0


if __name__ == "__main__":
    sys.exit(main())
