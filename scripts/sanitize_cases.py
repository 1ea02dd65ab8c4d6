"""compute-sanitizer's reduced suite: every kernel family once per dtype (float32 in each
precision mode: 3xTF32, TF32, bfloat16- and float16-staged; on sm_90 the wgmma forward and
backward of float32 and of float16 / bfloat16), causal and not, odd sizes (1, tile - 1, tile + 1, Sq != Sk), GQA,
strided views; and, with --planted TOOL, one planted bug per tool, which the tool must
report before its clean report on the suite is believed. CuPy's memory pool is off, so
an out-of-bounds access lands outside any allocation. scripts/sanitize.sh runs both under
each tool; by hand, from a checkout:

    PYTHONPATH=. compute-sanitizer --tool memcheck python3 scripts/sanitize_cases.py
    PYTHONPATH=. compute-sanitizer --tool memcheck python3 scripts/sanitize_cases.py --planted memcheck

--part half runs the float16 / bfloat16 wgmma cases alone (sm_90).
"""

import argparse

import cupy
import numpy as np

import cupyattn
from cupyattn import testing
from cupyattn.device import current_device
from cupyattn.plan import (
    AttentionProblem,
    FwdWgmmaConfig,
    Policy,
    WgmmaConfig,
    WgmmaHalfConfig,
    plan_backward,
    plan_forward,
)

TOOLS = ("memcheck", "racecheck", "synccheck", "initcheck")

cupy.cuda.set_allocator(None)  # no pool: every array is its own cudaMalloc

CASES = [  # (B, Sq, Sk, Hq, Hkv, D, causal)
    (1, 1, 1, 1, 1, 8, False),
    (2, 63, 65, 4, 2, 64, True),
    (1, 65, 17, 2, 1, 128, "top_left"),
    (1, 33, 129, 2, 2, 40, True),
    (1, 17, 31, 1, 1, 256, False),
    (1, 9, 9, 3, 1, 33, True),
]


def suite(part: str = "all"):
    rng = np.random.default_rng(0)
    if part == "half":
        n_half = _wgmma_half(rng)
        cupy.cuda.Device().synchronize()
        print(f"sanitize cases: {n_half} float16 / bfloat16 wgmma forwards and backwards (part half)")
        return
    n = 0
    runs = [("float16", None), ("bfloat16", None)] + [("float32", p) for p in ("fp32", "tf32", "bf16", "fp16")]
    for dtype, precision in runs:
        for B, Sq, Sk, Hq, Hkv, D, causal in CASES:
            q, k, v, do = (
                testing.to_device(testing.host_values(shape, dtype, rng), dtype)
                for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D))
            )
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
    n_half = _wgmma_half(rng)
    cupy.cuda.Device().synchronize()
    print(
        f"sanitize cases: {n} shapes x (forward, backward, strided forward) ran, "
        f"{n_wgmma} wgmma forwards, {n_wgmma_bwd} wgmma backwards, {n_half} float16 / bfloat16 wgmma "
        "forwards and backwards"
    )


def _case(kind, precision, shape):
    """Name the case about to run, after the previous one has finished: a fault then
    shows up under the name of the case that caused it."""
    cupy.cuda.Device().synchronize()
    print(f"case: {kind} precision={precision} (B, Sq, Sk, Hq, Hkv, D, causal)={shape}", flush=True)


def _wgmma_forward(rng) -> int:
    """The sm_90a wgmma forward (float32 "fp32" / "tf32") at the cases it can take (33 or
    more query rows), with mma.sync's tiles out of the way: these small problems would
    otherwise plan mma.sync's smaller tiles."""
    if current_device().compute_capability != (9, 0):
        return 0
    policy = Policy(families={"wgmma", "simt"})
    n = 0
    for precision in ("fp32", "tf32"):
        for B, Sq, Sk, Hq, Hkv, D, causal in CASES + [(1, 70, 31, 1, 1, 256, False)]:
            if Sq < 33:
                continue
            q, k, v = (
                testing.to_device(testing.host_values(shape, "float32", rng), "float32")
                for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D))
            )
            problem = AttentionProblem("float32", D, D, causal, B, Hq, Hkv, Sq, Sk, precision=precision)
            assert isinstance(plan_forward(problem, current_device(), policy=policy).config, FwdWgmmaConfig)
            _case("wgmma forward", precision, (B, Sq, Sk, Hq, Hkv, D, causal))
            cupyattn.attention(q, k, v, causal=causal, precision=precision, policy=policy)
            n += 1
    return n


def _wgmma_backward(rng) -> int:
    """The sm_90a wgmma backward (dK/dV and dQ; and deterministic=False, the fused
    dK/dV/dQ pass) wherever a case can take one of its kernels, mma.sync's tiles out of
    the way and the fused pass allowed at any length."""
    if current_device().compute_capability != (9, 0):
        return 0
    policy = Policy(
        families={"wgmma", "simt", "fused"},
        wgmma_backward_min_rows=0,
        wgmma_backward_min_rows_from_128=0,
        fused_where={(m, d) for m in ("fp32", "tf32") for d in (64, 128, 192, 256)},
    )
    n = 0
    for precision in ("fp32", "tf32"):
        for B, Sq, Sk, Hq, Hkv, D, causal in CASES + [(1, 70, 31, 1, 1, 256, False), (2, 100, 70, 4, 2, 64, True)]:
            for deterministic in (True, False):
                problem = AttentionProblem(
                    "float32", D, D, causal, B, Hq, Hkv, Sq, Sk, precision=precision, deterministic=deterministic
                )
                bwd = plan_backward(problem, current_device(), policy=policy)
                if not any(isinstance(p.config, WgmmaConfig) for p in bwd.plans) or (
                    not deterministic and bwd.dq is not None
                ):
                    continue
                q, k, v, do = (
                    testing.to_device(testing.host_values(shape, "float32", rng), "float32")
                    for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D))
                )
                _case(
                    "wgmma backward" + ("" if deterministic else ", fused"), precision, (B, Sq, Sk, Hq, Hkv, D, causal)
                )
                out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=precision)
                cupyattn.attention_backward(
                    do,
                    q,
                    k,
                    v,
                    out,
                    lse,
                    causal=causal,
                    precision=precision,
                    deterministic=deterministic,
                    policy=policy,
                )
                n += 1
    return n


