"""TF32 wgmma throughput by tile width N, with nothing else in the loop (sm_90a).

The "fp32" backward runs its score products as m64nNk8 wgmma with N = 16 or 32 (the
streamed tile: 16 query rows for dK/dV from head dim 128, 16 keys for dQ from 160);
this prints what the tensor cores give at each N, A from registers ("rs", as the
3xTF32 kernels' split words) or from shared memory ("ss"), with one or two
warpgroups a block and one block per SM: the ceiling a kernel of that shape can reach.

Each warpgroup issues GROUP wgmmas into two alternating accumulators, commits, and
waits for the group before last, ITERS times; B (and A for "ss") is one zeroed
shared-memory tile, so no memory traffic but the operand reads. TFLOP/s count
2 * 64 * N * 8 per wgmma. Kernels come from kernels/wgmma.cuh (WgmmaTf32, wgmma_desc)
through NVRTC for sm_90a; without a Hopper GPU the script compiles them and stops.

    PYTHONPATH=. python scripts/wgmma_rate.py [--iters 4096] [--json FILE]
"""

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyattn.compile import NVRTC_OPTIONS, _Nvrtc, kernels_dir  # noqa: E402

WIDTHS = (16, 32, 64, 128)
GROUP = 4  # wgmmas per commit group

SOURCE = r"""
#include "wgmma.cuh"
using namespace cupyattn;

// One kernel per (N, A in registers): every warpgroup of the block runs the same loop.
template <int N, bool RS>
__global__ void __launch_bounds__(256, 1) rate(float* out, int iters) {
    __shared__ __align__(128) float tile[64 * 8];     // A: 64 rows x one k-step
    __shared__ __align__(128) float b_tile[128 * 8];  // B: N rows (up to 128) x one k-step
    for (int i = threadIdx.x; i < 64 * 8; i += blockDim.x) tile[i] = 0.0f;
    for (int i = threadIdx.x; i < 128 * 8; i += blockDim.x) b_tile[i] = 0.0f;
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    __syncthreads();
    const auto a_desc = wgmma_desc<64>(wg_smem_addr(tile));
    const auto b_desc = wgmma_desc<N>(wg_smem_addr(b_tile));
    const unsigned a_regs[4] = {0u, 0u, 0u, 0u};
    float d[2][N / 8][4];
    for (int c = 0; c < 2; ++c)
        for (int j = 0; j < N / 8; ++j)
            for (int e = 0; e < 4; ++e) d[c][j][e] = 0.0f;
    for (int it = 0; it < iters; ++it) {
        wgmma_fence();
#pragma unroll
        for (int i = 0; i < GROUP; ++i) {
            if constexpr (RS)
                WgmmaTf32<N>::template rs<true>(d[i % 2], a_regs, b_desc);
            else
                WgmmaTf32<N>::template ss<true>(d[i % 2], a_desc, b_desc);
        }
        wgmma_commit();
        wgmma_wait<1>();
    }
    wgmma_wait<0>();
    float sum = 0.0f;
    for (int c = 0; c < 2; ++c)
        for (int j = 0; j < N / 8; ++j)
            for (int e = 0; e < 4; ++e) sum += d[c][j][e];
    if (sum != 0.0f) out[0] = sum;  // keeps the loop; never true (zero operands)
}
""".replace("GROUP", str(GROUP))


def names() -> list:
    return [f"rate<{n}, {'true' if rs else 'false'}>" for n in WIDTHS for rs in (True, False)]


def compile_cubin() -> tuple:
    """The probe's cubin for sm_90a and each kernel's lowered name."""
    nvrtc = _Nvrtc.for_arch("sm_90a")
    prog = nvrtc.create_program(SOURCE, "wgmma_rate.cu")
    try:
        for name in names():
            nvrtc.add_name_expression(prog, name)
        options = list(NVRTC_OPTIONS) + ["-arch=sm_90a", f"-I{kernels_dir()}"]
        options += [f"-I{d}" for d in nvrtc.include_dirs]
        nvrtc.compile_program(prog, options)
        return nvrtc.cubin(prog), {name: nvrtc.lowered_name(prog, name) for name in names()}
    finally:
        nvrtc.destroy_program(prog)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=4096)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    cubin, lowered = compile_cubin()
    print(f"NVRTC compiled {len(lowered)} wgmma rate kernels for sm_90a ({len(cubin)} bytes)")
    try:
        import cupy
        if cupy.cuda.Device().compute_capability != "90":
            raise RuntimeError("not an sm_90 GPU")
    except Exception as exc:  # no GPU, or not Hopper: the compile is all this machine can show
        print(f"not run: {exc}")
        return 0
    sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
    out = cupy.zeros(1, cupy.float32)
    rows = []
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        module = cupy.RawModule(path=f.name)
        print("| N | A | warpgroups a block | TFLOP/s |\n|---|---|---|---|")
        for name in names():
            kernel = module.get_function(lowered[name])
            n, rs = int(name.split("<")[1].split(",")[0]), "true" in name
            for wgs in (1, 2):
                launch = lambda: kernel((sms,), (128 * wgs,), (out, cupy.int32(args.iters)))  # noqa: E731
                launch()
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record()
                for _ in range(5):
                    launch()
                stop.record()
                stop.synchronize()
                ms = cupy.cuda.get_elapsed_time(start, stop) / 5
                flops = 2 * 64 * n * 8 * GROUP * args.iters * wgs * sms
                tflops = flops / ms / 1e9
                rows.append(dict(n=n, a="registers" if rs else "shared", warpgroups=wgs, tflops=round(tflops, 1)))
                print(f"| {n} | {'rs' if rs else 'ss'} | {wgs} | {tflops:.1f} |", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
