"""The Hopper forward for float16 / bfloat16 inputs on warpgroup MMA with TMA-loaded tiles
(kernels/attn_fwd_wgmma_half.cuh, after FlashAttention-3): its configuration, shared-memory
layout and where it applies."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from ..device import DeviceSpec
from ..layout import Layout, LayoutBuilder
from .mma import MmaConfig
from .problem import CXX_TYPES

SWIZZLE_ALIGN = 1024  # a 128-byte-swizzled chunk's base (the swizzle reads address bits 7-9)
PRODUCER_REGISTERS = 24  # setmaxnreg: 128 x 24 + 256 x 240 <= 65536
CONSUMER_REGISTERS = 240


@dataclasses.dataclass(frozen=True)
class FwdWgmmaHalfConfig(MmaConfig):
    """``attn_fwd_wgmma_half``: the forward for float16 / bfloat16 on sm_90a. Two consumer
    warpgroups (``num_warps`` = 8) own 64 query rows each; a producer warpgroup issues the
    TMA copies of Q, K and V into 128-byte-swizzled tiles (64-column chunks, zeros past
    head_dim) through ``stages`` pipeline stages of K and V. ``pingpong``: the two consumer
    warpgroups take turns issuing their wgmmas (named barriers), one's softmax beside the
    other's products."""

    pingpong: bool = True

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_wgmma_half"
    LAYOUT: ClassVar[str] = "cupyattn::FwdWgmmaHalfLayout"
    HEADER: ClassVar[str] = "attn_fwd_wgmma_half.cuh"
    ARCH_SUFFIX: ClassVar[str] = "a"  # sm_90 -> sm_90a (wgmma, setmaxnreg)
    # The tile is the warpgroups' (64 rows each), not a size the planner shrinks to short
    # queries (_mma_candidates' cap on block_m).
    FIXED_BLOCK_M: ClassVar[bool] = True
    TMA_MAPS: ClassVar[bool] = True  # a second argument: the TMA maps of q, k, v (cupyattn/tma.py)

    @staticmethod
    def runs_on(device: DeviceSpec, dtype: str, precision: str) -> bool:
        return device.compute_capability == (9, 0) and dtype in ("float16", "bfloat16")

    @functools.cached_property
    def name_expression(self) -> str:
        causal = "true" if self.causal else "false"
        return (
            f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}, "
            f"{self.num_warps}, {causal}, {'true' if self.pingpong else 'false'}>"
        )

    @property
    def layout_expression(self) -> str:
        return f"{self.LAYOUT}<{CXX_TYPES[self.dtype]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}>"

    @property
    def threads(self) -> int:
        return self.num_warps * 32 + 128  # and the producer warpgroup

    @property
    def d_chunks(self) -> int:
        """64-column chunks of a swizzled tile (the TMA box is 64 columns wide)."""
        return -(-self.head_dim_pad // 64)

    @property
    def stages(self) -> int:
        """K/V pipeline stages (FwdWgmmaHalfLayout::STAGES): three where a tile is one chunk."""
        return 3 if self.d_chunks == 1 else 2

    @property
    def valid(self) -> bool:
        return (
            self.dtype in ("float16", "bfloat16")
            and self.num_warps % 4 == 0
            and self.block_m == 16 * self.num_warps
            and self.block_n in (64, 80, 96, 128, 176, 192, 256)  # WgmmaHalf's n-sizes
            and self.head_dim_pad % 16 == 0
            and (not self.pingpong or self.num_warps == 8)
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        c, m, n, s = self.d_chunks, self.block_m, self.block_n, self.stages
        swz = "128-byte swizzled 64-column chunks written by the TMA (zeros past head_dim and the sequence)"
        return (
            LayoutBuilder()
            .add("q_tile", (c, m, 64), self.dtype, swz, align=SWIZZLE_ALIGN)
            .add("k_tiles", (s, c, n, 64), self.dtype, f"{s} pipeline stages; {swz}", align=SWIZZLE_ALIGN)
            .add("v_tiles", (s, c, n, 64), self.dtype, f"{s} pipeline stages; {swz}", align=SWIZZLE_ALIGN)
            .add(
                "barriers",
                (1 + 4 * s,),
                "uint64",
                "mbarriers: Q landed; per stage K, V landed; K, V free again (each consumer warp arrives)",
            )
            .build()
        )

    @property
    def work_split(self) -> str | None:
        return (
            f"a producer warpgroup ({PRODUCER_REGISTERS} registers a thread, setmaxnreg) whose first "
            f"thread issues the TMA copies of Q, K and V; {self.num_warps // 4} consumer warpgroups "
            f"({CONSUMER_REGISTERS} registers) of 64 query rows each: S = Q K^T (wgmma, both from shared "
            f"memory), the online softmax, O += P V (wgmma, P from registers)"
            + ("; they take turns issuing their wgmmas (ping-pong)" if self.pingpong else "")
        )

    @property
    def accumulators_per_lane(self) -> int:  # O (64-column chunks), S, and P packed (half of S)
        return (64 * self.d_chunks + self.block_n + self.block_n // 2) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # Every listed tile at head dims 8-256 compiles without spills (tests/test_compile.py).
        return None
