"""Why 3xTF32 adds each k-step apart: a float64 model of the "fp32" forward's sums.

Emulates, on the CPU, the forward as the tensor-core kernel computes it: operands
split into TF32 parts (big = x rounded to TF32, small = x - big truncated to TF32
as the tensor cores read it), each m16n8k8 k-step's three products exact, and the
float32 additions around them either

  chain      - through one accumulator with round-toward-zero adds, as mma.sync
               chains its C operand (the tensor cores truncate float32 sums), or
  per k-step - the three products of a k-step in a fresh accumulator, added to the
               running sum with a rounded float32 add (what kernels/mma.cuh does);
  wgmma      - per k-step for S = Q K^T, and 4 k-steps (12 products) per fresh
               accumulator for P V (kernels/attn_fwd_wgmma.cuh, 64-key tiles);

softmax in float32. Prints each variant's max error against the float64 reference
as a multiple of a float32 NumPy reference's error (issue 6 asks for at most 2).

--wide models the backward's 16-column score products where B's parts are stored as
rows (wgmma_tiles.cuh, words_by_rows with PARTS_AS_ROWS): two k-steps a group, their
big·big products chained in one fresh accumulator and their big·small ones in another
(one n32 wgmma each k-step), the group's two sums added (rounded) and added to the
running sum, the small·big products chained in one accumulator over all k-steps and
added last; against one k-step a fresh accumulator. Prints the errors of the product
itself (max and rms) against a float32 NumPy matmul's, for random (64 x D) (D x 512).

    PYTHONPATH=. python scripts/tf32_error_model.py [--dims 64,128] [--seqlen 1024] [--wide]
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyattn import testing  # noqa: E402
from cupyattn.reference import attention_reference, round_to  # noqa: E402

F32 = np.float32


def round_toward_zero(x64: np.ndarray) -> np.ndarray:
    r = x64.astype(F32)
    over = np.abs(r.astype(np.float64)) > np.abs(x64)
    r[over] = np.nextafter(r[over], F32(0))
    return r


def split(x: np.ndarray):
    x = np.asarray(x, F32)
    big = round_to(x, "tf32")
    small = ((x - big).view(np.uint32) & np.uint32(0xFFFFE000)).view(F32)
    return big.astype(np.float64), small.astype(np.float64)


def k_step_products(a, b):
    """a (..., m, K) times b (..., K, n) in k-steps of 8, 3xTF32: per k-step (its index,
    whether it is the last, small·big, big·small, big·big), each exact in float64."""
    (ab, as_), (bb, bs) = split(a), split(b)
    steps = range(0, a.shape[-1], 8)
    for i, k0 in enumerate(steps):
        k = slice(k0, k0 + 8)
        yield i, i + 1 == len(steps), as_[..., k] @ bb[..., k, :], ab[..., k] @ bs[..., k, :], ab[..., k] @ bb[..., k, :]


def product(a, b, per_k_step: bool, group: int = 1):
    """a (..., m, K) times b (..., K, n), 3xTF32 in k-steps of 8, float32 sums; with
    ``per_k_step``, ``group`` k-steps share each fresh accumulator."""
    c = np.zeros(a.shape[:-1] + b.shape[-1:], F32)
    step = np.zeros_like(c)
    for i, last, *terms in k_step_products(a, b):
        if per_k_step:
            for t in terms:
                step = round_toward_zero(step.astype(np.float64) + t)
            if (i + 1) % group == 0 or last:
                c = (c + step).astype(F32)
                step = np.zeros_like(c)
        else:
            for t in terms:
                c = round_toward_zero(c.astype(np.float64) + t)
    return c


def wide_product(a, b):
    """a (..., m, K) times b (..., K, n) as words_by_rows sums it with B's parts as rows
    (PARTS_AS_ROWS, two k-steps a group): see --wide above."""
    c = np.zeros(a.shape[:-1] + b.shape[-1:], F32)
    small_big = np.zeros_like(c)
    for i, last, sb, bs, bb in k_step_products(a, b):
        if i % 2 == 0:
            left = right = np.zeros_like(c)
        left = round_toward_zero(left.astype(np.float64) + bb)
        right = round_toward_zero(right.astype(np.float64) + bs)
        small_big = round_toward_zero(small_big.astype(np.float64) + sb)
        if i % 2 == 1 or last:
            c = (c + (left + right).astype(F32)).astype(F32)
    return (c + small_big).astype(F32)


def wide_table(dims, rng):
    print("| D | per k-step: max / rms vs NumPy float32 | wide pairs: max / rms |\n|---|---|---|")
    for D in dims:
        a = testing.host_values((4, 64, D), "float32", rng)
        b = testing.host_values((4, D, 512), "float32", rng)
        ref = a.astype(np.float64) @ b.astype(np.float64)
        numpy_err = np.abs((a @ b).astype(np.float64) - ref)
        cells = []
        for got in (product(a, b, per_k_step=True), wide_product(a, b)):
            err = np.abs(got.astype(np.float64) - ref)
            cells.append(f"{err.max() / numpy_err.max():.2f}x / {np.sqrt((err ** 2).mean() / (numpy_err ** 2).mean()):.2f}x")
        print(f"| {D} | " + " | ".join(cells) + " |", flush=True)


def forward(q, k, v, rows, per_k_step: bool, block_n: int = 64, pv_group: int = 1):
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    q = q[:, :, rows]
    scale_log2 = F32(np.log2(np.e) / np.sqrt(q.shape[-1]))
    x = (product(q, np.swapaxes(k, -1, -2), per_k_step) * scale_log2).astype(F32)
    p = np.exp2((x - x.max(-1, keepdims=True)).astype(F32)).astype(F32)
    o = np.zeros(p.shape[:-1] + v.shape[-1:], F32)
    for n0 in range(0, p.shape[-1], block_n):  # O += P V tile by tile
        o = (o + product(p[..., n0:n0 + block_n], v[..., n0:n0 + block_n, :], per_k_step,
                         pv_group)).astype(F32)
    return (o / p.sum(-1, dtype=F32, keepdims=True)).transpose(0, 2, 1, 3)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--dims", default="64,128")
    parser.add_argument("--seqlen", type=int, default=1024)
    parser.add_argument("--wide", action="store_true", help="the 16-column score products with B's parts as rows")
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    if args.wide:
        return wide_table([int(d) for d in args.dims.split(",")], rng)
    S = args.seqlen
    print("| D | S | numpy f32 error | chain | per k-step | wgmma (P V: 4 k-steps per accumulator) |\n"
          "|---|---|---|---|---|---|")
    for D in (int(d) for d in args.dims.split(",")):
        q, k, v = (testing.host_values((1, S, 4, D), "float32", rng) for _ in range(3))
        rows = np.sort(rng.choice(S, 32, replace=False))
        ref = attention_reference(q, k, v, rows=rows)[0]
        numpy_f32 = np.abs(attention_reference(q, k, v, rows=rows, precision="float32")[0] - ref).max()
        variants = (dict(per_k_step=False), dict(per_k_step=True), dict(per_k_step=True, pv_group=4))
        ratios = [np.abs(forward(q, k, v, rows, **kw) - ref).max() / numpy_f32 for kw in variants]
        print(f"| {D} | {S} | {numpy_f32:.2e} | " + " | ".join(f"{r:.2f}x" for r in ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
