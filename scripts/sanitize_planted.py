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
        out = cupy.empty(32, dtype=cupy.int32)
        module.get_function("bad_syncwarp_mask")((1,), (32,), (out,))
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
