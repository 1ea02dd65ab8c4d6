"""Reliability on the GPU: garbage no query may see, determinism, streams,
threads, and shapes past the 16- and 32-bit limits.

Bitwise checks compare raw bits, so -0.0 vs 0.0 or a different NaN payload would fail.
"""

import threading

import numpy as np
import pytest

import cupyattn
from cupyattn import compile as cc
from cupyattn import testing
from cupyattn.reference import attention_backward_reference, attention_reference, logit_bound, round_to

pytestmark = pytest.mark.gpu

# (dtype, head dim): the tensor-core path (half types, head dim a multiple of 8) and
# the SIMT path (float32; float16 at an odd head dim).
PATHS = [("float16", 64), ("bfloat16", 64), ("float32", 64), ("float16", 36)]


def _bits(x):
    import cupy

    return cupy.ascontiguousarray(x).view(cupy.dtype(f"u{x.itemsize}")).get()


def _inputs(shapes, dtype, seed):
    rng = np.random.default_rng(seed)
    host = [testing.host_values(s, dtype, rng) for s in shapes]
    return host, [testing.to_device(x, dtype) for x in host]


def _fwd_bwd(q, k, v, dout, causal):
    out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True)
    grads = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=causal)
    return [_bits(x) for x in (out, lse, *grads)]


def _assert_bitwise_equal(got, want, names=("out", "lse", "dq", "dk", "dv")):
    for name, a, b in zip(names, got, want):
        assert np.array_equal(a, b), f"{name} differs bitwise ({np.count_nonzero(a != b)} elements)"


@pytest.mark.parametrize("dtype,D", PATHS)
def test_nan_and_inf_in_keys_no_query_may_see_change_nothing(dtype, D):
    """top_left causal with Sk > Sq: keys Sq.. are seen by no query. NaN keys and
    inf/NaN values there leave out, lse, dq, dk, dv bitwise as with clean ones."""
    import cupy

    B, Sq, Sk, H = 2, 70, 200, 3
    _, (q, k, v, dout) = _inputs([(B, Sq, H, D), (B, Sk, H, D), (B, Sk, H, D), (B, Sq, H, D)], dtype, 7)
    clean = _fwd_bwd(q, k, v, dout, "top_left")
    k2, v2 = k.copy(), v.copy()
    testing.poison(k2[:, Sq:])
    testing.poison(v2[:, Sq::2])
    inf_bits = {"float16": 0x7C00, "bfloat16": 0x7F80, "float32": 0x7F800000}[dtype]
    v2[:, Sq + 1 :: 2].view(cupy.dtype(f"u{v2.itemsize}")).fill(inf_bits)
    _assert_bitwise_equal(_fwd_bwd(q, k2, v2, dout, "top_left"), clean)


@pytest.mark.parametrize("dtype,D", PATHS)
def test_nan_past_the_logical_end_of_a_view_changes_nothing(dtype, D):
    """K and V viewed out of longer buffers whose tail is NaN give the bits of clean copies."""
    B, Sq, Sk, H = 2, 33, 77, 2
    _, (q, dout) = _inputs([(B, Sq, H, D), (B, Sq, H, D)], dtype, 8)
    _, (k_long, v_long) = _inputs([(B, 128, H, D), (B, 128, H, D)], dtype, 9)
    testing.poison(k_long[:, Sk:])
    testing.poison(v_long[:, Sk:])
    k, v = k_long[:, :Sk], v_long[:, :Sk]
    for causal in (False, True):
        _assert_bitwise_equal(_fwd_bwd(q, k, v, dout, causal), _fwd_bwd(q, k.copy(), v.copy(), dout, causal))


