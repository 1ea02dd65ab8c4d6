"""How much host time does one cupyattn call cost, next to torch SDPA's, on a problem so small
that the host is the bottleneck?

The host time of a call is the wall time of many back-to-back calls (no synchronization
between them) divided by their number, after warm-up (kernels compiled, plans cached); the
GPU finishes each tiny kernel before the host has issued the next, so the queue never fills.
Rows: SDPA (flash backend, the one torch picks here), ``cupyattn.torch.attention``,
``cupyattn.torch.scaled_dot_product_attention``, and ``cupyattn.attention`` on CuPy arrays.
``--profile`` prints where the torch adapter's time goes (cProfile, top functions).

    PYTHONPATH=. python scripts/call_overhead.py [--dtype bfloat16] [--calls 2000] [--profile]
        [--json FILE]
"""

import argparse
import cProfile
import json
import pstats
import time

import cupy
import torch
import torch.nn.functional as F

import cupyattn
import cupyattn.torch
from cupyattn.testing import device_values

SHAPE = (1, 1, 128, 64)  # (B, H, S, D): the kernel takes a few microseconds


def host_us(fn, calls: int) -> float:
    """Median over 5 rounds of the host microseconds a call, ``calls`` calls a round."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    rounds = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        rounds.append((time.perf_counter() - start) / calls * 1e6)
        torch.cuda.synchronize()
    return sorted(rounds)[2]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--json")
    args = parser.parse_args()

    B, H, S, D = SHAPE
    tdt = getattr(torch, args.dtype)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=tdt) for _ in range(3))
    cq, ck, cv = (device_values((B, S, H, D), args.dtype, cupy.random.default_rng(0)) for _ in range(3))
    rows = {}
    with torch.no_grad():
        rows["torch sdpa"] = host_us(lambda: F.scaled_dot_product_attention(q, k, v), args.calls)
        rows["cupyattn.torch.attention"] = host_us(lambda: cupyattn.torch.attention(q, k, v), args.calls)
        rows["cupyattn.torch.scaled_dot_product_attention"] = host_us(
            lambda: cupyattn.torch.scaled_dot_product_attention(q, k, v), args.calls
        )
    rows["cupyattn.attention (CuPy)"] = host_us(lambda: cupyattn.attention(cq, ck, cv), args.calls)
    base = rows["torch sdpa"]
    print(f"{torch.cuda.get_device_name()}, {args.dtype}, (B, H, S, D) = {SHAPE}, host us a call:")
    for name, us in rows.items():
        print(f"  {name:45s} {us:7.1f} us  {us / base:5.2f}x sdpa")
    if args.profile:
        prof = cProfile.Profile()
        with torch.no_grad():
            prof.enable()
            for _ in range(args.calls):
                cupyattn.torch.attention(q, k, v)
            prof.disable()
        pstats.Stats(prof).sort_stats("tottime").print_stats(25)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "dtype": args.dtype, "shape": SHAPE, "host_us": rows}, f)


if __name__ == "__main__":
    main()
