"""A reduced suite for compute-sanitizer: every kernel family once per dtype (float32
in each precision mode: 3xTF32, TF32, bfloat16- and float16-staged; the wgmma forward
and backward on sm_90), causal and not, odd sizes (1, tile - 1, tile + 1, Sq != Sk), GQA, strided views, with
CuPy's memory pool disabled so an out-of-bounds access lands outside any allocation.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_cases.py
"""

import sys
from pathlib import Path

import cupy
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupyattn  # noqa: E402
from cupyattn import testing  # noqa: E402

cupy.cuda.set_allocator(None)  # no pool: every array is its own cudaMalloc

CASES = [  # (B, Sq, Sk, Hq, Hkv, D, causal)
    (1, 1, 1, 1, 1, 8, False),
    (2, 63, 65, 4, 2, 64, True),
    (1, 65, 17, 2, 1, 128, "top_left"),
    (1, 33, 129, 2, 2, 40, True),
    (1, 17, 31, 1, 1, 256, False),
    (1, 9, 9, 3, 1, 33, True),
]


def main():
    rng = np.random.default_rng(0)
    n = 0
    runs = [("float16", None), ("bfloat16", None)] + [("float32", p) for p in ("fp32", "tf32", "bf16", "fp16")]
    for dtype, precision in runs:
        for B, Sq, Sk, Hq, Hkv, D, causal in CASES:
            q, k, v, do = (testing.to_device(testing.host_values(shape, dtype, rng), dtype) for shape in
                           ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D)))
            _case(dtype, precision, (B, Sq, Sk, Hq, Hkv, D, causal))
            out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=precision)
            cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, precision=precision)
            # A strided view (SIMT path) of the same data.
            raw = q.view(f"u{q.itemsize}")  # copy bits: CuPy has no bfloat16 kernels
            qs = cupy.concatenate([raw, raw], axis=2)[:, :, :Hq].view(q.dtype)
            cupyattn.attention(qs, k, v, causal=causal, precision=precision)
            n += 1
    n_wgmma = _wgmma_forward(rng)
    n_wgmma_bwd = _wgmma_backward(rng)
    cupy.cuda.Device().synchronize()
    print(f"sanitize cases: {n} shapes x (forward, backward, strided forward) ran, "
          f"{n_wgmma} wgmma forwards, {n_wgmma_bwd} wgmma backwards")


def _case(kind, precision, shape):
    """Name the case about to run, after the previous one has finished: a fault then
    shows up under the name of the case that caused it."""
    cupy.cuda.Device().synchronize()
    print(f"case: {kind} precision={precision} (B, Sq, Sk, Hq, Hkv, D, causal)={shape}", flush=True)


def _wgmma_forward(rng) -> int:
    """The sm_90a wgmma forward (float32 "fp32" / "tf32") at the cases it can take (33 or
    more query rows), with mma.sync's tiles out of the way: these small problems would
    otherwise plan mma.sync's smaller tiles."""
    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        return 0
    saved, P.FWD_MMA_TILES = P.FWD_MMA_TILES, ()
    P.plan_forward.cache_clear()
    n = 0
    try:
        for precision in ("fp32", "tf32"):
            for B, Sq, Sk, Hq, Hkv, D, causal in CASES + [(1, 70, 31, 1, 1, 256, False)]:
                if Sq < 33:
                    continue
                q, k, v = (testing.to_device(testing.host_values(shape, "float32", rng), "float32") for shape in
                           ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D)))
                problem = P.AttentionProblem("float32", D, D, causal, B, Hq, Hkv, Sq, Sk, precision=precision)
                assert isinstance(P.plan_forward(problem, current_device()).config, P.FwdWgmmaConfig)
                _case("wgmma forward", precision, (B, Sq, Sk, Hq, Hkv, D, causal))
                cupyattn.attention(q, k, v, causal=causal, precision=precision)
                n += 1
    finally:
        P.FWD_MMA_TILES = saved
        P.plan_forward.cache_clear()
    return n


def _wgmma_backward(rng) -> int:
    """The sm_90a wgmma backward (dK/dV and dQ; and deterministic=False, the fused
    dK/dV/dQ pass) wherever a case can take one of its kernels, mma.sync's tiles out of
    the way and the fused pass allowed at any length."""
    from cupyattn import plan as P
    from cupyattn.device import current_device

    if current_device().compute_capability != (9, 0):
        return 0
    saved = P.BWD_DKDV_MMA_TILES, P.BWD_DQ_MMA_TILES, P.WGMMA_BACKWARD_MIN_ROWS, P.BWD_FUSED_WHERE_FASTER
    P.BWD_DKDV_MMA_TILES = P.BWD_DQ_MMA_TILES = ()
    P.WGMMA_BACKWARD_MIN_ROWS = 0
    P.BWD_FUSED_WHERE_FASTER = {(m, d) for m in ("fp32", "tf32") for d in (64, 128, 192, 256)}
    P.plan_backward.cache_clear()
    n = 0
    try:
        for precision in ("fp32", "tf32"):
            for B, Sq, Sk, Hq, Hkv, D, causal in CASES + [(1, 70, 31, 1, 1, 256, False), (2, 100, 70, 4, 2, 64, True)]:
                for deterministic in (True, False):
                    problem = P.AttentionProblem("float32", D, D, causal, B, Hq, Hkv, Sq, Sk, precision=precision,
                                                 deterministic=deterministic)
                    bwd = P.plan_backward(problem, current_device())
                    if not any(isinstance(p.config, P.WgmmaConfig) for p in bwd.plans) or (
                            not deterministic and bwd.dq is not None):
                        continue
                    q, k, v, do = (testing.to_device(testing.host_values(shape, "float32", rng), "float32")
                                   for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D)))
                    _case("wgmma backward" + ("" if deterministic else ", fused"), precision,
                          (B, Sq, Sk, Hq, Hkv, D, causal))
                    out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=precision)
                    cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, precision=precision,
                                                deterministic=deterministic)
                    n += 1
    finally:
        P.BWD_DKDV_MMA_TILES, P.BWD_DQ_MMA_TILES, P.WGMMA_BACKWARD_MIN_ROWS, P.BWD_FUSED_WHERE_FASTER = saved
        P.plan_backward.cache_clear()
    return n


if __name__ == "__main__":
    main()
