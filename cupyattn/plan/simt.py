"""The CUDA-core (SIMT) kernels' configurations and layouts: float32 FFMA on every GPU,
the fallback for what the tensor cores cannot run; and the backward's delta launch."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from ..layout import DTYPE_BYTES, Layout, LayoutBuilder
from .problem import CXX_TYPES

# float32 accumulators a lane may keep: past 32 (8 rows at head dim 256) ptxas needs
# ~168 registers for sm_90 and spilled without a minimum-blocks launch bound.
MAX_ACCUMULATORS_PER_LANE = 32

_PADDED = "+1 word per row: lanes read it by column without bank conflicts"


@dataclasses.dataclass(frozen=True)
class SimtConfig:
    """Fields shared by the SIMT kernels' template parameters, in template order."""

    KERNEL: ClassVar[str]
    LAYOUT: ClassVar[str]
    HEADER: ClassVar[str]

    dtype: str
    head_dim_pad: int
    head_dim_v_pad: int
    block_m: int  # query rows per tile
    block_n: int  # keys per tile
    num_warps: int
    causal: bool

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def vec(self) -> int:
        """Elements per 4-byte word, the unit of shared-memory row padding."""
        return 4 // DTYPE_BYTES[self.dtype]

    @property
    def _cxx_type(self) -> str:
        return CXX_TYPES[self.dtype]

    @functools.cached_property
    def name_expression(self) -> str:
        causal = "true" if self.causal else "false"
        return (
            f"{self.KERNEL}<{self._cxx_type}, {self.head_dim_pad}, {self.head_dim_v_pad}, "
            f"{self.block_m}, {self.block_n}, {self.num_warps}, {causal}>"
        )

    @property
    def layout_expression(self) -> str:
        return (
            f"{self.LAYOUT}<{self._cxx_type}, {self.head_dim_pad}, {self.head_dim_v_pad}, "
            f"{self.block_m}, {self.block_n}>"
        )

    def _words_per_lane(self, dim_pad: int) -> int:
        return -(-(dim_pad // self.vec) // 32)

    @property
    def accumulators_per_lane(self) -> int:
        """float32 output accumulators each lane keeps in registers."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class FwdSimtConfig(SimtConfig):
    """``attn_fwd_simt``: forward on CUDA cores, float32 accumulation (kernels/attn_fwd_simt.cuh)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_simt"
    LAYOUT: ClassVar[str] = "cupyattn::FwdSimtLayout"
    HEADER: ClassVar[str] = "attn_fwd_simt.cuh"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return (
            LayoutBuilder()
            .add("q_tile", (self.block_m, self.head_dim_pad), self.dtype)
            .add("k_tile", (self.block_n, self.head_dim_pad + self.vec), self.dtype, _PADDED)
            .add("v_tile", (self.block_n, self.head_dim_v_pad), self.dtype)
            .build()
        )

    @property
    def accumulators_per_lane(self) -> int:  # O for block_m / num_warps rows
        return self.block_m // self.num_warps * self._words_per_lane(self.head_dim_v_pad) * self.vec


@dataclasses.dataclass(frozen=True)
class BwdDkdvSimtConfig(SimtConfig):
    """``attn_bwd_dkdv_simt``: dK and dV for a tile of keys (kernels/attn_bwd_simt.cuh)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dkdv_simt"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDkdvSimtLayout"
    HEADER: ClassVar[str] = "attn_bwd_simt.cuh"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return (
            LayoutBuilder()
            .add("k_tile", (self.block_n, self.head_dim_pad), self.dtype)
            .add("v_tile", (self.block_n, self.head_dim_v_pad), self.dtype)
            .add("q_tile", (self.block_m, self.head_dim_pad + self.vec), self.dtype, _PADDED)
            .add("do_tile", (self.block_m, self.head_dim_v_pad + self.vec), self.dtype, _PADDED)
            .build()
        )

    @property
    def accumulators_per_lane(self) -> int:  # dK and dV for block_n / num_warps keys
        words = self._words_per_lane(self.head_dim_pad) + self._words_per_lane(self.head_dim_v_pad)
        return self.block_n // self.num_warps * words * self.vec


@dataclasses.dataclass(frozen=True)
class BwdDqSimtConfig(SimtConfig):
    """``attn_bwd_dq_simt``: dQ for a tile of query rows (kernels/attn_bwd_simt.cuh)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dq_simt"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDqSimtLayout"
    HEADER: ClassVar[str] = "attn_bwd_simt.cuh"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return (
            LayoutBuilder()
            .add("q_tile", (self.block_m, self.head_dim_pad), self.dtype)
            .add("do_tile", (self.block_m, self.head_dim_v_pad), self.dtype)
            .add("k_tile", (self.block_n, self.head_dim_pad + self.vec), self.dtype, _PADDED)
            .add("v_tile", (self.block_n, self.head_dim_v_pad + self.vec), self.dtype, _PADDED)
            .build()
        )

    @property
    def accumulators_per_lane(self) -> int:  # dQ for block_m / num_warps rows
        return self.block_m // self.num_warps * self._words_per_lane(self.head_dim_pad) * self.vec


@dataclasses.dataclass(frozen=True)
class BwdDqConvertConfig:
    """``attn_bwd_dq_convert``: dq = scale * the fused pass's float32 dQ accumulator,
    rounded to dq's dtype (float16 / bfloat16); a block a 64-row tile, through static shared
    memory so that its reads and its writes both are whole sectors."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dq_convert"
    HEADER: ClassVar[str] = "attn_bwd_wgmma_half.cuh"
    STATIC_SMEM_BYTES: ClassVar[int] = 64 * (2 * 64 + 8) * 4  # the kernel's rows[64 * STRIDE]

    dtype: str
    num_warps: int = 8

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def name_expression(self) -> str:
        return f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {self.num_warps}>"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return Layout(())


@dataclasses.dataclass(frozen=True)
class BwdDeltaConfig:
    """``attn_bwd_delta``: delta = rowsum(dO * O), a warp per ``rows_per_warp`` rows (their
    loads in flight together), no shared memory."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_delta"
    HEADER: ClassVar[str] = "attn_bwd_simt.cuh"

    dtype: str
    num_warps: int = 8
    rows_per_warp: int = 4

    @property
    def threads(self) -> int:
        return self.num_warps * 32

    @property
    def rows_per_block(self) -> int:
        return self.num_warps * self.rows_per_warp

    @property
    def name_expression(self) -> str:
        return f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {self.num_warps}, {self.rows_per_warp}>"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return Layout(())


@dataclasses.dataclass(frozen=True)
class BwdDeltaWgmmaHalfConfig(BwdDeltaConfig):
    """``attn_bwd_delta_wgmma_half``: delta as ``attn_bwd_delta``'s, and for the float16 /
    bfloat16 wgmma dK/dV pass of ``block_m`` query rows a tile, lse * log2(e) and delta again
    in rows padded with zeros to whole tiles (``padded_rows``): the pass's producer brings each
    tile's with two bulk copies."""

    block_m: int = 64

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_delta_wgmma_half"
    HEADER: ClassVar[str] = "attn_bwd_wgmma_half.cuh"

    def padded_rows(self, seqlen_q: int) -> int:
        """Rows a (batch, query head) has in the padded copies (kernel: padded_query_rows)."""
        return -(-seqlen_q // self.block_m) * self.block_m
