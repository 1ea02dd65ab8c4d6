"""How fast is cupyattn in float16 / bfloat16 next to what users already run, on this GPU?

One process, one GPU, the same inputs' shapes for every implementation: cupyattn, PyTorch
SDPA's flash backend (FlashAttention-2) and cuDNN backend, and FlashAttention-3 through
`flash_attn3_jax` where it imports (Hopper, head dims up to 128; it runs on JAX's stream,
timed as many back-to-back calls and one synchronization, since a synchronization a call
would add JAX's dispatch to every call).

TFLOP/s with FlashAttention's count: forward 4*B*Hq*Sq*Sk*D (halved when causal), backward
2.5x the forward. Median of CUDA-event timings after warm-up (5-20 repeats, fewer for long
calls); inputs are fresh random data, rotated over enough copies to exceed the L2. Shapes:
"mha" B=4, 16 heads; "gqa" B=1, 64 query heads over 8 KV heads. The backward is timed alone
(saved out and lse); cupyattn's with deterministic=True and, where its plan differs,
deterministic=False. --families limits cupyattn to some kernel families through the
planner's policy (e.g. "mma,simt": the mma.sync kernels that sm_80-sm_89 run, on this GPU).

    PYTHONPATH=. python scripts/bench.py [--quick] [--pass fwd,bwd] [--shapes mha,gqa]
        [--dtypes float16,bfloat16] [--dims 64,128,256] [--seqlens 4096,8192,16384]
        [--gqa-seqlens 8192] [--families mma,simt] [--json FILE]
"""

import argparse
import json
import os
import time
from pathlib import Path

import cupy

import cupyattn

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # JAX shares the GPU with CuPy and torch

from cupyattn.plan import Policy
from cupyattn.testing import device_values, median_ms, peak_allocation_hook

L2_BYTES = 64 << 20
SHAPES = {"mha": (4, 16, 16), "gqa": (1, 64, 8)}  # (batch, query heads, KV heads)
TORCH_BACKENDS = (("flash", "FLASH_ATTENTION"), ("cudnn", "CUDNN_ATTENTION"))
BASELINES = ("flash", "cudnn", "fa3")


def flops(B, H, S, D, causal, backward):
    f = 4 * B * H * S * S * D / (2 if causal else 1)
    return f * 2.5 if backward else f


