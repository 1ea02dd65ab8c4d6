"""What planning takes in: the precision modes, the problem a call poses, head-dim
padding, and how many blocks of a size an SM holds."""

from __future__ import annotations

import dataclasses

from ..device import DeviceSpec

CXX_TYPES = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16"}
MAX_HEAD_DIM = 256

# Precision modes: how the tensor-core kernels hold and multiply operands (float32
# accumulation always). float16 / bfloat16 inputs have their own mode; float32
# inputs may take any of the four (``attention(..., precision=)``):
#   "fp32"  3xTF32: each operand split into two TF32 parts, three mma per product;
#           float32-level accuracy. CUDA cores (FFMA) where there are no tensor cores.
#   "tf32"  one TF32 pass (10-bit mantissa operands).
#   "bf16", "fp16"  operands staged in shared memory as bfloat16 / float16 (half
#           the shared memory of float32), float32 in and out.
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PRECISION_TEXT = {
    "fp32": "3xTF32 (float32 accuracy)",
    "tf32": "one TF32 pass",
    "bf16": "bfloat16 operands",
    "fp16": "float16 operands",
}
NATIVE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# The operand policy (kernels/mma.cuh) and shared-memory dtype of each mode.
MMA_OPS = {
    "fp16": "cupyattn::MmaHalf<__half>",
    "bf16": "cupyattn::MmaHalf<__nv_bfloat16>",
    "tf32": "cupyattn::MmaTf32<1>",
    "fp32": "cupyattn::MmaTf32<3>",
}
STAGED_DTYPES = {"fp16": "float16", "bf16": "bfloat16", "tf32": "float32", "fp32": "float32"}


def parse_precision(precision, dtype: str) -> tuple[str, ...]:
    """The modes ``precision`` allows for inputs of ``dtype``, most preferred first.

    None: the dtype's own mode ("fp32" for float32). A mode name, or a sequence of
    them (the planner takes the first that runs on tensor cores on the device, else
    the first). float16 / bfloat16 inputs allow only their own mode.
    """
    native = NATIVE_PRECISION[dtype]
    if precision is None:
        return (native,)
    modes = (precision,) if isinstance(precision, str) else tuple(precision)
    if not modes or any(m not in PRECISIONS for m in modes):
        raise ValueError(f"precision: expected None, one of {PRECISIONS} or a sequence of them, got {precision!r}")
    if dtype != "float32" and modes != (native,):
        raise ValueError(
            f"precision: {dtype} inputs compute with {native!r} operands; got {precision!r} "
            "(precision modes apply to float32 inputs)"
        )
    return tuple(dict.fromkeys(modes))


def pad_head_dim(d: int) -> int:
    """Head dims are padded to a multiple of 8 in shared memory (zero-filled)."""
    return max(8, (int(d) + 7) // 8 * 8)


def mma_head_dim_pad(head_dim: int) -> int:
    """Tensor-core kernels pad the head dim to a multiple of 16 (their k-steps)."""
    return (head_dim + 15) // 16 * 16


def d_split_of(num_warps: int, owned_rows: int) -> int:
    """How many warps (or warpgroups) share each 16 (64) rows a backward tile owns: 1, or
    2 where a pair each keeps half of the head dim's columns (``d_split`` tiles)."""
    return max(1, num_warps * 16 // owned_rows)


def d_split_head_dim_pad(head_dim: int, d_split: int) -> int:
    """A pair takes half of the head dim each in whole 16-column tiles: padded to a
    multiple of 32 where d_split is 2, else to the tensor cores' 16."""
    return (head_dim + 31) // 32 * 32 if d_split >= 2 else mma_head_dim_pad(head_dim)


@dataclasses.dataclass(frozen=True)
class AttentionProblem:
    """What a call asks for, reduced to what planning needs."""

    dtype: str  # float32 / float16 / bfloat16
    head_dim: int
    head_dim_v: int
    causal: bool
    batch: int = 1
    heads_q: int = 1
    heads_kv: int = 1
    seqlen_q: int = 1024
    seqlen_k: int = 1024
    # q, k, v and out rows start on 16-byte boundaries (pointers and batch/seq/head
    # strides): the tensor-core kernels copy rows with 16-byte cp.async.
    aligned: bool = True
    # Allowed precision modes, most preferred first (parse_precision); () = the dtype's own.
    precision: tuple[str, ...] = ()
    # The backward must be bitwise reproducible (no float32 atomics: a dQ pass of its own).
    deterministic: bool = True
    # TMA maps can describe q, k and v (tma.describable: 16-byte aligned base, byte strides
    # multiples of 16, non-negative, below 2^40): the float16 / bfloat16 wgmma forward.
    tma: bool = True

    def __post_init__(self):
        if self.dtype not in CXX_TYPES:
            raise ValueError(f"dtype: expected one of {sorted(CXX_TYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "precision", parse_precision(self.precision or None, self.dtype))
        for name in ("head_dim", "head_dim_v"):
            d = getattr(self, name)
            if not 1 <= d <= MAX_HEAD_DIM:
                raise ValueError(f"{name}: expected 1..{MAX_HEAD_DIM}, got {d}")


def mma_eligible(problem: AttentionProblem, device: DeviceSpec) -> bool:
    """Whether the tensor-core kernels can run this problem on this device: sm_80+,
    head_dim == head_dim_v, a multiple of 8, 16-byte aligned rows (every precision
    mode, float32 inputs included)."""
    return (
        device.compute_capability >= (8, 0)
        and problem.head_dim == problem.head_dim_v
        and problem.head_dim % 8 == 0
        and problem.aligned
    )


def blocks_per_sm(smem_bytes: int, threads: int, device: DeviceSpec) -> int:
    by_smem = device.smem_per_sm // (smem_bytes + device.smem_reserved_per_block)
    by_threads = device.max_threads_per_sm // threads
    return max(0, min(by_smem, by_threads, device.max_blocks_per_sm))
