"""One Hopper wgmma (sm_90a), TF32 operands from shared memory, checked against NumPy.

Groundwork for a wgmma kernel family (issue 6: mma.sync caps 3xTF32 near 105
TFLOP/s on the H200, BENCHMARKS.md): a warpgroup computes D (64 x 64, float32) = A
(64 x 8) B^T (B: 64 x 8, K-major) with one `wgmma.mma_async.m64n64k8.f32.tf32.tf32`,
both operands in shared memory without swizzling, in the canonical K-major layout of
8-row x 16-byte core matrices, compiled by NVRTC for sm_90a (HGMMA.64x64x8.F32.TF32
in SASS) and loaded as a cubin, since CuPy's RawModule adds its own -arch.

Measured on the H200 (2026-12-02, NVRTC 13.0): with the descriptor's leading byte
offset as the step between the two core matrices along K (1024 bytes here) and the
stride byte offset as the step between 8-row groups (128), D equals A B^T exactly
(inputs are small integers, exact in TF32), the accumulator fragment mapped as for
mma.sync: warp w holds rows 16w..16w+15, register 4j+e of lane (g, t) row g + 8(e/2),
column 8j + 2t + e%2. The other reading of the two offsets reads past the tile and
faults (illegal address), so each reading runs in a process of its own.

    PYTHONPATH=. python scripts/wgmma_probe.py ["K step" | "row-group step"]
"""

import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cupyattn.compile import _Nvrtc  # noqa: E402

CORE = 128  # bytes of one 8 x 16-byte core matrix

SOURCE = r"""
// element (r, k) of a 64 x 8 K-major tile: core matrix (k / 4, r / 8), row r % 8, word k % 4
__device__ int core_offset(int r, int k) { return ((k / 4) * 8 + r / 8) * 32 + (r % 8) * 4 + k % 4; }

__device__ unsigned long long descriptor(const float* tile, unsigned leading, unsigned stride) {
    const unsigned addr = (unsigned)__cvta_generic_to_shared(tile);
    return (unsigned long long)((addr & 0x3FFFF) >> 4) | ((unsigned long long)(leading >> 4) << 16)
           | ((unsigned long long)(stride >> 4) << 32);  // bits 62-63 = 0: no swizzle
}

extern "C" __global__ void __launch_bounds__(128)
probe(const float* __restrict__ a_g, const float* __restrict__ b_g, float* __restrict__ d_g,
      unsigned leading, unsigned stride) {
    __shared__ __align__(128) float a[64 * 8];
    __shared__ __align__(128) float b[64 * 8];
    for (int i = threadIdx.x; i < 64 * 8; i += 128) {
        a[core_offset(i / 8, i % 8)] = a_g[i];
        b[core_offset(i / 8, i % 8)] = b_g[i];
    }
    __syncthreads();
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");  // generic-proxy stores -> wgmma reads
    float d[32];
    for (int i = 0; i < 32; ++i) d[i] = 0.0f;
    const unsigned long long da = descriptor(a, leading, stride), db = descriptor(b, leading, stride);
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32 "
        "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
        "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, 1, 1, 1;\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db)
        : "memory");
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    const int warp = threadIdx.x / 32, g = (threadIdx.x % 32) / 4, t = threadIdx.x % 4;
    for (int j = 0; j < 8; ++j)
        for (int e = 0; e < 4; ++e)
            d_g[(16 * warp + g + 8 * (e / 2)) * 64 + 8 * j + 2 * t + e % 2] = d[4 * j + e];
}
"""

# (leading, stride) byte offsets: K-direction core-matrix step first, then the other reading.
READINGS = {"leading = K step": (8 * CORE, CORE), "leading = row-group step": (CORE, 8 * CORE)}


def compile_cubin(arch: str = "sm_90a") -> bytes:
    nvrtc = _Nvrtc.for_arch("sm_90")
    prog = nvrtc.create_program(SOURCE, "wgmma_probe.cu")
    try:
        nvrtc.compile_program(prog, [f"-arch={arch}", "-std=c++17"])
        return nvrtc.cubin(prog)
    finally:
        nvrtc.destroy_program(prog)


def main():
    only = sys.argv[1] if len(sys.argv) > 1 else "K step"  # one reading per process: a bad one faults
    cubin = compile_cubin()
    print(f"NVRTC compiled wgmma.mma_async m64n64k8 tf32 for sm_90a: {len(cubin)} bytes of cubin")
    try:
        import cupy
        if cupy.cuda.Device().compute_capability != "90":
            raise RuntimeError("not an sm_90 GPU")
    except Exception as exc:  # no GPU, or not Hopper: the compile is all this machine can show
        print(f"not run: {exc}")
        return
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        kernel = cupy.RawModule(path=f.name).get_function("probe")
    rng = np.random.default_rng(0)
    a = rng.integers(-8, 9, (64, 8)).astype(np.float32)
    b = rng.integers(-8, 9, (64, 8)).astype(np.float32)
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    for what, (leading, stride) in READINGS.items():
        if not what.endswith(only):
            continue
        d = cupy.full((64, 64), np.nan, np.float32)
        kernel((1,), (128,), (cupy.asarray(a), cupy.asarray(b), d, np.uint32(leading), np.uint32(stride)))
        got = cupy.asnumpy(d)
        err = np.abs(got - expected).max()
        print(f"{what} (leading {leading}, stride {stride}): max |D - A B^T| = {err:g}"
              f"{'  <- exact' if err == 0 else ''}", flush=True)


if __name__ == "__main__":
    main()
