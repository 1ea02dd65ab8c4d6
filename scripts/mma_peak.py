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
struct F16 {  // m16n8k16, float16 operands
    static constexpr unsigned MASK = 0xFFFFFFFFu;
    __device__ static void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};
struct Tf32 {  // m16n8k8, TF32 operands (finite values below 1 with TF32's 10 mantissa bits)
    static constexpr unsigned MASK = 0x3F7FE000u;
    __device__ static void mma(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 "
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
    }
};

// CHAINS independent accumulators per warp, ITERS mma each; operands stay in registers.
template <typename Op, int CHAINS, int ITERS>
__global__ void mma_loop(float* out, unsigned seed) {
    unsigned a[4], b[2];
    for (int i = 0; i < 4; ++i) a[i] = (seed * (threadIdx.x + i)) & Op::MASK;
    for (int i = 0; i < 2; ++i) b[i] = (seed ^ (threadIdx.x * 7 + i)) & Op::MASK;
    float c[CHAINS][4] = {};
    for (int it = 0; it < ITERS; ++it) {
#pragma unroll
        for (int ch = 0; ch < CHAINS; ++ch) Op::mma(c[ch], a, b);
    }
    float s = 0.0f;
    for (int ch = 0; ch < CHAINS; ++ch) s += c[ch][0] + c[ch][1] + c[ch][2] + c[ch][3];
    if (s == 1.2345f) out[0] = s;  // keeps the work; never true for these inputs in practice
}
"""

CHAINS, ITERS = 8, 4096
KERNELS = {"float16 m16n8k16": ("F16", 16 * 8 * 16 * 2), "tf32 m16n8k8": ("Tf32", 16 * 8 * 8 * 2)}


def measure(op, flops_per_mma, warps_per_block=8, blocks_per_sm=4, repeats=10):
    name = f"mma_loop<{op}, {CHAINS}, {ITERS}>"
    module = cupy.RawModule(code=SOURCE, options=("-std=c++17",), name_expressions=[name])
    kernel = module.get_function(name)
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
    for label, (op, flops_per_mma) in KERNELS.items():
        result["tflops"][label] = measure(op, flops_per_mma)
        print(f"{label}: {result['tflops'][label]:.1f} TFLOP/s", flush=True)
    tf32 = result["tflops"]["tf32 m16n8k8"]
    result["tflops"]["3xTF32 (fp32) ceiling"] = tf32 / 3
    print(f"3xTF32 ceiling (one third of TF32): {tf32 / 3:.1f} TFLOP/s of float32 attention math")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
