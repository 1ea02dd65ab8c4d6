"""The ceiling of the instructions cupyattn's tensor-core kernels use: mma.sync
throughput on this GPU, per operand type, with nothing else in the loop.

Each warp runs CHAINS independent accumulator tiles through ITERS mma.sync in a
loop (operands stay in registers; no memory traffic), with enough warps per SM to
cover the instructions' latency. Prints TFLOP/s for float16 (m16n8k16) and TF32
(m16n8k8) operands, and what that makes the ceiling of 3xTF32 (three TF32 mma per
product): the fastest any "fp32" kernel built on mma.sync could run, against which
a target such as "1.5x torch's float32" can be checked.

    PYTHONPATH=. python scripts/mma_peak.py [--json FILE]
"""

import argparse
import json

import cupy

SOURCE = r"""
template <int CHAINS, int ITERS>
__global__ void mma_f16(float* out, unsigned seed) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = seed * (threadIdx.x + i);
    for (int i = 0; i < 2; ++i) b[i] = seed ^ (threadIdx.x * 7 + i);
    float c[CHAINS][4] = {};
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int ch = 0; ch < CHAINS; ++ch)
            asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(c[ch][0]), "+f"(c[ch][1]), "+f"(c[ch][2]), "+f"(c[ch][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
    for (int ch = 0; ch < CHAINS; ++ch) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
    if (s == 1.2345f) out[0] = s;  // keeps the work; never true for these inputs in practice
}

template <int CHAINS, int ITERS>
__global__ void mma_tf32(float* out, unsigned seed) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = (seed * (threadIdx.x + i)) & 0x3f7fe000u;
    for (int i = 0; i < 2; ++i) b[i] = (seed ^ (threadIdx.x * 7 + i)) & 0x3f7fe000u;
    float c[CHAINS][4] = {};
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int ch = 0; ch < CHAINS; ++ch)
            asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                         "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                         : "+f"(c[ch][0]), "+f"(c[ch][1]), "+f"(c[ch][2]), "+f"(c[ch][3])
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
    float s = 0.0f;
    for (int ch = 0; ch < CHAINS; ++ch) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
    if (s == 1.2345f) out[0] = s;
}
"""

CHAINS, ITERS = 8, 4096
KERNELS = {"float16 m16n8k16": ("mma_f16", 16 * 8 * 16 * 2), "tf32 m16n8k8": ("mma_tf32", 16 * 8 * 8 * 2)}


def measure(name, flops_per_mma, warps_per_block=8, blocks_per_sm=4, repeats=10):
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",),
                            name_expressions=[f"{name}<{CHAINS}, {ITERS}>"])
    kernel = module.get_function(f"{name}<{CHAINS}, {ITERS}>")
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    grid, block = sms * blocks_per_sm, warps_per_block * 32
    out = cupy.zeros(1, cupy.float32)
    kernel((grid,), (block,), (out, cupy.uint32(12345)))  # warm-up (and compile)
    start, stop = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        start.record()
        kernel((grid,), (block,), (out, cupy.uint32(12345)))
        stop.record()
        stop.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, stop))
    ms = sorted(times)[len(times) // 2]
    mmas = grid * warps_per_block * CHAINS * ITERS
    return mmas * flops_per_mma / ms / 1e9


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    result = {"device": props["name"].decode(), "tflops": {}}
    for label, (name, flops_per_mma) in KERNELS.items():
        result["tflops"][label] = measure(name, flops_per_mma)
        print(f"{label}: {result['tflops'][label]:.1f} TFLOP/s", flush=True)
    tf32 = result["tflops"]["tf32 m16n8k8"]
    result["tflops"]["3xTF32 (fp32) ceiling"] = tf32 / 3
    print(f"3xTF32 ceiling (one third of TF32): {tf32 / 3:.1f} TFLOP/s of float32 attention math")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
