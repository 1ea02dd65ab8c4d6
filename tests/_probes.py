"""Small CUDA sources that exercise one device function of kernels/ (compiled by NVRTC
on the CPU; run by the GPU tests and, where they only move words, by _ptx_emulator on
the CPU)."""

import functools

from cupyattn import compile as cc


def compile_probe(source: str, name: str, arch: str = "sm_90") -> tuple[bytes, str, str]:
    """``source``'s kernel ``name`` (a name expression) compiled by NVRTC for ``arch``
    with the kernels' options, no GPU needed: (cubin, PTX, the entry's mangled name).
    Compiled once a process (tests share a probe across their parameters)."""
    return _compiled(cc.hashed_source(source), name, arch)


@functools.cache
def _compiled(source: str, name: str, arch: str) -> tuple[bytes, str, str]:
    # (keyed by the hashed source: an edit of any kernel header is another key)
    nvrtc = cc._Nvrtc.for_arch(arch)
    prog = nvrtc.create_program(source, "probe.cu")
    try:
        nvrtc.add_name_expression(prog, name)
        nvrtc.compile_program(prog, cc._options(nvrtc, arch))
        return nvrtc.cubin(prog), nvrtc.ptx(prog), nvrtc.lowered_name(prog, name)
    finally:
        nvrtc.destroy_program(prog)


CORE_TILE_PROBES = r"""
#include "wgmma_tiles.cuh"
using namespace cupyattn;
// A tile of PARTS parts, R x C words each, into shared memory, through one of
// wgmma_tiles.cuh's shared-memory rearrangements by 128 threads, and back out.
template <int PARTS, int R, int C>
__device__ void tile_in(float* smem, const float* in) {
    for (int i = threadIdx.x; i < PARTS * R * C; i += blockDim.x) smem[i] = in[i];
    __syncthreads();
}
template <int PARTS, int R, int C>
__device__ void tile_out(float* out, const float* smem) {
    __syncthreads();
    for (int i = threadIdx.x; i < PARTS * R * C; i += blockDim.x) out[i] = smem[i];
}
template <int PARTS, int R, int C>
__global__ void transpose_core_probe(const float* in, float* out) {
    extern __shared__ __align__(16) float smem[];
    tile_in<PARTS, R, C>(smem, in);
    transpose_core_tile<PARTS, R, C, 128>(smem + PARTS * R * C, smem);
    tile_out<PARTS, R, C>(out, smem + PARTS * R * C);
}
// The tile as a transposed one: R slots of D_PAD rows d (stage_operand's order).
template <int PARTS, int R, int D_PAD>
__global__ void zero_rows_probe(const float* in, float* out, int from) {
    extern __shared__ __align__(16) float smem[];
    tile_in<PARTS, R, D_PAD>(smem, in);
    zero_transposed_rows<PARTS, R, D_PAD, 128>(smem, from);
    tile_out<PARTS, R, D_PAD>(out, smem);
}
"""
