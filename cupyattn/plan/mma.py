"""The mma.sync tensor-core kernels' configurations (sm_80+), their layouts and the
register rules that keep out the tiles ptxas would spill."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from ..device import DeviceSpec
from ..layout import DTYPE_BYTES, Layout, LayoutBuilder
from .problem import CXX_TYPES, MMA_OPS, STAGED_DTYPES, d_split_of, mma_head_dim_pad

_ROW_PAD_NOTE = "+16 bytes per row: the 8 rows of an ldmatrix phase hit 8 bank groups"


def _by_capability(table: dict, compute_capability: tuple[int, int]):
    """The value of ``table`` ({lowest compute capability: value}) for this capability, or None."""
    return max(((cc, v) for cc, v in table.items() if cc <= compute_capability), default=(None, None))[1]


@dataclasses.dataclass(frozen=True)
class MmaConfig:
    """Fields shared by the tensor-core kernels' template parameters, in template order
    (sm_80+, head_dim == head_dim_v): the inputs' dtype, the precision mode (its
    operand policy, e.g. ``cupyattn::MmaTf32<3>``), then the tile."""

    KERNEL: ClassVar[str]
    LAYOUT: ClassVar[str]
    HEADER: ClassVar[str]
    STAGES: ClassVar[int] = 2

    dtype: str
    precision: str  # PRECISIONS; the dtype's own mode for float16 / bfloat16
    head_dim_pad: int  # multiple of 16 (the mma k-step)
    block_m: int  # query rows per tile
    block_n: int  # keys per tile
    num_warps: int
    causal: bool

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @classmethod
    def head_dim_pad_for(cls, head_dim: int, block_m: int, block_n: int, num_warps: int) -> int:
        """The padded head dim (a template parameter) of this kernel's tile for ``head_dim``."""
        return mma_head_dim_pad(head_dim)

    @staticmethod
    def runs_on(device: DeviceSpec, dtype: str, precision: str) -> bool:
        """Whether the kernel exists for this device and mode beyond ``mma_eligible``
        (every sm_80+ GPU but for architecture-specific kernels)."""
        return True

    @property
    def float32_mode(self) -> str | None:
        """The precision mode of float32 inputs; None for float16 / bfloat16 inputs
        (whose mode is their own), so per-mode rules below cannot catch them."""
        return self.precision if self.dtype == "float32" else None

    @property
    def staged_dtype(self) -> str:
        """The dtype of the operand tiles in shared memory."""
        return STAGED_DTYPES[self.precision]

    @functools.cached_property
    def name_expression(self) -> str:
        causal = "true" if self.causal else "false"
        return (
            f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {MMA_OPS[self.precision]}, {self.head_dim_pad}, "
            f"{self.block_m}, {self.block_n}, {self.num_warps}, {causal}>"
        )

    @property
    def layout_expression(self) -> str:
        return f"{self.LAYOUT}<{CXX_TYPES[self.staged_dtype]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}>"

    def _tile(self, builder: LayoutBuilder, name: str, rows: int, stages: int = 1) -> LayoutBuilder:
        staged = self.staged_dtype
        row = self.head_dim_pad + 16 // DTYPE_BYTES[staged]
        note = _ROW_PAD_NOTE
        if staged != self.dtype:
            note = f"{self.dtype} staged as {staged}; {note}"
        if stages == 1:
            return builder.add(name, (rows, row), staged, note)
        return builder.add(name, (stages, rows, row), staged, f"{stages} pipeline stages; {note}")

    @property
    def valid(self) -> bool:
        """Whether the template's static_asserts accept these parameters."""
        return True

    @property
    def accumulators_per_lane(self) -> int:
        """float32 accumulators each lane keeps in registers (a 16 x n tile: n / 2)."""
        raise NotImplementedError

    # float32 accumulators per lane that compile without spills, by architecture
    # (scripts/spill_map.py: every candidate at head dims 32..256 through ptxas);
    # ptxas needs ~60-90 registers more for fragments, addresses and masks.
    BUDGET_SM80: ClassVar[int] = 160  # sm_80 - sm_89
    BUDGET_SM90: ClassVar[int] = 160
    BUDGET_SM100: ClassVar[int] = 160  # sm_100 and newer

    # Caps for the float32 modes that need more registers per accumulator (3xTF32 keeps
    # each fragment as two TF32 parts; staged float32 -> half loads go through registers):
    # {mode: {lowest compute capability: cap}}, the fewest spilling accumulators less a step.
    PRECISION_BUDGETS: ClassVar[dict] = {}

    def register_budget(self, compute_capability: tuple[int, int]) -> int:
        if compute_capability >= (10, 0):
            budget = self.BUDGET_SM100
        else:
            budget = self.BUDGET_SM90 if compute_capability >= (9, 0) else self.BUDGET_SM80
        cap = _by_capability(self.PRECISION_BUDGETS.get(self.float32_mode, {}), compute_capability)
        return budget if cap is None else min(budget, cap)

    # Head dims above which every 3xTF32 tile of the kernel spills though some accumulator
    # count admits one ({lowest compute capability: head dim}): near 255 registers ptxas's
    # spills follow no count (tests/test_compile.py compiles the planned ones).
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {}

    # TF32 modes spill at every tile on sm_100 / sm_120: those backward kernels run on CUDA cores.
    TF32_SPILLS_SM100: ClassVar[bool] = False

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        """Why this tile would spill registers on that architecture, or None if it fits."""
        major, minor = compute_capability
        if self.TF32_SPILLS_SM100 and compute_capability >= (10, 0) and self.float32_mode in ("fp32", "tf32"):
            return f"the TF32 ({self.precision}) kernel spills at every tile on sm_{major}{minor}"
        limit = _by_capability(self.FP32_MAX_HEAD_DIM, compute_capability)
        if self.float32_mode == "fp32" and limit is not None and self.head_dim_pad > limit:
            return f"the 3xTF32 kernel spills at every tile above head dim {limit} on sm_{major}{minor}"
        budget = self.register_budget(compute_capability)
        load, what = self.register_load
        if load <= budget:
            return None
        return f"{load} {what}, over the spill-free budget of {budget} on sm_{major}{minor}"

    @property
    def register_load(self) -> tuple[int, str]:
        """(count, what it counts) that the register budget bounds: the accumulators per
        lane, unless a precision mode weighs some of them more."""
        return self.accumulators_per_lane, "float32 accumulators per lane"

    def fits_registers(self, compute_capability: tuple[int, int]) -> bool:
        return self.register_reason(compute_capability) is None


