"""Time the second seed thread's case, forward + backward, next to PyTorch SDPA.

float32, causal, B=4, H=4, S=4096, head dims 128 and 256; cupyattn planned for the
RTX 6000 Ada's 101376 bytes (smem_limit) and for the device's own limit; torch's
float32 SDPA backends (memory-efficient and math) in the same process. Median of
CUDA-event timings after warm-up. Usage: PYTHONPATH=. python scripts/bench_seed.py
"""

import argparse
import json

import cupy

import cupyattn
from cupyattn.testing import median_ms


def bench_cupyattn(B, S, H, D, smem_limit):
    rng = cupy.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((B, S, H, D), dtype=cupy.float32) for _ in range(4))

    def fwd_bwd():
        out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True, smem_limit=smem_limit)
        cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True, smem_limit=smem_limit)

    fwd = median_ms(lambda: cupyattn.attention(q, k, v, causal=True, smem_limit=smem_limit))
    return fwd, median_ms(fwd_bwd)


def bench_torch(B, S, H, D, backend_name):
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = getattr(SDPBackend, backend_name)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float32, requires_grad=True)
               for _ in range(3))
    dout = torch.randn(B, H, S, D, device="cuda", dtype=torch.float32)
    F = torch.nn.functional.scaled_dot_product_attention

    def fwd():
        with sdpa_kernel(backend):
            return F(q, k, v, is_causal=True)

    def fwd_bwd():
        out = fwd()
        torch.autograd.grad(out, (q, k, v), dout)

    def run(fn):
        def wrapped():
            fn()
            torch.cuda.synchronize()
        return median_ms(wrapped)

    with torch.no_grad():
        f = run(fwd)
    return f, run(fwd_bwd)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    B, S, H = 4, 4096, 4
    rows = []
    for D in (128, 256):
        for label, limit in (("cupyattn smem_limit=101376", 101376), ("cupyattn device limit", None)):
            f, fb = bench_cupyattn(B, S, H, D, limit)
            rows.append((D, label, f, fb))
        for backend in ("EFFICIENT_ATTENTION", "MATH"):
            try:
                f, fb = bench_torch(B, S, H, D, backend)
            except Exception as exc:  # torch absent, or backend refuses the shape
                print(f"torch {backend} D={D}: {type(exc).__name__}: {exc}")
                continue
            rows.append((D, f"torch SDPA {backend.lower()}", f, fb))
    print(f"float32, causal, B={B}, H={H}, S={S} ({cupy.cuda.runtime.getDeviceProperties(0)['name'].decode()})")
    print(f"{'D':>4}  {'implementation':<28} {'fwd ms':>9} {'fwd+bwd ms':>11}")
    for D, label, f, fb in rows:
        print(f"{D:>4}  {label:<28} {f:>9.2f} {fb:>11.2f}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump([dict(D=D, impl=label, fwd_ms=f, fwd_bwd_ms=fb) for D, label, f, fb in rows], fh, indent=1)


if __name__ == "__main__":
    main()