def _copies(nbytes):
    return max(1, min(8, -(-3 * L2_BYTES // max(1, nbytes))))


def _time(fn):
    """Median ms of ``fn()``: 5 to 20 repeats, as many as fit in about half a second."""
    first = median_ms(fn, repeats=1, warmup=2)
    return median_ms(fn, repeats=max(5, min(20, int(500 / max(first, 1e-3)))), warmup=0)


def bench_cupyattn(B, H, S, D, dtype, causal, backward, precision=None, deterministic=True, heads_kv=None, policy=None):
    """(ms, peak bytes allocated by one call) of cupyattn's forward or backward."""
    hkv = heads_kv or H
    n = _copies(3 * B * S * H * D * 2)
    rng = cupy.random.default_rng(0)
    shapes = ((B, S, H, D), (B, S, hkv, D), (B, S, hkv, D), (B, S, H, D))
    sets = [[device_values(s, dtype, rng) for s in shapes] for _ in range(n)]
    it = iter(range(10**9))
    kw = dict(causal=causal, precision=precision)
    if policy is not None:
        kw["policy"] = policy
    if not backward:

        def fn():
            q, k, v, _ = sets[next(it) % n]
            cupyattn.attention(q, k, v, **kw)
    else:
        saved = [cupyattn.attention(q, k, v, return_lse=True, **kw) for q, k, v, _ in sets]

        def fn():
            i = next(it) % n
            q, k, v, do = sets[i]
            out, lse = saved[i]
            cupyattn.attention_backward(do, q, k, v, out, lse, deterministic=deterministic, **kw)

    ms = _time(fn)
    hook = peak_allocation_hook()
    with hook:
        fn()
        cupy.cuda.Device().synchronize()
    sets.clear()
    cupy.get_default_memory_pool().free_all_blocks()  # leave the memory to the next benchmark
    return ms, hook.peak


def bench_torch(B, H, S, D, dtype, causal, backward, backend, heads_kv=None):
    """(ms, peak bytes) of torch SDPA with one backend forced."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    hkv = heads_kv or H
    tdt = getattr(torch, dtype)
    n = _copies(3 * B * S * H * D * 2)
    new = lambda h, grad: torch.randn(B, h, S, D, device="cuda", dtype=tdt, requires_grad=grad)
    sets = [[new(H, backward), new(hkv, backward), new(hkv, backward), new(H, False)] for _ in range(n)]
    F = torch.nn.functional.scaled_dot_product_attention
    kw = dict(is_causal=causal, enable_gqa=hkv != H)
    be = getattr(SDPBackend, backend)
    it = iter(range(10**9))
    if not backward:

        def fn():
            q, k, v, _ = sets[next(it) % n]
            with torch.no_grad(), sdpa_kernel(be):
                F(q, k, v, **kw)
    else:
        outs = []
        for q, k, v, _ in sets:
            with sdpa_kernel(be):
                outs.append(F(q, k, v, **kw))

        def fn():
            i = next(it) % n
            q, k, v, do = sets[i]
            torch.autograd.grad(outs[i], (q, k, v), do, retain_graph=True)

    # torch and CuPy share the legacy default stream, so CuPy's events time torch's kernels.
    ms = _time(fn)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    return ms, peak


def fa3_available() -> str | None:
    """None if flash_attn3_jax runs here, else why not."""
    try:
        import flash_attn3_jax  # noqa: F401
        import jax

        if not any(d.platform == "gpu" for d in jax.devices()):
            return "JAX sees no GPU"
    except Exception as exc:  # ImportError, or a library that does not load
        return f"flash_attn3_jax: {exc}"[:200]
    return None


def bench_fa3(B, H, S, D, dtype, causal, backward, heads_kv=None):
    """ms of FlashAttention-3's forward or backward (flash_attn3_jax), from many back-to-back calls."""
    import jax
    import jax.numpy as jnp
    from flash_attn3_jax import flash as fa3

    hkv = heads_kv or H
    jdt = getattr(jnp, dtype)
    n = _copies(3 * B * S * H * D * 2)
    keys = iter(jax.random.split(jax.random.PRNGKey(0), 4 * n))
    new = lambda h: jax.random.normal(next(keys), (B, S, h, D), jdt)
    sets = [(new(H), new(hkv), new(hkv), new(H)) for _ in range(n)]
    scale = D**-0.5
    if not backward:
        run = jax.jit(lambda q, k, v: fa3.flash_mha(q, k, v, softmax_scale=scale, is_causal=causal))
        args = [s[:3] for s in sets]
    else:
        fwd = jax.jit(
            lambda q, k, v: fa3._flash_mha_fwd(q, k, v, softmax_scale=scale, is_causal=causal, window_size=(-1, -1))
        )
        run = jax.jit(
            lambda do, q, k, v, o, lse: fa3._flash_mha_bwd(
                do, q, k, v, o, lse, softmax_scale=scale, is_causal=causal, window_size=(-1, -1)
            )
        )
        args = [(do, q, k, v, *fwd(q, k, v)) for q, k, v, do in sets]

    def calls(count):
        for i in range(count):
            out = run(*args[i % n])
        jax.block_until_ready(out)

    calls(2 * n)  # compile and warm up
    t = time.perf_counter()
    calls(n)
    one = (time.perf_counter() - t) / n
    count = max(2 * n, min(200, int(1.0 / max(one, 1e-6))))
    times = []
    for _ in range(3):
        t = time.perf_counter()
        calls(count)
        times.append((time.perf_counter() - t) / count * 1e3)
    return sorted(times)[1]


def _plans_differ(B, H, hkv, S, D, dtype, causal, policy):
    """Whether deterministic=False plans other backward kernels than the default."""
    from cupyattn.device import current_device
    from cupyattn.plan import AttentionProblem, plan_backward

    names = []
    for det in (True, False):
        p = AttentionProblem(dtype, D, D, causal, B, H, hkv, S, S, deterministic=det)
        plans = plan_backward(p, current_device(), policy=policy).plans
        names.append([pl.config.name_expression for pl in plans])
    return names[0] != names[1]


def measure(pass_, dtype, shape, D, S, causal, baselines, policy=None):
    B, H, hkv = SHAPES[shape]
    backward = pass_ == "bwd"
    f = flops(B, H, S, D, causal, backward)
    row = {"pass": pass_, "dtype": dtype, "shape": shape, "B": B, "H": H, "Hkv": hkv, "D": D, "S": S, "causal": causal}
    ms, peak = bench_cupyattn(B, H, S, D, dtype, causal, backward, heads_kv=hkv, policy=policy)
    row.update(cupyattn=f / ms / 1e9, ms=ms, peak_mib=peak / 2**20)
    if backward and _plans_differ(B, H, hkv, S, D, dtype, causal, policy):
        ms, _ = bench_cupyattn(B, H, S, D, dtype, causal, True, deterministic=False, heads_kv=hkv, policy=policy)
        row["cupyattn_nondeterministic"] = f / ms / 1e9
    for name, backend in TORCH_BACKENDS:
        if name not in baselines:
            continue
        try:
            tms, _ = bench_torch(B, H, S, D, dtype, causal, backward, backend, heads_kv=hkv)
            row[name] = f / tms / 1e9
            import torch

            torch.cuda.empty_cache()
        except Exception as exc:  # a backend that refuses a shape is left out, with why
            row[f"{name}_error"] = str(exc)[:200]
    if "fa3" in baselines and D <= 128:  # flash_attn3_jax builds head dims up to 128
        try:
            row["fa3"] = f / bench_fa3(B, H, S, D, dtype, causal, backward, heads_kv=hkv) / 1e9
        except Exception as exc:
            row["fa3_error"] = str(exc)[:200]
    return row


def table(rows, pass_):
    """The markdown table of one pass: TFLOP/s and cupyattn / baseline ratios."""
    nondet = any("cupyattn_nondeterministic" in r for r in rows if r["pass"] == pass_)
    head = ["dtype", "heads", "D", "S", "causal", "cupyattn"] + (["cupyattn nondet."] if nondet else [])
    head += ["torch flash (FA2)", "cuDNN", "FA3", "vs FA2", "vs cuDNN", "vs FA3"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    num = lambda x: "-" if x is None else f"{x:.0f}"
    for r in rows:
        if r["pass"] != pass_:
            continue
        heads = f"{r['H']}" if r["H"] == r["Hkv"] else f"{r['H']}/{r['Hkv']}"
        cells = [
            r["dtype"],
            f"B={r['B']} {heads}",
            str(r["D"]),
            str(r["S"]),
            "yes" if r["causal"] else "no",
            num(r["cupyattn"]),
        ]
        if nondet:
            cells.append(num(r.get("cupyattn_nondeterministic")))
        cells += [num(r.get(b)) for b in BASELINES]
        cells += ["-" if not r.get(b) else f"{r['cupyattn'] / r[b]:.2f}x" for b in BASELINES]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="S=4096, D in {64, 128}, float16, mha only")
    parser.add_argument("--pass", dest="passes", default="fwd,bwd", help="fwd, bwd or fwd,bwd")
    parser.add_argument("--shapes", default="mha,gqa", help="mha (B=4, 16 heads), gqa (B=1, 64/8 heads)")
    parser.add_argument("--dtypes", default="float16,bfloat16")
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlens", default="4096,8192,16384", help="for mha")
    parser.add_argument("--gqa-seqlens", default="8192")
    parser.add_argument("--baselines", default=",".join(BASELINES), help="flash, cudnn, fa3 (any of)")
    parser.add_argument("--families", default=None, help="cupyattn's kernel families (plan.FAMILIES), e.g. mma,simt")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    policy = Policy(families=args.families.split(",")) if args.families else None
    ints = lambda s: tuple(int(x) for x in s.split(","))
    if args.quick:
        args.shapes, args.dtypes, args.dims, args.seqlens = "mha", "float16", "64,128", "4096"
    baselines = set(args.baselines.split(","))
    if "fa3" in baselines and (why := fa3_available()) is not None:
        print(f"no FA3 column: {why}", flush=True)
        baselines.discard("fa3")
    rows = []
    for pass_ in args.passes.split(","):
        for dtype in args.dtypes.split(","):
            for shape in args.shapes.split(","):
                for D in ints(args.dims):
                    for S in ints(args.seqlens if shape == "mha" else args.gqa_seqlens):
                        for causal in (False, True):
                            rows.append(measure(pass_, dtype, shape, D, S, causal, baselines, policy))
                            print(json.dumps(rows[-1]), flush=True)
    print(f"\nGPU: {cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()}, TFLOP/s")
    for pass_ in args.passes.split(","):
        print(f"\n### {'Forward' if pass_ == 'fwd' else 'Backward'}\n")
        print(table(rows, pass_))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
