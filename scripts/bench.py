"""Attention throughput: cupyattn next to PyTorch SDPA's backends, same process, same GPU.

TFLOP/s with FlashAttention's count: forward 4*B*H*Sq*Sk*D (halved when causal),
backward 2.5x the forward. Median of >= 20 CUDA-event timings after warm-up; inputs
are fresh random data, rotated over enough copies to exceed the L2 when they are
small. Next to each time: the peak device memory the call allocated beyond its
inputs (outputs included), from CuPy's allocator hooks and torch's peak statistics.
Ratios are cupyattn / torch's flash backend and cupyattn / cuDNN; the targets are
issue 5's (forward >= 1.0x flash at D = 64, 128 and >= 0.9x at D = 256 for S >= 4k;
backward >= 0.8x flash).

    PYTHONPATH=. python scripts/bench.py [--quick] [--pass fwd,bwd] [--json FILE] [--png FILE]
"""

import argparse
import json
import sys
from pathlib import Path

import cupy


import cupyattn  # noqa: E402
from cupyattn.testing import device_values, median_ms, peak_allocation_hook  # noqa: E402

L2_BYTES = 64 << 20
REPEATS, WARMUP = 20, 3
TORCH_BACKENDS = (("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"))


def flops(B, H, S, D, causal, backward):
    f = 4 * B * H * S * S * D / (2 if causal else 1)
    return f * 2.5 if backward else f


def target(pass_, D, S):
    """Issue 5's floor for cupyattn / flash, or None where it sets none."""
    if pass_ == "bwd":
        return 0.8
    if S < 4096:
        return None
    return 1.0 if D <= 128 else 0.9


def _copies(nbytes):
    return max(1, min(8, -(-3 * L2_BYTES // max(1, nbytes))))


def bench_cupyattn(B, H, S, D, dtype, causal, backward, precision=None, deterministic=True):
    n = _copies(3 * B * S * H * D * 2)
    rng = cupy.random.default_rng(0)
    sets = [[device_values((B, S, H, D), dtype, rng) for _ in range(4)] for _ in range(n)]
    it = iter(range(10**9))
    saved = []
    if not backward:
        def fn():
            q, k, v, _ = sets[next(it) % n]
            cupyattn.attention(q, k, v, causal=causal, precision=precision)
    else:
        saved += [cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=precision)
                  for q, k, v, _ in sets]

        def fn():
            i = next(it) % n
            q, k, v, do = sets[i]
            out, lse = saved[i]
            cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, precision=precision,
                                        deterministic=deterministic)
    ms = median_ms(fn, repeats=REPEATS, warmup=WARMUP)
    hook = peak_allocation_hook()
    with hook:
        fn()
        cupy.cuda.Device().synchronize()
    sets.clear()
    saved.clear()
    cupy.get_default_memory_pool().free_all_blocks()  # leave the memory to the next benchmark
    return ms, hook.peak


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
    ms = median_ms(fn, repeats=REPEATS, warmup=WARMUP)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return ms, peak


def table(rows, pass_):
    lines = ["| dtype | D | S | causal | cupyattn TFLOP/s | ms | peak MiB | flash | efficient | cuDNN "
             "| flash peak MiB | vs flash | vs cuDNN | target | met |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else f"{x:.1f}"
    for r in rows:
        if r["pass"] != pass_:
            continue
        vs_flash = r["cupyattn"] / r["flash"] if r.get("flash") else None
        vs_cudnn = r["cupyattn"] / r["cudnn"] if r.get("cudnn") else None
        tgt = target(pass_, r["D"], r["S"])
        met = "-" if tgt is None or vs_flash is None else ("yes" if vs_flash >= tgt else "no")
        lines.append(
            f"| {r['dtype']} | {r['D']} | {r['S']} | {'yes' if r['causal'] else 'no'} | {r['cupyattn']:.1f} "
            f"| {r['ms']:.3f} | {r['peak_mib']:.0f} | {fmt(r.get('flash'))} | {fmt(r.get('efficient'))} "
            f"| {fmt(r.get('cudnn'))} | {fmt(r.get('flash_peak_mib'))} "
            f"| {'-' if vs_flash is None else f'{vs_flash:.2f}x'} | {'-' if vs_cudnn is None else f'{vs_cudnn:.2f}x'} "
            f"| {'-' if tgt is None else f'{tgt:.1f}x'} | {met} |")
    return "\n".join(lines)


def plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not importable: no plot", file=sys.stderr)
        return
    keys = sorted({(r["pass"], r["dtype"], r["causal"]) for r in rows})
    dims = sorted({r["D"] for r in rows})
    fig, axes = plt.subplots(len(keys), len(dims), figsize=(4 * len(dims), 3 * len(keys)), squeeze=False)
    for i, (pass_, dtype, causal) in enumerate(keys):
        for j, D in enumerate(dims):
            ax = axes[i][j]
            sel = sorted((r for r in rows if (r["pass"], r["dtype"], r["causal"], r["D"]) == (pass_, dtype, causal, D)),
                         key=lambda r: r["S"])
            for impl in ("cupyattn", "flash", "efficient", "cudnn"):
                pts = [(r["S"], r[impl]) for r in sel if r.get(impl)]
                if pts:
                    ax.plot(*zip(*pts), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{pass_} {dtype} D={D} causal={causal}", fontsize=8)
            ax.set_xlabel("S")
            ax.set_ylabel("TFLOP/s")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="S in {1k, 4k}, D in {64, 128}, fp16 only")
    parser.add_argument("--pass", dest="passes", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    parser.add_argument("--dtypes", default=None)
    parser.add_argument("--dims", default=None)
    parser.add_argument("--seqlens", default=None)
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--json", default=None)
    parser.add_argument("--png", default=None)
    args = parser.parse_args()
    ints = lambda s: tuple(int(x) for x in s.split(","))
    seqlens = ints(args.seqlens) if args.seqlens else ((1024, 4096) if args.quick else (1024, 4096, 8192, 16384))
    dims = ints(args.dims) if args.dims else ((64, 128) if args.quick else (64, 128, 256))
    dtypes = tuple(args.dtypes.split(",")) if args.dtypes else (("float16",) if args.quick else ("float16", "bfloat16"))
    B, H = 4, 16
    rows = []
    for pass_ in args.passes.split(","):
        backward = pass_ == "bwd"
        for dtype in dtypes:
            for D in dims:
                for S in seqlens:
                    for causal in (False, True):
                        f = flops(B, H, S, D, causal, backward)
                        row = {"pass": pass_, "dtype": dtype, "D": D, "S": S, "causal": causal, "B": B, "H": H}
                        ms, peak = bench_cupyattn(B, H, S, D, dtype, causal, backward)
                        row.update(cupyattn=f / ms / 1e9, ms=ms, peak_mib=peak / 2**20)
                        for name, be in TORCH_BACKENDS if not args.no_torch else ():
                            try:
                                tms, tpeak = bench_torch(B, H, S, D, dtype, causal, backward, be)
                                import torch

                                torch.cuda.empty_cache()
                                row[name] = f / tms / 1e9
                                row[f"{name}_peak_mib"] = tpeak / 2**20
                            except Exception as exc:  # a backend that refuses a shape is left out
                                row[name] = None
                                row[f"{name}_error"] = str(exc)[:200]
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    for pass_ in args.passes.split(","):
        print(f"\n### {'Forward' if pass_ == 'fwd' else 'Backward'}, B={B}, H={H}\n")
        print(table(rows, pass_))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.png:
        plot(rows, args.png)


if __name__ == "__main__":
    main()