@pytest.mark.parametrize("dtype,D", [("float16", 64), ("float32", 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_forward_and_backward_are_bitwise_deterministic_over_100_repeats(dtype, D, causal):
    B, S, H = 32, 128, 4
    _, (q, k, v, dout) = _inputs([(B, S, H, D)] * 4, dtype, 10)
    first = _fwd_bwd(q, k, v, dout, causal)
    for _ in range(99):
        _assert_bitwise_equal(_fwd_bwd(q, k, v, dout, causal), first)


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    const long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def _spin(seconds: float) -> None:
    """Queue a one-thread kernel that spins for about ``seconds`` on the current stream."""
    import cupy

    clock_hz = cupy.cuda.runtime.getDeviceProperties(0)["clockRate"] * 1000
    cupy.RawKernel(_SPIN, "spin")((1,), (1,), (np.int64(clock_hz * seconds),))


def test_runs_on_a_non_default_stream_while_another_is_busy_without_device_sync():
    """A kernel spinning on stream A for ~0.5 s; forward and backward on stream B return
    (and finish) while A still runs: no device-wide synchronization on the call path."""
    import cupy

    dtype, (B, S, H, D) = "float16", (2, 256, 4, 64)
    host, (q, k, v, dout) = _inputs([(B, S, H, D)] * 4, dtype, 11)
    _fwd_bwd(q, k, v, dout, True)  # compile and load outside the measured calls
    busy, work = cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True)
    with busy:
        _spin(0.5)
        busy_done = busy.record()
    with work:
        out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
        dq, dk, dv = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True)
        work_done = work.record()
    work_done.synchronize()
    assert not busy_done.done, "the calls waited for another stream's work"
    busy_done.synchronize()
    ref, _ = attention_reference(*host[:3], causal=True)
    ref_p, _ = attention_reference(*host[:3], causal=True, precision=dtype)
    cmp = testing.compare(testing.to_host(out), ref, ref_p, dtype, S, logit_bound=logit_bound(host[0], host[1]))
    assert cmp.ok, str(cmp)
    refs = attention_backward_reference(host[3], *host[:3], causal=True)
    refs_p = attention_backward_reference(host[3], *host[:3], causal=True, precision=dtype)
    for name, g, r, rp in zip(("dq", "dk", "dv"), (dq, dk, dv), refs, refs_p):
        cmp = testing.compare(
            testing.to_host(g), r, rp, dtype, S, factor=3.0, logit_bound=logit_bound(host[0], host[1])
        )
        assert cmp.ok, f"{name}: {cmp}"


def test_two_threads_first_calling_one_config_compile_once_and_both_are_right(monkeypatch):
    import cupy

    built = []
    real_module = cupy.RawModule

    def counting_module(*args, **kwargs):
        built.append(tuple(kwargs.get("name_expressions", ())))
        return real_module(*args, **kwargs)

    monkeypatch.setattr(cc, "_cache", {})  # every config's first call happens in the threads
    monkeypatch.setattr(cupy, "RawModule", counting_module)
    dtype, (B, S, H, D) = "bfloat16", (1, 100, 2, 64)
    host, (q, k, v) = _inputs([(B, S, H, D)] * 3, dtype, 12)
    results, errors = [None, None], []

    def call(i):
        try:
            with cupy.cuda.Stream(non_blocking=True) as s:
                results[i] = testing.to_host(cupyattn.attention(q, k, v, causal=True))
                s.synchronize()
        except Exception as exc:  # reported below, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    forward = [names for names in built if "attn_fwd" in names[0]]
    assert len(forward) == 1, forward
    ref, _ = attention_reference(*host, causal=True)
    ref_p, _ = attention_reference(*host, causal=True, precision=dtype)
    for got in results:
        cmp = testing.compare(got, ref, ref_p, dtype, S, logit_bound=logit_bound(host[0], host[1]))
        assert cmp.ok, str(cmp)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_batch_times_heads_above_65535(dtype):
    """B * Hq = 66000 query heads (a 2-D grid's y limit is 65535; ours is 1-D)."""
    B, S, Hq, Hkv, D = 3, 16, 22000, 11000, 8
    host, (q, k, v, dout) = _inputs([(B, S, Hq, D), (B, S, Hkv, D), (B, S, Hkv, D), (B, S, Hq, D)], dtype, 13)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    grads = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    bound = logit_bound(host[0], host[1])
    ref, _ = attention_reference(*host[:3], causal=True)
    ref_p, _ = attention_reference(*host[:3], causal=True, precision=dtype)
    cmp = testing.compare(testing.to_host(out), ref, ref_p, dtype, S, logit_bound=bound)
    assert cmp.ok, str(cmp)
    refs = attention_backward_reference(host[3], *host[:3], causal=True)
    refs_p = attention_backward_reference(host[3], *host[:3], causal=True, precision=dtype)
    for name, g, r, rp in zip(("dq", "dk", "dv"), grads, refs, refs_p):
        cmp = testing.compare(testing.to_host(g), r, rp, dtype, 2 * S, factor=3.0, logit_bound=bound)
        assert cmp.ok, f"{name}: {cmp}"


def _dq_rows_reference(dout, q, k, v, rows, precision=None):
    """dq at the given query rows of a causal, one-head problem (B = H = 1), computed
    row by row: O(rows x S) instead of O(S^2). float64, or the same-precision variant
    of attention_backward_reference (float32, P and dS rounded to ``precision``)."""
    work = np.float64 if precision is None else np.float32
    q, k, v, dout = (np.asarray(x[0, :, 0], work) for x in (q, k, v, dout))
    scale = work(1.0 / np.sqrt(q.shape[-1]))
    result = []
    for i in rows:
        keys = slice(0, i + 1)
        s = (k[keys] @ q[i]).astype(work) * scale
        p = np.exp(s - s.max())
        p = (p / p.sum()).astype(work)
        o = ((p if precision is None else round_to(p, precision)) @ v[keys]).astype(work)
        if precision is not None:
            o = round_to(o, precision)
        dp = (v[keys] @ dout[i]).astype(work)
        ds = p * (dp - dout[i] @ o)
        if precision is not None:  # as attention_backward_reference: dS rounded before dS K
            ds = round_to(ds, precision)
        g = (ds @ k[keys]).astype(work) * scale
        result.append(g if precision is None else round_to(g, precision))
    return np.stack(result)[None, :, None, :]


def test_256k_keys_forward_rows_and_dq_rows_are_right():
    """S = 262144, causal, one head: sampled rows of out and dq against references."""
    dtype, S, D = "float16", 262144, 64
    host, (q, k, v, dout) = _inputs([(1, S, 1, D)] * 4, dtype, 14)
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    dq, dk, dv = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    rows = np.array([0, 1, 4095, 100000, S - 2, S - 1])
    bound = logit_bound(host[0], host[1])
    ref, _ = attention_reference(*host[:3], causal=True, rows=rows)
    ref_p, _ = attention_reference(*host[:3], causal=True, rows=rows, precision=dtype)
    cmp = testing.compare(testing.to_host(out)[:, rows], ref, ref_p, dtype, S, logit_bound=bound)
    assert cmp.ok, str(cmp)
    ref = _dq_rows_reference(host[3], *host[:3], rows)
    ref_p = _dq_rows_reference(host[3], *host[:3], rows, precision=dtype)
    cmp = testing.compare(testing.to_host(dq)[:, rows], ref, ref_p, dtype, S, factor=3.0, logit_bound=bound)
    assert cmp.ok, f"dq: {cmp}"
    for name, g in (("dk", dk), ("dv", dv)):
        assert np.isfinite(testing.to_host(g)).all(), f"{name} has non-finite values"


def test_arrays_over_2_31_elements():
    """q, k, v, out and the gradients hold 2048 * 8200 * 128 > 2**31 elements each: the
    last head starts past element 2**31, where 32-bit offsets would wrap."""
    import cupy

    B, S, H, D, dtype = 1, 2048, 8200, 128, "float16"
    assert B * S * H * D > 2**31
    if cupy.cuda.runtime.memGetInfo()[0] < 56 * 2**30:
        pytest.skip("needs 56 GiB of free device memory")
    rng = cupy.random.default_rng(15)
    q, k, v, dout = (testing.device_values((B, S, H, D), dtype, rng) for _ in range(4))
    out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True)
    grads = cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    for h in (0, H - 1):
        host = [testing.to_host(x[:, :, h : h + 1]) for x in (q, k, v, dout)]
        bound = logit_bound(host[0], host[1])
        ref, _ = attention_reference(*host[:3], causal=True)
        ref_p, _ = attention_reference(*host[:3], causal=True, precision=dtype)
        cmp = testing.compare(testing.to_host(out[:, :, h : h + 1]), ref, ref_p, dtype, S, logit_bound=bound)
        assert cmp.ok, f"head {h} out: {cmp}"
        refs = attention_backward_reference(host[3], *host[:3], causal=True)
        refs_p = attention_backward_reference(host[3], *host[:3], causal=True, precision=dtype)
        for name, g, r, rp in zip(("dq", "dk", "dv"), grads, refs, refs_p):
            cmp = testing.compare(testing.to_host(g[:, :, h : h + 1]), r, rp, dtype, S, factor=3.0, logit_bound=bound)
            assert cmp.ok, f"head {h} {name}: {cmp}"


