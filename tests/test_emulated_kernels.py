"""The wgmma kernels run whole on the CPU (_ptx_emulator: their PTX as NVRTC compiles it
for sm_90a, no GPU): the staging launch, then the forward, the dK/dV or dQ pass, or the
fused backward, every block, with their producer warpgroups, mbarriers, named barriers,
bulk copies, wgmma and atomics; and the mma.sync kernels (sm_80+: cp.async stages,
ldmatrix, mma.sync) in every precision mode. What this checks without a GPU: that no
thread waits forever, that no shared word is touched by two threads unordered (or read
by a wgmma before the fence that makes a thread's stores visible to it, or while a
cp.async to it is in flight), that none is read before something stored it, and that
the results match the float64 reference (the emulated tensor cores sum exactly, so
within float32 roundings, not bit for bit as on the GPU).
The GPU tests (test_precision_gpu, test_backward_gpu, test_forward_gpu) run the same
kernels on the GPU."""

import _ptx_emulator
import numpy as np
import pytest
from _ptx_emulator import PtxKernel
from test_compile import _nvrtc_reason

pytestmark = pytest.mark.skipif(_nvrtc_reason() is not None, reason=str(_nvrtc_reason()))

LOG2E = 1.4426950408889634


def _run(config, blocks, args, shared_bytes=0, wavefronts=None):
    from _probes import compile_probe

    from cupyattn.compile import kernel_source, target_arch

    _, ptx, entry = compile_probe(kernel_source(config), config.name_expression, target_arch(config, "sm_90"))
    PtxKernel(ptx, entry).run(config.threads, args, shared_bytes, blocks=blocks, wavefronts=wavefronts)


