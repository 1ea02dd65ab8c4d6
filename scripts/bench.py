"""Attention throughput: cupyattn next to PyTorch SDPA's backends, same process, same GPU.

TFLOP/s with FlashAttention's count: forward 4*B*H*Sq*Sk*D (halved when causal),
backward 2.5x the forward. Median of CUDA-event timings after warm-up; inputs are
fresh random data, rotated over enough copies to exceed the L2 when they are small.

    PYTHONPATH=. python scripts/bench.py [--quick] [--backward] [--json FILE]
"""

import argparse
import json
import sys
from pathlib import Path

import cupy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupyattn  # noqa: E402
from cupyattn.testing import median_ms  # noqa: E402

L2_BYTES = 64 << 20


def flops(B, H, S, D, causal, backward):
    f = 4 * B * H * S * S * D / (2 if causal else 1)
    return f * 2.5 if backward else f


def _copies(nbytes):
    return max(1, min(8, -(-3 * L2_BYTES // max(1, nbytes))))


def bench_cupyattn(B, H, S, D, dtype, causal, backward):
    rng = cupy.random.default_rng(0)
    cdt = cupy.float16 if dtype == "float16" else cupy.float32
    n = _copies(3 * B * S * H * D * 2)
    sets = []
    for _ in range(n):
        x = [rng.standard_normal((B, S, H, D), dtype=cupy.float32).astype(cdt) for _ in range(4)]
        if dtype == "bfloat16":
            from cupyattn.testing import bfloat16_dtype

            x = [(a.astype(cupy.float32).view(cupy.uint32) >> 16).astype(cupy.uint16).view(bfloat16_dtype())
                 for a in x]
        sets.append(x)
    it = iter(range(10**9))
    if not backward:
        def fn():
            q, k, v, _ = sets[next(it) % n]
            cupyattn.attention(q, k, v, causal=causal)
    else:
        saved = [cupyattn.attention(q, k, v, causal=causal, return_lse=True) for q, k, v, _ in sets]

        def fn():
            i = next(it) % n
            q, k, v, do = sets[i]
            out, lse = saved[i]
            cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal)
    return median_ms(fn, repeats=20, warmup=3)


def bench_torch(B, H, S, D, dtype, causal, backward, backend):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tdt = getattr(torch, dtype)
    n = _copies(3 * B * S * H * D * 2)
    sets = [[torch.randn(B, H, S, D, device="cuda", dtype=tdt, requires_grad=backward) for _ in range(3)]
            + [torch.randn(B, H, S, D, device="cuda", dtype=tdt)] for _ in range(n)]
    F = torch.nn.functional.scaled_dot_product_attention
    be = getattr(SDPBackend, backend)
    it = iter(range(10**9))
    if not backward:
        def fn():
            q, k, v, _ = sets[next(it) % n]
            with torch.no_grad(), sdpa_kernel(be):
                F(q, k, v, is_causal=causal)
    else:
        outs = []
        for q, k, v, _ in sets:
            with sdpa_kernel(be):
                outs.append(F(q, k, v, is_causal=causal))

        def fn():
            i = next(it) % n
            q, k, v, do = sets[i]
            torch.autograd.grad(outs[i], (q, k, v), do, retain_graph=True)
    # torch and CuPy share the legacy default stream, so CuPy's events time torch's kernels.
    return median_ms(fn, repeats=20, warmup=3)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="S in {1k, 4k}, D in {64, 128}, fp16 only")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    seqlens = (1024, 4096) if args.quick else (1024, 4096, 8192, 16384)
    dims = (64, 128) if args.quick else (64, 128, 256)
    dtypes = ("float16",) if args.quick else ("float16", "bfloat16")
    B, H = 4, 16
    rows = []
    passes = (False, True) if args.backward else (False,)
    for backward in passes:
        for dtype in dtypes:
            for D in dims:
                for S in seqlens:
                    for causal in (False, True):
                        f = flops(B, H, S, D, causal, backward)
                        row = dict(pass_="bwd" if backward else "fwd", dtype=dtype, D=D, S=S, causal=causal)
                        ms = bench_cupyattn(B, H, S, D, dtype, causal, backward)
                        row["cupyattn"] = f / ms / 1e9
                        for name, be in (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION")):
                            try:
                                row[name] = f / bench_torch(B, H, S, D, dtype, causal, backward, be) / 1e9
                            except Exception:
                                row[name] = None
                        rows.append(row)
                        fmt = lambda x: "-" if x is None else f"{x:7.1f}"
                        ratio = lambda x: "-" if not x else f"{row['cupyattn'] / x:5.2f}x"
                        print(f"{row['pass_']} {dtype:<8} D={D:<3} S={S:<5} causal={causal!s:<5} "
                              f"cupyattn {row['cupyattn']:7.1f}  flash {fmt(row['flash'])}  "
                              f"cudnn {fmt(row['cudnn'])} TFLOP/s  vs flash {ratio(row['flash'])}  "
                              f"vs cudnn {ratio(row['cudnn'])}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