def test_fused_backward_keeps_nan_in_keys_no_query_may_see_out_of_dq():
    """deterministic=False on sm_90 (the fused dK/dV/dQ pass, whose dQ^T = K^T dS^T
    multiplies every key of a block by dS, 0 where unseen): top_left causal with Sk > Sq,
    NaN keys and inf/NaN values from Sq on leave dk, dv bitwise and dq (float32 atomics,
    order free) finite and equal to within rounding to the run with clean ones."""
    import cupy

    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("the fused pass runs on sm_90")
    policy = P.Policy(wgmma_backward_min_rows=0)
    B, Sq, Sk, H, D = 2, 70, 200, 3, 64
    problem = P.AttentionProblem("float32", D, D, True, B, H, H, Sq, Sk, precision=("tf32",), deterministic=False)
    assert P.plan_backward(problem, current_device(), policy).dq is None
    _, (q, k, v, dout) = _inputs([(B, Sq, H, D), (B, Sk, H, D), (B, Sk, H, D), (B, Sq, H, D)], "float32", 9)

    def grads(k, v):
        out, lse = cupyattn.attention(q, k, v, causal="top_left", return_lse=True, precision="tf32", policy=policy)
        return cupyattn.attention_backward(
            dout, q, k, v, out, lse, causal="top_left", precision="tf32", deterministic=False, policy=policy
        )

    clean = grads(k, v)
    k2, v2 = k.copy(), v.copy()
    testing.poison(k2[:, Sq:])
    testing.poison(v2[:, Sq::2])
    v2[:, Sq + 1 :: 2].view(cupy.uint32).fill(0x7F800000)
    dq, dk, dv = grads(k2, v2)
    _assert_bitwise_equal([_bits(dk), _bits(dv)], [_bits(clean[1]), _bits(clean[2])], names=("dk", "dv"))
    assert bool(cupy.isfinite(dq).all()), "NaN or inf in keys no query sees reached dq"
    np.testing.assert_allclose(dq.get(), clean[0].get(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_staged_tiles_stay_alive_until_their_kernel_is_launched(monkeypatch, precision):
    """The wgmma kernels read TF32 tiles a staging launch wrote to a workspace array; that
    array must still be referenced when the kernel reading it is launched. Freed before
    (only its raw pointer kept), its memory could be unmapped (no memory pool: the dK/dV
    pass faults) or handed to another allocation before the kernel ran."""
    import weakref

    from cupyattn import api
    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        pytest.skip("tiles are staged for sm_90's wgmma kernels")
    policy = P.Policy(
        tiles={"fwd_mma": (), "bwd_dkdv_mma": (), "bwd_dq_mma": ()},  # wgmma's tiles at a small size
        wgmma_backward_min_rows=0,
        fused_where={(precision, 64)},
    )
    staged, checked = [], []
    stage_tiles, launch = api.stage_tiles, api._launch_packed

    def recording_stage_tiles(*args, **kwargs):
        tiles = stage_tiles(*args, **kwargs)
        staged.append(weakref.ref(tiles))
        return tiles

    def checking_launch(config, *args, **kwargs):
        if not isinstance(config, P.StagingConfig) and staged:
            assert all(ref() is not None for ref in staged), f"{config}: its staged tiles were freed before launch"
            checked.append(config)
            staged.clear()
        return launch(config, *args, **kwargs)

    monkeypatch.setattr(api, "stage_tiles", recording_stage_tiles)
    monkeypatch.setattr(api, "_launch_packed", checking_launch)
    B, S, H, D = 1, 130, 2, 64
    _, (q, k, v, dout) = _inputs([(B, S, H, D)] * 4, "float32", 11)
    out, lse = cupyattn.attention(q, k, v, return_lse=True, precision=precision, policy=policy)
    for deterministic in (True, False):
        cupyattn.attention_backward(
            dout, q, k, v, out, lse, precision=precision, deterministic=deterministic, policy=policy
        )
    # forward, dK/dV, dQ, fused: each reads tiles staged for it
    assert [type(c).__name__ for c in checked] == [
        "FwdWgmmaConfig",
        "BwdDkdvWgmmaConfig",
        "BwdDqWgmmaConfig",
        "BwdFusedWgmmaConfig",
    ], checked


def test_reduced_suite_runs_without_a_memory_pool():
    """scripts/sanitize_cases.py (every kernel family, odd shapes, GQA, each precision mode)
    with CuPy's memory pool off, in its own process: an access to memory freed too early
    (or past an allocation) faults there instead of landing in pooled memory, as it
    would in the rest of this suite (staged tiles freed before their launch fault here,
    where memcheck does not report them: docs/sanitizer.md)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "scripts" / "sanitize_cases.py"
    res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=dict(os.environ))
    lines = res.stdout.strip().splitlines()
    assert res.returncode == 0 and lines and lines[-1].startswith("sanitize cases:"), (
        f"exit {res.returncode}; last case started: "
        f"{next((l for l in reversed(lines) if l.startswith('case:')), None)}\n{res.stderr[-2000:]}"
    )


_GRID_SLOT_PROBE = r"""
#include "simt_tiles.cuh"
template <bool CAUSAL>
__global__ void grid_slots(int num_tiles, int* slots) {
    int rank;
    long long bh;
    cupyattn::grid_slot<CAUSAL>(num_tiles, rank, bh);
    if (threadIdx.x == 0) {
        slots[2 * blockIdx.x] = rank;
        slots[2 * blockIdx.x + 1] = (int)bh;
    }
}
"""


@pytest.mark.parametrize("num_tiles,heads", [(1, 1), (5, 3), (7, 17), (32, 64), (16, 9), (100, 11), (256, 5)])
def test_grid_slots_cover_every_tile_once_and_causal_grids_start_heaviest(num_tiles, heads):
    """simt_tiles.cuh's grid_slot, which every kernel's query_block / key_block goes
    through: each (rank, head) exactly once; not causal, rank fastest (the order the
    non-causal kernels always had); causal, each group of about 256 blocks (at most 32
    heads, the last group short) hands out its tiles heaviest (rank 0) first."""
    import cupy

    module = cupy.RawModule(
        code=cc.hashed_source(_GRID_SLOT_PROBE),
        options=cc.NVRTC_OPTIONS + (f"-I{cc.kernels_dir()}",),
        name_expressions=["grid_slots<false>", "grid_slots<true>"],
    )
    blocks = num_tiles * heads
    for causal in (False, True):
        slots = cupy.full(2 * blocks, -1, dtype=cupy.int32)
        module.get_function(f"grid_slots<{str(causal).lower()}>")((blocks,), (32,), (np.int32(num_tiles), slots))
        rank, bh = slots.get().reshape(blocks, 2).T
        assert sorted(zip(rank, bh)) == [(r, h) for r in range(num_tiles) for h in range(heads)]
        if not causal:
            assert (rank == np.arange(blocks) % num_tiles).all()
            continue
        group = max(1, min(32, 256 // num_tiles))
        for first in range(0, heads, group):
            span = slice(first * num_tiles, min(first + group, heads) * num_tiles)
            assert set(bh[span]) == set(range(first, min(first + group, heads)))
            assert (np.diff(rank[span]) >= 0).all(), f"group from head {first}: ranks {rank[span]}"


@pytest.mark.parametrize("path", ["float16", "float32 fp32 wgmma", "float32 tf32 wgmma", "float32 tf32 fused"])
@pytest.mark.parametrize("causal", [True, "top_left"])
def test_causal_grids_of_several_head_groups_match_the_reference(path, causal):
    """Causal grids are ordered by groups of heads (grid_slot; at these few tiles a head,
    32 heads a group): 3 x 12 heads, a full group and a short one in every grid, several
    tiles per head, the last partial, against the float64 reference."""
    from test_backward_gpu import run_backward_and_check
    from test_forward_gpu import run_and_check

    from cupyattn import plan as P
    from cupyattn.device import current_device

    dtype, *mode = path.split()
    precision, kernels = mode if mode else (None, None)
    policy = None
    if mode:
        if current_device().compute_capability != (9, 0):
            pytest.skip("wgmma needs an sm_90 GPU")
        policy = P.Policy(
            tiles={"fwd_mma": (), "bwd_dkdv_mma": (), "bwd_dq_mma": ()},
            wgmma_forward_min_keys=0,
            wgmma_backward_min_rows=0,
            fused_where={(precision, 64)},
        )
    B, Sq, Sk, Hq, Hkv, D = 3, 300, 257, 12, 12, 64
    deterministic = kernels != "fused"
    if mode:  # the kernels meant, not a fall-back
        problem = P.AttentionProblem(
            dtype, D, D, causal, B, Hq, Hkv, Sq, Sk, precision=(precision,), deterministic=deterministic
        )
        assert isinstance(P.plan_forward(problem, current_device(), policy).config, P.FwdWgmmaConfig)
        bwd = P.plan_backward(problem, current_device(), policy)
        assert isinstance(bwd.dkdv.config, P.BwdFusedWgmmaConfig if kernels == "fused" else P.BwdDkdvWgmmaConfig)
    shape = dict(
        B=B,
        Sq=Sq,
        Sk=Sk,
        Hq=Hq,
        Hkv=Hkv,
        D=D,
        Dv=D,
        dtype=dtype,
        causal=causal,
        precision=precision,
        seed=21,
        policy=policy,
    )
    run_and_check(**shape)
    run_backward_and_check(**shape, deterministic=deterministic)


@pytest.mark.parametrize("ordered", [False, True])
@pytest.mark.parametrize("D", [64, 128])
def test_fused_half_backward_keeps_nan_in_keys_no_query_may_see_out_of_dq(D, ordered):
    """The bfloat16 fused pass (attn_bwd_fused_wgmma_half, whose dQ = dS K multiplies every
    key of a block by dS, 0 where unseen; ordered: deterministic=True): top_left causal with
    Sk > Sq, NaN keys and inf/NaN values from Sq on leave dk, dv bitwise and dq (ordered:
    bitwise too) finite and equal to within rounding to the run with clean ones."""
    import cupy
    from test_backward_gpu import _fused_half_policy

    from cupyattn import plan as P
    from cupyattn.device import current_device

    policy = _fused_half_policy("bfloat16", D, ordered)
    B, Sq, Sk, H = 2, 70, 300, 3
    problem = P.AttentionProblem("bfloat16", D, D, True, B, H, H, Sq, Sk, deterministic=ordered)
    cfg = P.plan_backward(problem, current_device(), policy).dkdv.config
    assert isinstance(cfg, P.BwdFusedWgmmaHalfConfig) and cfg.ordered == ordered
    _, (q, k, v, dout) = _inputs([(B, Sq, H, D), (B, Sk, H, D), (B, Sk, H, D), (B, Sq, H, D)], "bfloat16", 11)

    def grads(k, v):
        out, lse = cupyattn.attention(q, k, v, causal="top_left", return_lse=True)
        return cupyattn.attention_backward(
            dout, q, k, v, out, lse, causal="top_left", deterministic=ordered, policy=policy
        )

    clean = grads(k, v)
    k2, v2 = k.copy(), v.copy()
    testing.poison(k2[:, Sq:])
    testing.poison(v2[:, Sq::2])
    v2[:, Sq + 1 :: 2].view(cupy.uint16).fill(0x7F80)  # bfloat16 inf
    dq, dk, dv = grads(k2, v2)
    if ordered:
        _assert_bitwise_equal([_bits(dq)], [_bits(clean[0])], names=("dq",))
    _assert_bitwise_equal([_bits(dk), _bits(dv)], [_bits(clean[1]), _bits(clean[2])], names=("dk", "dv"))
    dq32, clean32 = testing.to_host(dq), testing.to_host(clean[0])
    assert np.isfinite(dq32).all(), "NaN or inf in keys no query sees reached dq"
    np.testing.assert_allclose(dq32, clean32, rtol=1e-2, atol=1e-3)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_the_dq_pass_beside_dkdv_joins_the_callers_stream(precision, monkeypatch):
    """The backward's dQ pass runs on a second stream beside the dK/dV pass
    (api.OVERLAP_DQ). With that stream held up by a spinning kernel, a copy queued on the
    caller's (non-default) stream right after the call still reads the finished dq, not
    the poison it was filled with: the caller's stream waits for the dQ pass. The bits
    are those of both passes on one stream."""
    import cupy

    from cupyattn import api

    B, S, H, D = 1, 512, 4, 64
    _, (q, k, v, dout) = _inputs([(B, S, H, D)] * 4, "float32", 21)
    grads = {}
    with cupy.cuda.Stream(non_blocking=True) as work:
        out, lse = cupyattn.attention(q, k, v, causal=True, return_lse=True, precision=precision)
        for overlap in (False, True):
            monkeypatch.setattr(api, "OVERLAP_DQ", overlap)
            dq = cupy.empty_like(q)
            testing.poison(dq)
            with api._side_stream(q.device.id):
                _spin(0.2)  # ahead of the dQ pass
            cupyattn.attention_backward(dout, q, k, v, out, lse, causal=True, precision=precision, dq=dq)
            grads[overlap] = dq.copy()  # queued on `work` right behind the call
        work.synchronize()
    assert bool(cupy.isfinite(grads[True]).all()), "the caller's stream did not wait for the dQ pass"
    assert np.array_equal(_bits(grads[True]), _bits(grads[False]))