@dataclasses.dataclass(frozen=True)
class FwdMmaConfig(MmaConfig):
    """``attn_fwd_mma``: forward on tensor cores (kernels/attn_fwd_mma.cuh); each warp
    owns ``m_tiles`` x 16 query rows."""

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_mma"
    LAYOUT: ClassVar[str] = "cupyattn::FwdMmaLayout"
    HEADER: ClassVar[str] = "attn_fwd_mma.cuh"

    @property
    def m_tiles(self) -> int:
        return self.block_m // (16 * self.num_warps)

    @property
    def valid(self) -> bool:
        return self.m_tiles >= 1 and self.block_m == 16 * self.m_tiles * self.num_warps

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        b = self._tile(LayoutBuilder(), "q_tile", self.block_m)
        b = self._tile(b, "k_tile", self.block_n, self.STAGES)
        return self._tile(b, "v_tile", self.block_n, self.STAGES).build()

    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 96, (9, 0): 104, (10, 0): 96}}
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {(10, 0): 160}

    @property
    def accumulators_per_lane(self) -> int:  # O (head_dim) and S (block_n) per 16-row m-tile
        return self.m_tiles * (self.head_dim_pad + self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        if self.m_tiles == 1:
            return super().register_reason(compute_capability)
        # Two m-tiles: the scores' exp2 and mask temporaries count twice; on sm_100 /
        # sm_120 two m-tiles spill above head dim 96.
        major, minor = compute_capability
        fp32 = self.float32_mode == "fp32"
        if compute_capability >= (10, 0) and (self.head_dim_pad > 96 or fp32):
            return (
                f"two 16-row m-tiles per warp spill {'in 3xTF32' if fp32 else 'above head dim 96'} on sm_{major}{minor}"
            )
        weighted = self.m_tiles * (self.head_dim_pad + 2 * self.block_n) // 2
        limit = 128 if fp32 else 192  # 3xTF32: (64, 128, 64, 4) spills above 128
        if weighted > limit:
            return (
                f"two 16-row m-tiles per warp: {weighted} accumulators per lane counting the "
                f"scores twice, over the spill-free budget of {limit}"
            )
        return None


@dataclasses.dataclass(frozen=True)
class BwdDkdvMmaConfig(MmaConfig):
    """``attn_bwd_dkdv_mma``: dK and dV for a tile of keys on tensor cores
    (kernels/attn_bwd_mma.cuh); 16 keys per warp, ``d_split`` warps share them."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dkdv_mma"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDkdvMmaLayout"
    HEADER: ClassVar[str] = "attn_bwd_mma.cuh"

    @property
    def d_split(self) -> int:
        return d_split_of(self.num_warps, self.block_n)

    @property
    def work_split(self) -> str | None:
        """How the block's warps share its keys, where not one owner each (explain shows it)."""
        if self.d_split == 1:
            return None
        return (
            f"two warps share each 16 keys, each keeping dK's and dV's {self.head_dim_pad // 2} of "
            f"{self.head_dim_pad} columns; both compute S^T and dP^T"
        )

    @property
    def valid(self) -> bool:
        return (
            self.block_n % 16 == 0
            and self.num_warps * 16 == self.block_n * self.d_split
            and self.head_dim_pad % (16 * self.d_split) == 0
            and self.block_m % 16 == 0
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        b = self._tile(LayoutBuilder(), "k_tile", self.block_n)
        b = self._tile(b, "v_tile", self.block_n)
        b = self._tile(b, "q_tile", self.block_m, self.STAGES)
        b = self._tile(b, "do_tile", self.block_m, self.STAGES)
        return (
            b.add("lse_tile", (self.STAGES, self.block_m), "float32", "lse * log2(e) per query row")
            .add("delta_tile", (self.STAGES, self.block_m), "float32", "rowsum(dO * O) per query row")
            .build()
        )

    BUDGET_SM90: ClassVar[int] = 192  # (64, 64, 4) at head dim 128 fits in 255 registers
    BUDGET_SM100: ClassVar[int] = 80
    # 3xTF32 counts S^T and dP^T twice (register_load); staged halves spill from 192.
    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 144}, "bf16": {(8, 0): 160}, "fp16": {(8, 0): 160}}
    TF32_SPILLS_SM100: ClassVar[bool] = True

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim / d_split each), S^T and dP^T (block_m each)
        return self.head_dim_pad // self.d_split + self.block_m

    @property
    def register_load(self) -> tuple[int, str]:
        if self.float32_mode != "fp32":
            return super().register_load
        return (
            self.head_dim_pad // self.d_split + 2 * self.block_m,
            "float32 accumulators per lane counting S^T and dP^T twice (3xTF32)",
        )


