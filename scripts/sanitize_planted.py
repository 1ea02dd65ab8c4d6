"""One planted bug per compute-sanitizer tool, to prove the tool is live before its
clean report on scripts/sanitize_cases.py is believed. CuPy's memory pool is off,
so an out-of-bounds write lands outside any allocation.

    compute-sanitizer --tool memcheck python3 scripts/sanitize_planted.py memcheck

Each tool must report errors on its own bug (scripts/sanitize.sh checks that).
"""

import sys

import cupy
import numpy as np

cupy.cuda.set_allocator(None)

SOURCE = r"""
// memcheck: writes one element past the end of a 256-float allocation.
extern "C" __global__ void out_of_bounds(float* out, int n) {
    out[threadIdx.x + (threadIdx.x == 0 ? n : 0)] = 1.0f;
}

// racecheck: two warps write and read one shared word with no barrier between.
extern "C" __global__ void shared_race(int* out) {
    __shared__ int word;
    word = threadIdx.x;
    out[threadIdx.x] = word;
}

// synccheck: a block barrier only the first warp reaches (the second exits, so
// the block cannot hang: exited threads count as arrived on sm_70+).
extern "C" __global__ void divergent_barrier(int* out) {
    if (threadIdx.x >= 32) return;
    __syncthreads();
    out[threadIdx.x] = threadIdx.x;
}

// initcheck: reads device memory that nothing wrote.
extern "C" __global__ void uninitialized_read(const float* in, float* out) {
    out[threadIdx.x] = in[threadIdx.x] + 1.0f;
}
"""


def main(tool: str):
    module = cupy.RawModule(code=SOURCE)
    n = 256
    if tool == "memcheck":
        out = cupy.empty(n, dtype=cupy.float32)
        module.get_function("out_of_bounds")((1,), (32,), (out, np.int32(n)))
    elif tool == "racecheck":
        out = cupy.empty(64, dtype=cupy.int32)
        module.get_function("shared_race")((1,), (64,), (out,))
    elif tool == "synccheck":
        out = cupy.empty(64, dtype=cupy.int32)
        module.get_function("divergent_barrier")((1,), (64,), (out,))
    elif tool == "initcheck":
        src, out = cupy.empty(32, dtype=cupy.float32), cupy.empty(32, dtype=cupy.float32)
        module.get_function("uninitialized_read")((1,), (32,), (src, out))
    else:
        raise SystemExit(f"tool: expected memcheck, racecheck, synccheck or initcheck, got {tool!r}")
    try:
        cupy.cuda.Device().synchronize()
    except cupy.cuda.runtime.CUDARuntimeError as exc:  # a tool may stop the kernel
        print(f"planted {tool} bug: {exc}")
    print(f"planted {tool} bug ran")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "memcheck")
