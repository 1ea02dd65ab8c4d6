"""Where a call's time goes: every launch of one forward or backward call timed on its own
(CUDA events around each launch, median over repeats), as planned on this GPU.

    PYTHONPATH=. python scripts/launch_times.py --dtype float32 --precision tf32 --dims 64,128 [--causal]
        [--pass fwd,bwd] [--nondeterministic]

Prints one line per launch (kernel name, blocks, ms) and the whole call's median.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupyattn  # noqa: E402
from cupyattn import api  # noqa: E402
from cupyattn.testing import device_values, median_ms  # noqa: E402


def timed_launches(fn, repeats: int):
    """Median ms of each launch ``fn`` makes (in order), timing api._launch."""
    times = defaultdict(list)
    original = api._launch

    def launch(config, spec, blocks, what, args, smem=0):
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        original(config, spec, blocks, what, args, smem)
        stop.record()
        stop.synchronize()
        times[(len(times_seen), config.name_expression, blocks)].append(cupy.cuda.get_elapsed_time(start, stop))
        times_seen.append(None)

    api._launch = launch
    try:
        for _ in range(repeats + 1):
            times_seen = []
            fn()
    finally:
        api._launch = original
    return [(name, blocks, float(np.median(ms[1:]))) for (_, name, blocks), ms in sorted(times.items())]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--precision", default=None)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlen", type=int, default=4096)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--pass", dest="passes", default="fwd,bwd")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nondeterministic", action="store_true", help="the backward with deterministic=False")
    args = parser.parse_args()
    opts = dict(causal=args.causal, precision=args.precision)
    for D in (int(d) for d in args.dims.split(",")):
        rng = cupy.random.default_rng(0)
        q, k, v, do = (device_values((args.batch, args.seqlen, args.heads, D), args.dtype, rng) for _ in range(4))
        out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
        calls = {"fwd": lambda: cupyattn.attention(q, k, v, **opts),
                 "bwd": lambda: cupyattn.attention_backward(do, q, k, v, out, lse, **opts,
                                                            deterministic=not args.nondeterministic)}
        for name in args.passes.split(","):
            whole = median_ms(calls[name], repeats=args.repeats, warmup=1)
            print(f"{name} {args.dtype} {args.precision} D={D} B={args.batch} H={args.heads} S={args.seqlen} "
                  f"causal={args.causal}: {whole:.3f} ms per call")
            for kernel, blocks, ms in timed_launches(calls[name], args.repeats):
                print(f"    {ms:8.3f} ms  {blocks:7d} blocks  {kernel}")


if __name__ == "__main__":
    main()
