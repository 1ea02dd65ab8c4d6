"""How fast and how accurate is each float32 precision mode, next to torch's float32 attention?

Each precision mode of cupyattn ("fp32" 3xTF32, "tf32", "bf16" and "fp16" staging) next to
torch SDPA's float32 path (its memory-efficient backend, the one that takes float32), same
process, same GPU, with each mode's measured error.

Times: as scripts/bench.py (median of CUDA-event timings, B=4, H=16, fresh random inputs).
Errors: max |out - float64 reference| over 64 sampled query rows of every head (B=1, H=16;
forward), and over all of dq, dk, dv (B=1, H=4, S <= 1024; backward); next to them the same
for a float32 NumPy reference ("numpy f32") and for cupyattn's CUDA-core (FFMA) kernels,
which GPUs without tensor cores run. Targets at S = 4096: "fp32" >= 1.5x torch, "tf32" >= 3x.

    PYTHONPATH=. python scripts/bench_fp32.py [--dims 64,128,256] [--seqlens 1024,4096]
        [--pass fwd,bwd] [--nondeterministic] [--json FILE]

--nondeterministic times and checks the backward with deterministic=False (dQ added by
float32 atomics where the planner fuses it into the dK/dV pass).
"""

import argparse
import json
from pathlib import Path

import cupy
import numpy as np
from bench import bench_cupyattn, bench_torch, flops  # bench.py, beside this script

import cupyattn
from cupyattn import testing
from cupyattn.plan import PRECISIONS, Policy
from cupyattn.reference import attention_backward_reference, attention_reference

TARGETS = {"fp32": 1.5, "tf32": 3.0}
B, H = 4, 16


CUDA_CORES_ONLY = Policy(families={"simt"})  # the FFMA kernels, as GPUs without tensor cores run "fp32"


def errors(S, D, causal, backward, rng, deterministic=True):
    """{mode: max abs error vs float64}, plus "numpy f32", for one random problem."""
    Bv, Hv = 1, (4 if backward else H)
    host = [testing.host_values((Bv, S, Hv, D), "float32", rng) for _ in range(4)]
    q, k, v, do = (cupy.asarray(x) for x in host)
    rows = None if backward else np.sort(rng.choice(S, min(S, 64), replace=False))
    if backward:
        ref = attention_backward_reference(host[3], *host[:3], causal=causal)
        ref32 = attention_backward_reference(host[3], *host[:3], causal=causal, precision="float32")
    else:
        ref = attention_reference(*host[:3], causal=causal, rows=rows)[0]
        ref32 = attention_reference(*host[:3], causal=causal, rows=rows, precision="float32")[0]

    def err(got, want):  # got: all query rows of the forward, or (dq, dk, dv)
        if backward:
            return max(float(np.abs(np.asarray(g, np.float64) - w).max()) for g, w in zip(got, want))
        return float(np.abs(np.asarray(got, np.float64)[:, rows] - want).max())

    result = {"numpy f32": err(ref32, ref) if backward else float(np.abs(ref32 - ref).max())}
    out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, policy=CUDA_CORES_ONLY)
    got = cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, policy=CUDA_CORES_ONLY) if backward else out
    result["ffma"] = err([x.get() for x in got] if backward else got.get(), ref)
    for mode in PRECISIONS:
        out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=mode)
        got = (
            cupyattn.attention_backward(
                do, q, k, v, out, lse, causal=causal, precision=mode, deterministic=deterministic
            )
            if backward
            else out
        )
        result[mode] = err([x.get() for x in got] if backward else got.get(), ref)
    return result


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", default="64,128,256")
    parser.add_argument("--seqlens", default="1024,4096")
    parser.add_argument("--pass", dest="passes", default="fwd,bwd")
    parser.add_argument("--nondeterministic", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    deterministic = not args.nondeterministic
    ints = lambda s: tuple(int(x) for x in s.split(","))
    rng = np.random.default_rng(0)
    rows = []
    for pass_ in args.passes.split(","):
        backward = pass_ == "bwd"
        for D in ints(args.dims):
            for S in ints(args.seqlens):
                for causal in (False, True):
                    f = flops(B, H, S, D, causal, backward)
                    row = {"pass": pass_, "D": D, "S": S, "causal": causal, "deterministic": deterministic}
                    tms, _ = bench_torch(B, H, S, D, "float32", causal, backward, "EFFICIENT_ATTENTION")
                    row["torch_ms"] = tms
                    for mode in PRECISIONS:
                        ms, _ = bench_cupyattn(
                            B, H, S, D, "float32", causal, backward, precision=mode, deterministic=deterministic
                        )
                        row[f"{mode}_ms"] = ms
                        row[f"{mode}_tflops"] = f / ms / 1e9
                    if not backward or S <= 1024:
                        row["errors"] = errors(S, D, causal, backward, rng, deterministic)
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    for pass_ in args.passes.split(","):
        print(
            f"\n### {'Forward' if pass_ == 'fwd' else 'Backward'}, float32, B={B}, H={H}: "
            "speed-up over torch SDPA float32 (efficient backend), max abs error\n"
        )
        print(
            "| D | S | causal | torch ms | "
            + " | ".join(f"{m} ms | {m} vs torch" for m in PRECISIONS)
            + " | err numpy f32 | err ffma | "
            + " | ".join(f"err {m}" for m in PRECISIONS)
            + " |"
        )
        print("|" + "---|" * (4 + 2 * len(PRECISIONS) + 2 + len(PRECISIONS)))
        for r in rows:
            if r["pass"] != pass_:
                continue
            e = r.get("errors", {})
            fmt = lambda x: "-" if x is None else f"{x:.2e}"
            print(
                f"| {r['D']} | {r['S']} | {'yes' if r['causal'] else 'no'} | {r['torch_ms']:.3f} | "
                + " | ".join(f"{r[f'{m}_ms']:.3f} | {r['torch_ms'] / r[f'{m}_ms']:.2f}x" for m in PRECISIONS)
                + f" | {fmt(e.get('numpy f32'))} | {fmt(e.get('ffma'))} | "
                + " | ".join(fmt(e.get(m)) for m in PRECISIONS)
                + " |"
            )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