def _wgmma_half(rng) -> int:
    """The sm_90a float16 / bfloat16 wgmma forward and backward passes (TMA-loaded tiles)
    wherever a case can take one of their kernels, mma.sync's tiles out of the way; longer
    cases add partial tiles past one block (keys no row sees, d_split 2 at 256); and the
    fused backward (deterministic or not) wherever it is planned when allowed at every head dim."""
    if current_device().compute_capability != (9, 0):
        return 0
    policy = Policy(families={"wgmma_half", "simt"})
    everywhere = {(m, d) for m in ("fp16", "bf16") for d in range(16, 257, 16)}
    fused = Policy(families={"wgmma_half", "simt", "fused"}, fused_where=everywhere, ordered_fused_where=everywhere)
    extra = [(1, 130, 200, 2, 1, 64, True), (2, 100, 70, 4, 2, 128, False), (1, 129, 129, 2, 2, 256, "top_left")]
    n = 0
    for dtype in ("float16", "bfloat16"):
        for B, Sq, Sk, Hq, Hkv, D, causal in CASES + extra:
            problem = AttentionProblem(dtype, D, D, causal, B, Hq, Hkv, Sq, Sk)
            fwd = plan_forward(problem, current_device(), policy=policy)
            bwd = plan_backward(problem, current_device(), policy=policy)
            if not any(isinstance(c, WgmmaHalfConfig) for c in (fwd.config, *(p.config for p in bwd.plans))):
                continue
            q, k, v, do = (
                testing.to_device(testing.host_values(shape, dtype, rng), dtype)
                for shape in ((B, Sq, Hq, D), (B, Sk, Hkv, D), (B, Sk, Hkv, D), (B, Sq, Hq, D))
            )
            _case("wgmma_half forward and backward", dtype, (B, Sq, Sk, Hq, Hkv, D, causal))
            out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, policy=policy)
            cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, policy=policy)
            n += 1
            for deterministic in (False, True):
                problem = AttentionProblem(dtype, D, D, causal, B, Hq, Hkv, Sq, Sk, deterministic=deterministic)
                if plan_backward(problem, current_device(), policy=fused).dq is None:
                    shape = (B, Sq, Sk, Hq, Hkv, D, causal)
                    _case(f"wgmma_half fused backward, deterministic={deterministic}", dtype, shape)
                    cupyattn.attention_backward(
                        do, q, k, v, out, lse, causal=causal, deterministic=deterministic, policy=fused
                    )
                    n += 1
    return n


SOURCE = r"""
// memcheck: writes one element past the end of a 256-float allocation.
extern "C" __global__ void out_of_bounds(float* out, int n) {
    out[threadIdx.x + (threadIdx.x == 0 ? n : 0)] = 1.0f;
}

// racecheck: each thread reads the shared word a thread of the other warp writes,
// with no barrier between (a read of its own word could be forwarded from the store).
extern "C" __global__ void shared_race(int* out) {
    __shared__ volatile int words[64];
    words[threadIdx.x] = threadIdx.x;
    out[threadIdx.x] = words[(threadIdx.x + 32) % 64];
}

// synccheck: __syncwarp with a mask that leaves out the calling thread (synccheck's
// "invalid arguments"). A barrier reached by one warp while the other exits is
// legal on sm_70+ (exited threads count as arrived) and is not reported.
extern "C" __global__ void bad_syncwarp_mask(int* out) {
    __syncwarp(0xffffffffu ^ (1u << (threadIdx.x % 32)));
    out[threadIdx.x] = threadIdx.x;
}

// initcheck: reads device memory that nothing wrote.
extern "C" __global__ void uninitialized_read(const float* in, float* out) {
    out[threadIdx.x] = in[threadIdx.x] + 1.0f;
}
"""


def planted(tool: str):
    """Run the planted bug of ``tool`` (memcheck, racecheck, synccheck or initcheck)."""
    module = cupy.RawModule(code=SOURCE)
    n = 256
    if tool == "memcheck":
        out = cupy.empty(n, dtype=cupy.float32)
        module.get_function("out_of_bounds")((1,), (32,), (out, np.int32(n)))
    elif tool == "racecheck":
        out = cupy.empty(64, dtype=cupy.int32)
        module.get_function("shared_race")((1,), (64,), (out,))
    elif tool == "synccheck":
        out = cupy.empty(32, dtype=cupy.int32)
        module.get_function("bad_syncwarp_mask")((1,), (32,), (out,))
    elif tool == "initcheck":
        src, out = cupy.empty(32, dtype=cupy.float32), cupy.empty(32, dtype=cupy.float32)
        module.get_function("uninitialized_read")((1,), (32,), (src, out))
    try:
        cupy.cuda.Device().synchronize()
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # a tool may stop the kernel
        print(f"planted {tool} bug: {exc}")
    print(f"planted {tool} bug ran")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--planted", choices=TOOLS, default=None, help="run this tool's planted bug, not the suite")
    parser.add_argument("--part", choices=("all", "half"), default="all", help="the whole suite, or its half part")
    args = parser.parse_args()
    if args.planted:
        planted(args.planted)
    else:
        suite(args.part)


if __name__ == "__main__":
    main()