def _strides(x):
    """(batch, seq, head) strides in elements of a contiguous (B, S, H, D) array."""
    return tuple(np.int64(s // x.itemsize) for s in x.strides[:3])


def _stage(staging, a, b, out=None, lse=None, delta=None):
    """api.stage_tiles, emulated: the staged tiles of (B, S, H, D) float32 arrays."""
    B, S, H, D = a.shape
    staged = np.full(staging.workspace_bytes(B, H, S) // 4, np.nan, dtype=np.float32)
    tiles = staging.tiles(S)
    rowwise = [out, lse, delta] if staging.queries else []
    _run(
        staging,
        tiles * B * H,
        [
            a,
            b,
            *rowwise,
            staged,
            *_strides(a),
            *_strides(b),
            *(_strides(out) if staging.queries else ()),
            np.int32(H),
            np.int32(S),
            np.int32(D),
            np.int32(tiles),
        ],
    )
    return staged


def _problem(B, Sq, Sk, Hq, Hkv, D, causal, seed):
    from cupyattn.reference import attention_reference, causal_offset

    rng = np.random.default_rng(seed)
    q, k, v, dout = (
        rng.standard_normal((B, s, h, D)).astype(np.float32) for s, h in ((Sq, Hq), (Sk, Hkv), (Sk, Hkv), (Sq, Hq))
    )
    out, lse = attention_reference(q, k, v, causal)
    out, lse = (np.ascontiguousarray(x, dtype=np.float32) for x in (out, lse))
    return q, k, v, dout, out, lse, causal_offset(causal, Sq, Sk) or 0


# Within this much of the float64 reference, relative to the gradient's largest entry:
# 3xTF32 keeps float32 accuracy (the GPU measured ~1e-6: test_precision_gpu), one TF32
# pass ~1e-3 (10-bit operands).
TOLERANCE = {"fp32": 1e-5, "tf32": 5e-3}


def _close(got, want, name, precision):
    scale = np.abs(want).max()
    np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE[precision] * scale, err_msg=name)


def _staged(cfg, *operands):
    """The last argument of a float32 wgmma pass, its staged tiles (none for mma.sync)."""
    staging = getattr(cfg, "staging", None)
    return () if staging is None else (_stage(staging, *operands),)


def _emulated_forward(cfg, q, k, v, offset, wavefronts=None, scale=None):
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    staged = _staged(cfg, k, v)
    out, lse = np.full_like(q, np.nan), np.full((B, Hq, Sq), np.nan, np.float32)
    tiles = -(-Sq // cfg.block_m)
    _run(
        cfg,
        tiles * B * Hq,
        [
            q,
            k,
            v,
            out,
            lse,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            *_strides(out),
            np.int32(Hq),
            np.int32(Hkv),
            np.int32(Sq),
            np.int32(Sk),
            np.int32(D),
            np.int32(D),
            np.int32(tiles),
            np.float32(LOG2E * (1 / np.sqrt(D) if scale is None else scale)),
            np.int32(offset),
            *staged,
        ],
        cfg.layout.total,
        wavefronts,
    )
    return out, lse


def _emulated_delta(dtype, dout, out, delta):
    """attn_bwd_delta's launch (as planned beside the mma.sync dK/dV pass): delta = rowsum(dO O)."""
    from cupyattn.plan import BwdDeltaConfig

    cfg = BwdDeltaConfig(dtype)
    B, Sq, Hq, D = dout.shape
    rows = B * Hq * Sq
    args = [dout, out, delta, *_strides(dout), *_strides(out), np.int32(Hq), np.int32(Sq), np.int32(D)]
    _run(cfg, -(-rows // cfg.rows_per_block), [*args, np.int64(rows)])


def _emulated_dkdv(cfg, q, k, v, dout, out, lse, offset, wavefronts=None):
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    delta = np.full((B, Hq, Sq), np.nan, np.float32)
    if getattr(cfg, "staging", None) is None:  # mma.sync: delta by its own launch first
        _emulated_delta(cfg.dtype, dout, out, delta)
    staged = _staged(cfg, q, dout, out, lse, delta)  # (the query tiles' staging writes delta)
    dk, dv = np.full_like(k, np.nan), np.full_like(v, np.nan)
    tiles = -(-Sk // cfg.block_n)
    scale = np.float32(1 / np.sqrt(D))
    _run(
        cfg,
        tiles * B * Hkv,
        [
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dk,
            dv,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            *_strides(dout),
            *_strides(dk),
            *_strides(dv),
            np.int32(Hq),
            np.int32(Hkv),
            np.int32(Sq),
            np.int32(Sk),
            np.int32(D),
            np.int32(D),
            np.int32(tiles),
            scale,
            np.float32(scale * LOG2E),
            np.int32(offset),
            *staged,
        ],
        cfg.layout.total,
        wavefronts,
    )
    return dk, dv, delta


def _emulated_dq(cfg, q, k, v, dout, lse, delta, offset, wavefronts=None):
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    staged = _staged(cfg, k, v)
    dq = np.full_like(q, np.nan)
    tiles = -(-Sq // cfg.block_m)
    scale = np.float32(1 / np.sqrt(D))
    _run(
        cfg,
        tiles * B * Hq,
        [
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dq,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            *_strides(dout),
            *_strides(dq),
            np.int32(Hq),
            np.int32(Hkv),
            np.int32(Sq),
            np.int32(Sk),
            np.int32(D),
            np.int32(D),
            np.int32(tiles),
            scale,
            np.float32(scale * LOG2E),
            np.int32(offset),
            *staged,
        ],
        cfg.layout.total,
        wavefronts,
    )
    return dq


def _emulated_backward(dkdv, dq_cfg, q, k, v, dout, out, lse, offset):
    dk, dv, delta = _emulated_dkdv(dkdv, q, k, v, dout, out, lse, offset)
    return _emulated_dq(dq_cfg, q, k, v, dout, lse, delta, offset), dk, dv, delta


def _check(precision, grads, q, k, v, dout, out, causal):
    from cupyattn.reference import attention_backward_reference

    dq, dk, dv, delta = grads
    want_dq, want_dk, want_dv = attention_backward_reference(dout, q, k, v, causal)
    exact_delta = np.einsum("bshd,bshd->bhs", dout.astype(np.float64), out.astype(np.float64))
    _close(delta, exact_delta, "delta", "fp32")
    for name, got, want in (("dV", dv, want_dv), ("dK", dk, want_dk), ("dQ", dq, want_dq)):
        _close(got, want, name, precision)


@pytest.mark.parametrize("causal", [False, True])
def test_fp32_backward_with_producer_warpgroups_runs_whole_on_the_emulator(causal):
    """The "fp32" D=256 dK/dV and dQ kernels as planned: producer warpgroups copy the
    staged tiles, and the score products take B's parts as rows (n32: words_by_rows'
    PARTS_AS_ROWS), every thread of every block run (two key blocks of dK/dV, the second
    partial; 6 key tiles of dQ; GQA, 2 query heads a key/value head; partial last tiles,
    Sq != Sk): no deadlock, no race, no shared word read before it is written, the float64
    reference's gradients."""
    from cupyattn.plan import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig

    dkdv = BwdDkdvWgmmaConfig("float32", "fp32", 256, 16, 64, 8, causal)
    dq_cfg = BwdDqWgmmaConfig("float32", "fp32", 256, 64, 16, 8, causal)
    assert dkdv.producer_warp and dq_cfg.producer_warp
    assert dkdv.score_parts_as_rows and dq_cfg.score_parts_as_rows
    problem = _problem(1, 37, 83, 2, 1, 256, causal, seed=256 + causal)
    q, k, v, dout, out, lse, offset = problem
    _check("fp32", _emulated_backward(dkdv, dq_cfg, *problem), q, k, v, dout, out, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("D,dkdv_tile,dq_tile", [(64, (32, 192, 12), (128, 32, 8)), (256, (32, 64, 8), (64, 32, 4))])
def test_tf32_backward_runs_whole_on_the_emulator(D, dkdv_tile, dq_tile, causal):
    """Kernels the GPU has run, as the planner takes them at 4096 in "tf32": D=64, and
    D=256, whose dK/dV query tiles stream through the ring without a producer warpgroup
    (block barriers and named barrier 5 free its slots): the reference's gradients."""
    from cupyattn.plan import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig

    dkdv = BwdDkdvWgmmaConfig("float32", "tf32", D, *dkdv_tile, causal)
    dq_cfg = BwdDqWgmmaConfig("float32", "tf32", D, *dq_tile, causal)
    assert dkdv.ring == (D == 256) and not dkdv.producer_warp
    problem = _problem(1, 69, 100, 2, 1, D, causal, seed=D + causal)
    q, k, v, dout, out, lse, offset = problem
    _check("tf32", _emulated_backward(dkdv, dq_cfg, *problem), q, k, v, dout, out, causal)


@pytest.mark.parametrize("causal", [False, True])
def test_fused_backward_runs_whole_on_the_emulator(causal):
    """The fused "tf32" D=64 pass (deterministic=False, as planned at 4096: (32, 192, 12)):
    dK and dV, and dQ added by every block with float32 atomics (red.global.add.v4) into
    a zeroed dq, within tolerance of the reference (the atomics' order is the emulator's)."""
    from cupyattn.plan import BwdFusedWgmmaConfig

    cfg = BwdFusedWgmmaConfig("float32", "tf32", 64, 32, 192, 12, causal)
    q, k, v, dout, out, lse, offset = _problem(1, 70, 200, 2, 1, 64, causal, seed=7 + causal)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    delta = np.full((B, Hq, Sq), np.nan, np.float32)
    staged = _stage(cfg.staging, q, dout, out, lse, delta)
    dq, dk, dv = np.zeros_like(q), np.full_like(k, np.nan), np.full_like(v, np.nan)
    tiles = -(-Sk // cfg.block_n)
    scale = np.float32(1 / np.sqrt(D))
    _run(
        cfg,
        tiles * B * Hkv,
        [
            q,
            k,
            v,
            dout,
            lse,
            delta,
            dk,
            dv,
            *_strides(q),
            *_strides(k),
            *_strides(v),
            *_strides(dout),
            *_strides(dk),
            *_strides(dv),
            np.int32(Hq),
            np.int32(Hkv),
            np.int32(Sq),
            np.int32(Sk),
            np.int32(D),
            np.int32(D),
            np.int32(tiles),
            scale,
            np.float32(scale * LOG2E),
            np.int32(offset),
            staged,
            dq,
            *_strides(dq),
        ],
        cfg.layout.total,
    )
    _check("tf32", (dq, dk, dv, delta), q, k, v, dout, out, causal)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("precision,D,tile", [("fp32", 256, (128, 16, 8)), ("tf32", 64, (128, 64, 8))])
def test_wgmma_forward_runs_whole_on_the_emulator(precision, D, tile, causal):
    """The forward as planned at 4096 ("fp32" D=256: 16-key tiles, two stages; "tf32"
    D=64), every block (GQA 2:1, Sq=70, Sk=90): the reference's output and lse."""
    from cupyattn.plan import FwdWgmmaConfig

    cfg = FwdWgmmaConfig("float32", precision, D, *tile, causal)
    q, k, v, _, want_out, want_lse, offset = _problem(1, 70, 90, 2, 1, D, causal, seed=D + causal)
    out, lse = _emulated_forward(cfg, q, k, v, offset)
    _close(out, want_out, "out", precision)
    np.testing.assert_allclose(lse, want_lse, rtol=TOLERANCE[precision], atol=0, err_msg="lse")


def _half_maps(cfg, q, k, v, dout):
    """The TMA maps of a float16 / bfloat16 wgmma backward pass: q, k, v, dout, boxes of
    its query and key tiles' rows."""
    rows = (cfg.block_m, cfg.block_n, cfg.block_n, cfg.block_m)
    return np.concatenate([_ptx_emulator.tensor_map(x, r) for x, r in zip((q, k, v, dout), rows)])


def _half_array(values, dtype):
    """float32 host values as a NumPy array of the 16-bit dtype the kernel reads."""
    from cupyattn.testing import bfloat16_dtype

    return values.astype(np.float16 if dtype == "float16" else bfloat16_dtype())


def _kernel_array(values, dtype):
    """float32 host values as the (new, contiguous) array of ``dtype`` a kernel reads."""
    values = np.ascontiguousarray(values, np.float32)
    return values.copy() if dtype == "float32" else _half_array(values, dtype)


@pytest.mark.skipif(not hasattr(_ptx_emulator, "tensor_map"), reason="the emulator has no TMA maps yet")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("D", [64, 72])
@pytest.mark.parametrize(
    "causal,Sq,Sk,block_n,scale,warps",
    [
        (False, 65, 65, 128, None, 8),
        (True, 65, 65, 128, None, 8),
        ("top_left", 65, 200, 128, None, 8),
        (False, 70, 300, 128, None, 8),  # three key tiles: S of each beside P V of the last
        (True, 256, 256, 64, None, 8),  # a warpgroup whose rows end before the block's last key tiles
        (True, 200, 100, 64, None, 8),  # rows that see no key: a warpgroup with none beside one with some
        (False, 70, 300, 128, -0.3, 8),  # a negative scale: Q's sign flipped in shared memory
        (True, 65, 65, 128, 0.0, 8),  # every probability the same
        # Three consumer warpgroups (192 query rows), taking no turns.
        (False, 70, 300, 128, None, 12),
        (True, 256, 256, 64, None, 12),
        ("top_left", 65, 200, 128, None, 12),
    ],
)
def test_wgmma_half_forward_runs_whole_on_the_emulator(dtype, D, causal, Sq, Sk, block_n, scale, warps):
    """The float16 / bfloat16 wgmma forward (producer warpgroup, TMA loads into swizzled
    tiles, SS and RS wgmma, mbarrier stages) on B=1, H=1, S=65 (a partial query and key
    tile) and, top-left causal, Sq=65 < Sk=200 (the key tile reaches past the rows' keys:
    its V rows zeroed, 2 key tiles): no deadlock, no race, the float64 reference's output
    and lse."""
    from cupyattn import testing
    from cupyattn.plan import FwdWgmmaHalfConfig
    from cupyattn.reference import attention_reference, causal_offset, logit_bound

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    precision = "bf16" if dtype == "bfloat16" else "fp16"
    cfg = FwdWgmmaHalfConfig(dtype, precision, (D + 15) // 16 * 16, 16 * warps, block_n, warps, bool(causal))
    rng = np.random.default_rng(D + Sk + bool(causal))
    hq, hk, hv = (testing.host_values((1, s, 1, D), dtype, rng) for s in (Sq, Sk, Sk))
    q, k, v = (_half_array(x, dtype) for x in (hq, hk, hv))
    out = _half_array(np.full((1, Sq, 1, D), np.nan, np.float32), dtype)
    lse = np.full((1, 1, Sq), np.nan, np.float32)
    maps = np.concatenate(
        [_ptx_emulator.tensor_map(q, cfg.block_m), *(_ptx_emulator.tensor_map(x, block_n) for x in (k, v))]
    )
    m_tiles = -(-Sq // cfg.block_m)
    offset = causal_offset(causal, Sq, Sk) or 0
    sizes = (np.int32(1), np.int32(1), np.int32(Sq), np.int32(Sk), np.int32(D), np.int32(D), np.int32(m_tiles))
    scalars = (np.float32(LOG2E * (1 / np.sqrt(D) if scale is None else scale)), np.int32(offset))
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(out))
    _run(cfg, m_tiles, [q, k, v, out, lse, *strides, *sizes, *scalars, maps], cfg.layout.total)
    got = out.astype(np.float32)
    ref, ref_lse = attention_reference(hq, hk, hv, causal, scale=scale)
    ref_p, _ = attention_reference(hq, hk, hv, causal, scale=scale, precision=dtype)
    cmp = testing.compare(got, ref, ref_p, dtype, Sk, logit_bound=logit_bound(hq, hk, scale))
    assert cmp.ok, str(cmp)
    np.testing.assert_allclose(lse, ref_lse, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not hasattr(_ptx_emulator, "tensor_map"), reason="the emulator has no TMA maps yet")
@pytest.mark.parametrize(
    "dtype,D,dkdv_tile,dq_tile,causal,Sq,Sk",
    [
        ("bfloat16", 64, (64, 128, 8), (128, 64, 8), False, 70, 130),
        ("float16", 64, (64, 128, 8), (128, 64, 8), True, 70, 130),
        ("bfloat16", 64, (64, 128, 8), (128, 64, 8), True, 200, 200),
        ("bfloat16", 72, (64, 128, 8), (128, 64, 8), "top_left", 70, 200),
        ("float16", 256, (64, 64, 8), (64, 64, 4), True, 65, 80),
        ("bfloat16", 240, (64, 64, 8), (64, 64, 4), "top_left", 100, 150),
        # 80-query tiles: lse / delta rows padded to whole tiles of 80 (200 -> 240 rows a head)
        ("bfloat16", 64, (80, 64, 4), (128, 64, 8), True, 200, 200),
        # fused (dq_tile "fused" or "ordered"): dQ chunks taking turns (64), one each (128, and 80
        # padded to 128)
        ("bfloat16", 64, (64, 128, 8), "fused", True, 200, 200),
        ("float16", 128, (64, 128, 8), "fused", "top_left", 70, 200),
        ("bfloat16", 72, (64, 128, 8), "fused", False, 130, 70),
        ("bfloat16", 64, (64, 128, 8), "ordered", False, 200, 300),
        ("float16", 128, (64, 128, 8), "ordered", True, 130, 200),
    ],
)
def test_wgmma_half_backward_runs_whole_on_the_emulator(dtype, D, dkdv_tile, dq_tile, causal, Sq, Sk):
    """The float16 / bfloat16 wgmma backward passes (delta and the padded lse / delta rows;
    a producer warpgroup bringing TMA tiles and those rows by bulk copies; SS and RS wgmma;
    d_split 2 from D=208, its pair splitting the scores through shared tiles), every block,
    on GQA 2:1 with partial query and key tiles, Sq != Sk, causal both ways (top-left: keys
    no row sees hold NaN, those in a dQ block's last tile zeroed; fused, zeroed in K): no
    deadlock, no race, no shared word read before it is written, FlashAttention's tolerance
    against the float64 reference. dq_tile "fused" / "ordered": the fused pass (dS^T and dQ
    through shared memory, dQ added to a float32 accumulator by bulk reductions, "ordered"
    in the key blocks' turn) and attn_bwd_dq_convert."""
    from cupyattn import testing
    from cupyattn.plan import (
        BwdDeltaWgmmaHalfConfig,
        BwdDkdvWgmmaHalfConfig,
        BwdDqConvertConfig,
        BwdDqWgmmaHalfConfig,
        BwdFusedWgmmaHalfConfig,
    )
    from cupyattn.reference import attention_backward_reference, attention_reference, causal_offset

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    precision = "bf16" if dtype == "bfloat16" else "fp16"
    d_pad = (D + 15) // 16 * 16
    fused = dq_tile in ("fused", "ordered")
    dkdv = (
        BwdFusedWgmmaHalfConfig(dtype, precision, d_pad, *dkdv_tile, bool(causal), dq_tile == "ordered")
        if fused
        else BwdDkdvWgmmaHalfConfig(dtype, precision, d_pad, *dkdv_tile, bool(causal))
    )
    dq_cfg = None if fused else BwdDqWgmmaHalfConfig(dtype, precision, d_pad, *dq_tile, bool(causal))
    assert dkdv.valid and (fused or dq_cfg.valid)
    B, Hq, Hkv = 1, 2, 1
    rng = np.random.default_rng(D + Sk + bool(causal))
    hq, hdo = (testing.host_values((B, Sq, Hq, D), dtype, rng) for _ in range(2))
    hk, hv = (testing.host_values((B, Sk, Hkv, D), dtype, rng) for _ in range(2))
    q, k, v, dout = (_half_array(x, dtype) for x in (hq, hk, hv, hdo))
    if causal == "top_left":  # keys no row sees hold NaN: no gradient may see it
        k[:, Sq:], v[:, Sq:] = np.nan, np.nan
    out, lse = attention_reference(hq, hk, hv, causal)
    lse = np.ascontiguousarray(lse, dtype=np.float32)
    offset = causal_offset(causal, Sq, Sk) or 0
    scale = np.float32(1 / np.sqrt(D))
    sizes = (np.int32(Hq), np.int32(Hkv), np.int32(Sq), np.int32(Sk), np.int32(D), np.int32(D))
    tail = (scale, np.float32(scale * LOG2E), np.int32(offset))
    strides = (*_strides(q), *_strides(k), *_strides(v), *_strides(dout))

    # delta, and lse * log2(e) and delta in rows padded to the dK/dV pass's tiles
    out_h = _half_array(np.ascontiguousarray(out), dtype)
    prep = BwdDeltaWgmmaHalfConfig(dtype, block_m=dkdv.block_m)
    rows = prep.padded_rows(Sq)
    delta = np.full((B, Hq, Sq), np.nan, np.float32)
    padded = np.full((2, B, Hq, rows), np.nan, np.float32)
    total = B * Hq * rows
    args = [dout, out_h, lse, delta, padded, *_strides(dout), *_strides(out_h), np.int32(Hq), np.int32(Sq)]
    _run(prep, -(-total // prep.rows_per_block), [*args, np.int32(D), np.int32(rows), np.int64(total)])
    exact = np.einsum("bshd,bshd->bhs", dout.astype(np.float64), out_h.astype(np.float64))
    np.testing.assert_allclose(delta, exact, rtol=1e-5, atol=1e-5)
    assert (padded[0, ..., :Sq] == (lse * np.float32(LOG2E))).all() and (padded[1, ..., :Sq] == delta).all()
    assert (padded[:, ..., Sq:] == 0).all()
    inputs = (q, k, v, dout, lse, delta)
    nan = np.full((B, Sk, Hkv, D), np.nan, np.float32)
    dk, dv = _half_array(nan, dtype), _half_array(nan, dtype)
    n_tiles = -(-Sk // dkdv.block_n)
    args = [q, k, v, dout, padded[0], padded[1], dk, dv, *strides, *_strides(dk), *_strides(dv), *sizes]
    args += [np.int32(n_tiles), *tail, _half_maps(dkdv, q, k, v, dout)]
    dq = _half_array(np.full((B, Sq, Hq, D), np.nan, np.float32), dtype)
    if fused:
        accum = np.zeros(dkdv.accumulator_shape(B, Hq, Sq), np.float32)
        m_tiles = accum.shape[2]
        turns = np.zeros(accum.shape[:3], np.int32)
        _run(dkdv, n_tiles * B * Hkv, [*args, accum, turns, np.int32(m_tiles)], dkdv.layout.total)
        if dkdv.ordered:  # every key block took its turn at each query tile with a row that sees it
            firsts = [max(0, n * dkdv.block_n - offset) // 64 if causal else 0 for n in range(n_tiles)]
            assert (turns == [sum(f <= m for f in firsts) for m in range(m_tiles)]).all(), turns
        convert = BwdDqConvertConfig(dtype)
        args = [accum, dq, *_strides(dq), np.int32(Hq), np.int32(Sq), np.int32(D), np.int32(dkdv.d_chunks), scale]
        _run(convert, B * Hq * m_tiles, args, 0)
    else:
        _run(dkdv, n_tiles * B * Hkv, args, dkdv.layout.total)
        m_tiles = -(-Sq // dq_cfg.block_m)
        args = [
            *inputs,
            dq,
            *strides,
            *_strides(dq),
            *sizes,
            np.int32(m_tiles),
            *tail,
            _half_maps(dq_cfg, q, k, v, dout),
        ]
        _run(dq_cfg, m_tiles * B * Hq, args, dq_cfg.layout.total)

    ref = attention_backward_reference(hdo, hq, hk, hv, causal)
    ref_p = attention_backward_reference(hdo, hq, hk, hv, causal, precision=dtype)
    for name, got, want, want_p in zip(("dq", "dk", "dv"), (dq, dk, dv), ref, ref_p):
        cmp = testing.compare(got.astype(np.float32), want, want_p, dtype, max(Sq * Hq, Sk, D), factor=3.0)
        assert cmp.ok, f"{name}: {cmp}"


def _mma_inputs(dtype, B, Sq, Sk, Hq, Hkv, D, causal, seed):
    """Standard-normal q, k, v, dO rounded to ``dtype`` (float32 host values) and the arrays
    the kernels read (top-left causal: NaN in the keys and values no row sees)."""
    from cupyattn import testing

    rng = np.random.default_rng(seed)
    hq, hdo = (testing.host_values((B, Sq, Hq, D), dtype, rng) for _ in range(2))
    hk, hv = (testing.host_values((B, Sk, Hkv, D), dtype, rng) for _ in range(2))
    arrays = [_kernel_array(x, dtype) for x in (hq, hk, hv, hdo)]
    if causal == "top_left":
        for x in arrays[1:3]:
            x[:, Sq:] = np.nan
    return (hq, hk, hv, hdo), arrays


# mma.sync tiles (block_m, block_n, warps) from the planner's lists (plan.FWD_MMA_TILES, ...):
# two 16-row m-tiles a warp (128, 64, 4), one (64, 32, 4), the smallest (16, 16, 1); dK/dV
# with two warps sharing 16 keys ((32, 32, 4): d_split 2, as planned at head dim 256).
MMA_CASES = [
    # dtype, precision, D, forward tile, dK/dV tile, dQ tile, causal, Sq, Sk
    ("float16", "fp16", 64, (128, 64, 4), (64, 64, 4), (64, 64, 4), False, 70, 130),
    ("bfloat16", "bf16", 64, (128, 64, 4), (64, 64, 4), (64, 64, 4), True, 70, 130),
    ("float16", "fp16", 72, (64, 32, 4), (32, 64, 4), (64, 32, 4), "top_left", 37, 90),
    ("bfloat16", "bf16", 40, (32, 32, 2), (16, 16, 1), (32, 32, 2), True, 90, 37),  # rows that see no key
    ("float16", "fp16", 256, (128, 64, 8), (32, 32, 4), (128, 32, 8), True, 40, 70),
    ("bfloat16", "bf16", 136, (64, 64, 4), (32, 64, 4), (64, 32, 4), False, 33, 50),
    # float32 inputs: 3xTF32, one TF32 pass, operands staged as float16 / bfloat16
    ("float32", "fp32", 64, (64, 32, 4), (32, 64, 4), (64, 32, 4), True, 37, 50),
    ("float32", "tf32", 64, (128, 64, 4), (64, 64, 4), (64, 64, 4), "top_left", 37, 90),
    ("float32", "fp16", 40, (64, 32, 4), (64, 128, 8), (32, 32, 2), False, 37, 50),  # warps past the keys
    ("float32", "bf16", 64, (32, 32, 2), (16, 16, 1), (16, 16, 1), True, 50, 37),
]


@pytest.mark.parametrize("dtype,precision,D,fwd_tile,dkdv_tile,dq_tile,causal,Sq,Sk", MMA_CASES)
def test_mma_forward_runs_whole_on_the_emulator(dtype, precision, D, fwd_tile, dkdv_tile, dq_tile, causal, Sq, Sk):
    """attn_fwd_mma (ldmatrix, mma.sync, the two cp.async stages of K and V, float32 inputs
    staged as float16 / bfloat16 through registers) on GQA 2:1, Sq != Sk, partial tiles,
    every block: no race, no shared word read before it is written, and the GPU tests'
    rule against the float64 reference (test_forward_gpu: FlashAttention's, twice the
    same-precision reference's error plus a floor)."""
    from cupyattn import testing
    from cupyattn.plan import FwdMmaConfig, mma_head_dim_pad
    from cupyattn.reference import (
        attention_reference,
        causal_offset,
        logit_bound,
        operand_precision,
        unit_roundoff,
    )

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    cfg = FwdMmaConfig(dtype, precision, mma_head_dim_pad(D), *fwd_tile, bool(causal))
    assert cfg.valid
    (hq, hk, hv, _), (q, k, v, _) = _mma_inputs(dtype, 1, Sq, Sk, 2, 1, D, causal, seed=D + Sq + Sk)
    out, lse = _emulated_forward(cfg, q, k, v, causal_offset(causal, Sq, Sk) or 0)
    ref, ref_lse = attention_reference(hq, hk, hv, causal)
    operands, out_precision = operand_precision(dtype, precision)
    ref_p, _ = attention_reference(hq, hk, hv, causal, precision=operands, out_precision=out_precision)
    bound = logit_bound(hq, hk)
    cmp = testing.compare(out.astype(np.float32), ref, ref_p, operands, Sk, logit_bound=bound)
    assert cmp.ok, str(cmp)
    lse_tol = 2e-5 + (4 * unit_roundoff(operands) * bound if operands != dtype else 0.0)
    np.testing.assert_allclose(lse, ref_lse, rtol=lse_tol, atol=lse_tol)


@pytest.mark.parametrize("scale", [-0.7, 0.0])
@pytest.mark.parametrize("dtype,precision,tile", [("float16", "fp16", (128, 64, 4)), ("float32", "tf32", (64, 32, 4))])
def test_mma_forward_at_a_negative_and_a_zero_scale(dtype, precision, tile, scale):
    """attn_fwd_mma takes row maxima of raw scores against |scale|: a negative scale flips
    Q's sign in shared memory first; a zero one makes every visible probability equal."""
    from cupyattn import testing
    from cupyattn.plan import FwdMmaConfig, mma_head_dim_pad
    from cupyattn.reference import attention_reference, logit_bound, operand_precision, unit_roundoff

    D, Sq, Sk = 64, 70, 130
    cfg = FwdMmaConfig(dtype, precision, mma_head_dim_pad(D), *tile, True)
    (hq, hk, hv, _), (q, k, v, _) = _mma_inputs(dtype, 1, Sq, Sk, 2, 1, D, True, seed=5)
    out, lse = _emulated_forward(cfg, q, k, v, Sk - Sq, scale=scale)
    ref, ref_lse = attention_reference(hq, hk, hv, True, scale=scale)
    operands, out_precision = operand_precision(dtype, precision)
    ref_p, _ = attention_reference(hq, hk, hv, True, scale=scale, precision=operands, out_precision=out_precision)
    bound = logit_bound(hq, hk, scale)
    cmp = testing.compare(out.astype(np.float32), ref, ref_p, operands, Sk, logit_bound=bound)
    assert cmp.ok, str(cmp)
    lse_tol = 2e-5 + (4 * unit_roundoff(operands) * bound if operands != dtype else 0.0)
    np.testing.assert_allclose(lse, ref_lse, rtol=lse_tol, atol=lse_tol)


def _check_mma_gradients(dtype, precision, grads, inputs, causal):
    """test_backward_gpu's rule: three times the same-precision reference's error plus a
    floor, with the error delta's cancellation may leave in dQ and dK."""
    from cupyattn import testing
    from cupyattn.reference import (
        attention_backward_reference,
        cancellation_unit,
        delta_cancellation_error,
        logit_bound,
        operand_precision,
    )

    hq, hk, hv, hdo = inputs
    (_, Sq, Hq, D), (_, Sk, Hkv, _) = hq.shape, hk.shape
    ref = attention_backward_reference(hdo, hq, hk, hv, causal)
    operands, out_precision = operand_precision(dtype, precision)
    ref_p = attention_backward_reference(hdo, hq, hk, hv, causal, precision=operands, out_precision=out_precision)
    unit = cancellation_unit(dtype, precision)
    extra = (*delta_cancellation_error(hdo, hq, hk, hv, causal, unit=unit), 0.0)
    reduction, bound = max(Sq * (Hq // Hkv), Sk, D), logit_bound(hq, hk)
    for name, got, want, want_p, e in zip(("dq", "dk", "dv"), grads, ref, ref_p, extra):
        cmp = testing.compare(got.astype(np.float32), want, want_p, operands, reduction, 3.0, bound, e)
        assert cmp.ok, f"{name}: {cmp}"


@pytest.mark.parametrize("dtype,precision,D,fwd_tile,dkdv_tile,dq_tile,causal,Sq,Sk", MMA_CASES)
def test_mma_backward_runs_whole_on_the_emulator(dtype, precision, D, fwd_tile, dkdv_tile, dq_tile, causal, Sq, Sk):
    """attn_bwd_delta, then attn_bwd_dkdv_mma (K and V kept, Q, dO, lse and delta tiles through
    two cp.async stages over the GQA group's query heads; S^T and dP^T by ldmatrix fragments,
    dV and dK from accumulators times k-major tiles) and attn_bwd_dq_mma, every block, on GQA
    2:1, Sq != Sk, partial tiles: no race, no shared word read before it is written, no NaN
    from keys no row sees (top-left), the GPU tests' rule against the float64 reference."""
    from cupyattn.plan import BwdDkdvMmaConfig, BwdDqMmaConfig, mma_head_dim_pad
    from cupyattn.reference import attention_reference, causal_offset

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    dkdv = BwdDkdvMmaConfig(dtype, precision, mma_head_dim_pad(D), *dkdv_tile, bool(causal))
    dq_cfg = BwdDqMmaConfig(dtype, precision, mma_head_dim_pad(D), *dq_tile, bool(causal))
    assert dkdv.valid and dq_cfg.valid
    inputs, (q, k, v, dout) = _mma_inputs(dtype, 1, Sq, Sk, 2, 1, D, causal, seed=D + Sq + Sk + 1)
    hq, hk, hv, _ = inputs
    out, lse = attention_reference(hq, hk, hv, causal)
    out, lse = _kernel_array(out, dtype), np.ascontiguousarray(lse, np.float32)
    offset = causal_offset(causal, Sq, Sk) or 0
    dk, dv, delta = _emulated_dkdv(dkdv, q, k, v, dout, out, lse, offset)
    dq = _emulated_dq(dq_cfg, q, k, v, dout, lse, delta, offset)
    exact = np.einsum("bshd,bshd->bhs", dout.astype(np.float64), out.astype(np.float64))
    np.testing.assert_allclose(delta, exact, rtol=1e-5, atol=1e-5)
    _check_mma_gradients(dtype, precision, (dq, dk, dv), inputs, causal)


@pytest.mark.skipif(not hasattr(_ptx_emulator, "tensor_map"), reason="the emulator has no TMA maps yet")
@pytest.mark.parametrize(
    "dtype,D,causal", [("float16", 136, True), ("bfloat16", 168, "top_left"), ("bfloat16", 192, False)]
)
def test_mma_dkdv_beside_the_wgmma_half_dq_as_planned_on_an_h100(dtype, D, causal):
    """Head dims 136-192 of float16 / bfloat16 on an H100 (planned at B=4, H=16, S=4096):
    attn_bwd_delta, the mma.sync dK/dV pass (the wgmma dK/dV tiles would keep more
    accumulators than a consumer's registers; d_split 2 at 192) and the wgmma dQ pass (TMA
    tiles), on GQA 2:1, Sq != Sk: no race, no shared word read before it is written, no
    NaN from keys no row sees, the GPU tests' rule against the float64 reference."""
    from cupyattn.device import named_device
    from cupyattn.plan import AttentionProblem, BwdDeltaConfig, BwdDkdvMmaConfig, BwdDqWgmmaHalfConfig, plan_backward
    from cupyattn.reference import attention_reference, causal_offset

    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    bplan = plan_backward(AttentionProblem(dtype, D, D, bool(causal), 4, 16, 16, 4096, 4096), named_device("h100"))
    dkdv, dq_cfg = bplan.dkdv.config, bplan.dq.config
    assert isinstance(dkdv, BwdDkdvMmaConfig) and isinstance(dq_cfg, BwdDqWgmmaHalfConfig)
    assert type(bplan.delta) is BwdDeltaConfig and bplan.dq_convert is None
    Sq, Sk, Hq = 70, 90, 2
    inputs, (q, k, v, dout) = _mma_inputs(dtype, 1, Sq, Sk, Hq, 1, D, causal, seed=D)
    hq, hk, hv, _ = inputs
    out, lse = attention_reference(hq, hk, hv, causal)
    out, lse = _kernel_array(out, dtype), np.ascontiguousarray(lse, np.float32)
    offset = causal_offset(causal, Sq, Sk) or 0
    dk, dv, delta = _emulated_dkdv(dkdv, q, k, v, dout, out, lse, offset)
    dq = _kernel_array(np.full(q.shape, np.nan), dtype)
    m_tiles = -(-Sq // dq_cfg.block_m)
    scale = np.float32(1 / np.sqrt(D))
    args = [q, k, v, dout, lse, delta, dq, *(s for x in (q, k, v, dout, dq) for s in _strides(x))]
    args += [np.int32(Hq), np.int32(1), np.int32(Sq), np.int32(Sk), np.int32(D), np.int32(D), np.int32(m_tiles)]
    args += [scale, np.float32(scale * LOG2E), np.int32(offset), _half_maps(dq_cfg, q, k, v, dout)]
    _run(dq_cfg, m_tiles * Hq, args, dq_cfg.layout.total)
    _check_mma_gradients(dtype, None, (dq, dk, dv), inputs, causal)


@pytest.mark.parametrize("dtype,precision", [("float16", "fp16"), ("float32", "tf32")])
def test_mma_fragment_loads_take_the_fewest_shared_wavefronts(dtype, precision):
    """The rows' 16 bytes of padding (mma.cuh, padded_stride) put the 8 rows of each
    ldmatrix phase in 8 bank groups (.x4: 4 wavefronts) and, float32, the k-major loads of
    rows 2t and 2t + 1 in 32 banks (1): in the forward, dK/dV and dQ passes."""
    from cupyattn.plan import BwdDkdvMmaConfig, BwdDqMmaConfig, FwdMmaConfig
    from cupyattn.reference import attention_reference

    D, Sq, Sk = 64, 64, 64
    inputs, (q, k, v, dout) = _mma_inputs(dtype, 1, Sq, Sk, 1, 1, D, False, seed=3)
    out, lse = attention_reference(*inputs[:3])
    out, lse = _kernel_array(out, dtype), np.ascontiguousarray(lse, np.float32)
    waves = [{}, {}, {}]
    _emulated_forward(FwdMmaConfig(dtype, precision, D, 64, 32, 4, False), q, k, v, 0, waves[0])
    dkdv = BwdDkdvMmaConfig(dtype, precision, D, 32, 64, 4, False)
    _, _, delta = _emulated_dkdv(dkdv, q, k, v, dout, out, lse, 0, waves[1])
    _emulated_dq(BwdDqMmaConfig(dtype, precision, D, 64, 32, 4, False), q, k, v, dout, lse, delta, 0, waves[2])
    for wavefronts in waves:
        fragments = {s: set(runs) for s, runs in wavefronts.items() if s.startswith(("ldmatrix", "ld.shared.b32"))}
        assert any(s.startswith("ldmatrix") for s in fragments)
        assert any(s.startswith("ld.shared.b32") for s in fragments) == (dtype == "float32")
        assert all(
            runs == ({4} if s.startswith("ldmatrix.sync.aligned.m8n8.x4") else {1}) for s, runs in fragments.items()
        )