@dataclasses.dataclass(frozen=True)
class BwdDqMmaConfig(MmaConfig):
    """``attn_bwd_dq_mma``: dQ for a tile of query rows on tensor cores (kernels/attn_bwd_mma.cuh);
    16 query rows per warp."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dq_mma"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDqMmaLayout"
    HEADER: ClassVar[str] = "attn_bwd_mma.cuh"

    @property
    def valid(self) -> bool:
        return self.block_m == 16 * self.num_warps and self.block_n % 16 == 0

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        b = self._tile(LayoutBuilder(), "q_tile", self.block_m)
        b = self._tile(b, "do_tile", self.block_m)
        b = self._tile(b, "k_tile", self.block_n, self.STAGES)
        return self._tile(b, "v_tile", self.block_n, self.STAGES).build()

    BUDGET_SM100: ClassVar[int] = 112
    # 3xTF32 counts S and dP one and a half times (register_load).
    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 128, (9, 0): 144}}
    TF32_SPILLS_SM100: ClassVar[bool] = True
    # The smallest tile spills from these head dims although larger tiles below them do not.
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {(8, 0): 192, (9, 0): 208}

    @property
    def accumulators_per_lane(self) -> int:  # dQ (head_dim), S and dP (block_n each)
        return (self.head_dim_pad + 2 * self.block_n) // 2

    @property
    def register_load(self) -> tuple[int, str]:
        if self.float32_mode != "fp32":
            return super().register_load
        return (
            (self.head_dim_pad + 3 * self.block_n) // 2,
            "float32 accumulators per lane counting S and dP one and a half times (3xTF32)",
        )
