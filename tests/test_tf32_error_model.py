"""A float64 model of how the 3xTF32 ("fp32") tensor-core kernels sum their products,
run on the CPU: adding each k-step's products in a fresh accumulator keeps float32's
accuracy where one chain of truncated float32 adds loses it.

The model: operands split into TF32 parts (big = x rounded to TF32, small = x - big
truncated to TF32 as the tensor cores read it); each m16n8k8 k-step's three products
(small·big, big·small, big·big) exact; the float32 additions around them either a chain
through one accumulator with round-toward-zero adds (as mma.sync chains its C operand)
or per k-step (a fresh accumulator, added to the running sum with a rounded float32
add, as kernels/mma.cuh does)."""

import numpy as np

from cupyattn import testing
from cupyattn.reference import attention_reference, round_to

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
    """a (..., m, K) times b (..., K, n) in k-steps of 8: per k-step (its index, whether it
    is the last, small·big, big·small, big·big), each exact in float64."""
    (ab, as_), (bb, bs) = split(a), split(b)
    steps = range(0, a.shape[-1], 8)
    for i, k0 in enumerate(steps):
        k = slice(k0, k0 + 8)
        yield (
            i,
            i + 1 == len(steps),
            as_[..., k] @ bb[..., k, :],
            ab[..., k] @ bs[..., k, :],
            ab[..., k] @ bb[..., k, :],
        )


def product(a, b, per_k_step: bool):
    """a (..., m, K) times b (..., K, n), 3xTF32, float32 sums: per k-step or one chain."""
    c = np.zeros(a.shape[:-1] + b.shape[-1:], F32)
    for _, _, *terms in k_step_products(a, b):
        if per_k_step:
            step = np.zeros_like(c)
            for t in terms:
                step = round_toward_zero(step.astype(np.float64) + t)
            c = (c + step).astype(F32)
        else:
            for t in terms:
                c = round_toward_zero(c.astype(np.float64) + t)
    return c


def wide_product(a, b):
    """a (..., m, K) times b (..., K, n) as words_by_rows sums it with B's TF32 parts stored
    as rows (kernels/wgmma_tiles.cuh): two k-steps a group, their big·big products chained
    in one fresh accumulator and their big·small ones in another, the two added (rounded)
    to the running sum; the small·big products chained over all k-steps and added last."""
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


def forward(q, k, v, rows, per_k_step: bool, block_n: int = 64):
    """The attention forward of ``rows`` as the tensor-core kernels compute it, softmax in
    float32, O += P V tile by tile."""
    q, k, v = (x.transpose(0, 2, 1, 3) for x in (q, k, v))
    q = q[:, :, rows]
    scale_log2 = F32(np.log2(np.e) / np.sqrt(q.shape[-1]))
    x = (product(q, np.swapaxes(k, -1, -2), per_k_step) * scale_log2).astype(F32)
    p = np.exp2((x - x.max(-1, keepdims=True)).astype(F32)).astype(F32)
    o = np.zeros(p.shape[:-1] + v.shape[-1:], F32)
    for n0 in range(0, p.shape[-1], block_n):
        o = (o + product(p[..., n0 : n0 + block_n], v[..., n0 : n0 + block_n, :], per_k_step)).astype(F32)
    return (o / p.sum(-1, dtype=F32, keepdims=True)).transpose(0, 2, 1, 3)


def test_split_parts_hold_the_operand_to_21_bits():
    x = testing.host_values((4096,), "float32", np.random.default_rng(1))
    big, small = split(x)
    assert np.all((big.astype(np.float32).view(np.uint32) & 0x1FFF) == 0)  # big is TF32
    assert np.max(np.abs(big + small - x) / np.abs(x)) < 2.0**-21


def test_truncated_chain_loses_float32_accuracy_and_per_k_step_adds_keep_it():
    rng = np.random.default_rng(0)
    S, D = 512, 64
    q, k, v = (testing.host_values((1, S, 2, D), "float32", rng) for _ in range(3))
    rows = np.sort(rng.choice(S, 16, replace=False))
    ref = attention_reference(q, k, v, rows=rows)[0]
    numpy_f32 = np.abs(attention_reference(q, k, v, rows=rows, precision="float32")[0] - ref).max()
    chain, per_k_step = (np.abs(forward(q, k, v, rows, per) - ref).max() / numpy_f32 for per in (False, True))
    # The chain is held against the per-k-step adds, not against NumPy: NumPy's float32
    # error depends on the BLAS kernel the CPU gets.
    assert per_k_step <= 2.0, per_k_step  # the "fp32" mode's promise: within 2x float32's error
    assert chain > 3 * per_k_step, (chain, per_k_step)


def test_wide_score_pairs_are_as_accurate_as_one_k_step_a_fresh_accumulator():
    """words_by_rows with B's parts as rows against one k-step a fresh accumulator, on the
    head dims that take it: the same error within a few percent, and far from a chain of
    truncated adds."""
    rng = np.random.default_rng(2)
    for D in (136, 256):
        a = testing.host_values((2, 64, D), "float32", rng)
        b = testing.host_values((2, D, 256), "float32", rng)
        ref = a.astype(np.float64) @ b.astype(np.float64)

        def rms(x):
            return np.sqrt(((x.astype(np.float64) - ref) ** 2).mean())

        per_k_step, wide, chain = (
            rms(product(a, b, per_k_step=True)),
            rms(wide_product(a, b)),
            rms(product(a, b, per_k_step=False)),
        )
        assert wide <= 1.1 * per_k_step, (D, wide, per_k_step)
        assert chain > 5 * wide, (D, chain, wide)
