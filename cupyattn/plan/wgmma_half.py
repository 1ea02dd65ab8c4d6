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
# Head dims up to this compile without spills on three consumer warpgroups (tests/test_compile.py).
FORWARD_THREE_WARPGROUP_MAX_HEAD_DIM = 64
# float32 accumulators (packed operands counted as such) a backward consumer thread keeps
# without spills in CONSUMER_REGISTERS (tests/test_compile.py compiles the planned tiles).
CONSUMER_ACCUMULATORS = 224
_SWIZZLED = "128-byte swizzled 64-column chunks written by the TMA (zeros past head_dim and the sequence)"


class WgmmaHalfConfig(MmaConfig):
    """What the float16 / bfloat16 wgmma kernels share: sm_90a, TMA maps of their inputs as
    the last argument (cupyattn/tma.py), a producer warpgroup beside ``num_warps`` consumer
    warps, 128-byte-swizzled tiles of 64-column chunks."""

    ARCH_SUFFIX: ClassVar[str] = "a"  # sm_90 -> sm_90a (wgmma, setmaxnreg)
    TMA_MAPS: ClassVar[bool] = True

    @staticmethod
    def runs_on(device: DeviceSpec, dtype: str, precision: str) -> bool:
        return device.compute_capability == (9, 0) and dtype in ("float16", "bfloat16")

    @functools.cached_property
    def name_expression(self) -> str:
        causal = "true" if self.causal else "false"
        return (
            f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}, "
            f"{self.num_warps}, {causal}>"
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

    def _swizzled(self, builder: LayoutBuilder, name: str, rows: int, stages: int = 0) -> LayoutBuilder:
        """A tile of ``rows`` rows as swizzled chunks (``stages`` pipeline stages of it)."""
        shape = (self.d_chunks, rows, 64)
        if stages:
            return builder.add(
                name, (stages, *shape), self.dtype, f"{stages} pipeline stages; {_SWIZZLED}", align=SWIZZLE_ALIGN
            )
        return builder.add(name, shape, self.dtype, _SWIZZLED, align=SWIZZLE_ALIGN)


@dataclasses.dataclass(frozen=True)
class FwdWgmmaHalfConfig(WgmmaHalfConfig):
    """``attn_fwd_wgmma_half``: the forward for float16 / bfloat16 on sm_90a. Two or three
    consumer warpgroups (``num_warps`` = 8 or 12) own 64 query rows each; a producer
    warpgroup issues the TMA copies of Q, K and V into 128-byte-swizzled tiles (64-column
    chunks, zeros past head_dim) through ``stages`` pipeline stages of K and V.
    ``pingpong``: two consumer warpgroups take turns issuing their wgmmas (named barriers),
    one's softmax beside the other's products (three take no turns)."""

    pingpong: bool = True

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_wgmma_half"
    LAYOUT: ClassVar[str] = "cupyattn::FwdWgmmaHalfLayout"
    HEADER: ClassVar[str] = "attn_fwd_wgmma_half.cuh"
    # The tile is the warpgroups' (64 rows each), not a size the planner shrinks to short
    # queries (_mma_candidates' cap on block_m).
    FIXED_BLOCK_M: ClassVar[bool] = True

    @functools.cached_property
    def name_expression(self) -> str:
        return f"{super().name_expression[:-1]}, {'true' if self.takes_turns else 'false'}>"

    @property
    def takes_turns(self) -> bool:
        """Ping-pong, where there are two consumer warpgroups to take turns."""
        return self.pingpong and self.num_warps == 8

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
            and self.num_warps in (8, 12)
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        m, n, s = self.block_m, self.block_n, self.stages
        b = self._swizzled(LayoutBuilder(), "q_tile", m)
        b = self._swizzled(b, "k_tiles", n, s)
        return (
            self._swizzled(b, "v_tiles", n, s)
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
            f"({self.consumer_registers} registers) of 64 query rows each: S = Q K^T (wgmma, both from shared "
            f"memory), the online softmax, O += P V (wgmma, P from registers)"
            + ("; they take turns issuing their wgmmas (ping-pong)" if self.takes_turns else "")
        )

    @property
    def accumulators_per_lane(self) -> int:  # O (64-column chunks), S, and P packed (half of S)
        return (64 * self.d_chunks + self.block_n + self.block_n // 2) // 2

    @property
    def consumer_registers(self) -> int:
        """What the producer warpgroup leaves of the 64K registers, a multiple of 8 (the
        kernel's setmaxnreg): 240 for two consumer warpgroups, 160 for three."""
        return (65536 - 128 * PRODUCER_REGISTERS) // (32 * self.num_warps) // 8 * 8

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # Every listed two-warpgroup tile at head dims 8-256 compiles without spills (tests/test_compile.py).
        if self.num_warps == 12 and self.head_dim_pad > FORWARD_THREE_WARPGROUP_MAX_HEAD_DIM:
            return (
                f"three consumer warpgroups of {self.consumer_registers} registers spill past head dim "
                f"{FORWARD_THREE_WARPGROUP_MAX_HEAD_DIM}"
            )
        return None


_HALF_N = (32, 64, 80, 96, 128, 176, 192, 256)  # WgmmaHalf's n-sizes (kernels/wgmma_half.cuh)


class _BwdWgmmaHalf(WgmmaHalfConfig):
    """The two backward passes: TMA maps of q, k, v and dout (tma.BWD_TMA_MAPS)."""

    HEADER: ClassVar[str] = "attn_bwd_wgmma_half.cuh"
    STAGES: ClassVar[int] = 2  # BWD_HALF_STAGES

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        load = self.accumulators_per_lane
        if load > CONSUMER_ACCUMULATORS:
            return f"{load} float32 accumulators per lane, over the {CONSUMER_ACCUMULATORS} a consumer keeps"
        return None


@dataclasses.dataclass(frozen=True)
class BwdDkdvWgmmaHalfConfig(_BwdWgmmaHalf):
    """``attn_bwd_dkdv_wgmma_half``: dK and dV for ``block_n`` keys on sm_90a; consumer
    warpgroups of 64 keys each (``d_split`` 2: two share them, each keeping half of dK's
    and dV's columns, see ``split_scores``); Q and dO tiles of ``block_m`` query rows
    through two stages."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dkdv_wgmma_half"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDkdvWgmmaHalfLayout"

    @property
    def d_split(self) -> int:
        return max(1, self.num_warps // 4 // max(1, self.block_n // 64))

    @property
    def split_scores(self) -> bool:
        """Whether the two warpgroups sharing 64 keys (``d_split`` 2) split each query tile's
        S^T and dP^T, half the queries each, and exchange P^T and dS^T through shared tiles
        (kernel: SPLIT_SCORES), rather than both computing all of them."""
        return self.d_split == 2

    @property
    def layout_expression(self) -> str:
        if not self.split_scores:
            return super().layout_expression
        return super().layout_expression.replace("BwdDkdvWgmmaHalfLayout", "BwdDkdvSplitWgmmaHalfLayout")

    @property
    def valid(self) -> bool:
        wgs, key_wgs = self.num_warps // 4, self.block_n // 64
        return (
            self.dtype in ("float16", "bfloat16")
            and self.num_warps % 4 == 0
            and self.block_n % 64 == 0
            and key_wgs >= 1
            and wgs % key_wgs == 0
            and self.d_split <= 2
            and (self.d_split == 1 or (key_wgs == 1 and self.block_m == 64))  # one pair, 64-query tiles
            and self.d_chunks % self.d_split == 0
            and 64 * self.d_chunks // self.d_split in _HALF_N
            and self.block_m // self.d_split in _HALF_N
            and self.block_m % 16 == 0
            and self.head_dim_pad % 16 == 0
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return self._builder().build()

    def _builder(self) -> LayoutBuilder:
        m, n, s = self.block_m, self.block_n, self.STAGES
        b = self._swizzled(LayoutBuilder(), "k_tile", n)
        b = self._swizzled(b, "v_tile", n)
        b = self._swizzled(b, "q_tiles", m, s)
        b = (
            self._swizzled(b, "do_tiles", m, s)
            .add("lse_tiles", (s, m), "float32", "lse * log2(e) per query row (bulk copy of the delta launch's rows)")
            .add("delta_tiles", (s, m), "float32", "rowsum(dO * O) per query row (bulk copy, as lse)")
            .add(
                "barriers",
                (1 + 2 * s,),
                "uint64",
                "mbarriers: K and V landed; per stage Q, dO, lse and delta landed; the stage free again",
            )
        )
        if not self.split_scores:
            return b
        for name, what in (("p_tiles", "P^T"), ("ds_tiles", "dS^T")):
            b = b.add(
                name,
                (2, n, m),
                self.dtype,
                f"{what} (keys x queries, 128-byte swizzled) of two query tiles, each warpgroup writing its half of "
                "the queries, which dV and dK read: one written while the last one's products may still read the other",
                align=SWIZZLE_ALIGN,
            )
        return b

    @property
    def work_split(self) -> str | None:
        keys = (
            "64 keys each"
            if self.d_split == 1
            else f"64 keys a pair, each keeping {64 * self.d_chunks // 2} of dK's and dV's columns and computing "
            f"the scores of {self.block_m // 2} of the tile's queries"
        )
        return (
            f"a producer warpgroup ({PRODUCER_REGISTERS} registers a thread, setmaxnreg): its first thread "
            f"issues the TMA copies of K, V and each query tile's Q, dO, lse and delta rows; "
            f"{self.num_warps // 4} consumer warpgroups ({CONSUMER_REGISTERS} registers) of {keys}: "
            "S^T = K Q^T and dP^T = V dO^T (wgmma, shared memory), P^T and dS^T in registers"
            + (", then into shared tiles" if self.split_scores else "")
            + f", dV += P^T dO and dK += dS^T Q (wgmma, {self._dk_operands})"
        )

    @property
    def _dk_operands(self) -> str:
        return "P^T and dS^T from both halves' shared tiles" if self.split_scores else "P^T and dS^T from registers"

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (their columns), S^T, dP^T; P^T and dS^T packed
        return 64 * self.d_chunks // self.d_split + (self.block_m + self.block_m // 2) // self.d_split


@dataclasses.dataclass(frozen=True)
class BwdFusedWgmmaHalfConfig(BwdDkdvWgmmaHalfConfig):
    """``attn_bwd_fused_wgmma_half``: the dK/dV pass that also computes dQ. Each query tile's
    dS^T (two warpgroups of 64 keys, 64 queries) goes into one of two swizzled tiles in
    shared memory; from it each warpgroup computes a 64-column chunk of dQ = dS K (wgmma,
    both operands MN-major; at head dims up to 64 the warpgroups take turns) into one of two
    float32 dQ tiles in shared memory, which a producer warp adds to a float32 accumulator
    in global memory (the TMA's bulk reduction); ``attn_bwd_dq_convert`` scales and rounds it
    into dq. ``ordered`` (deterministic=True): each key block adds its tile in its turn after
    the key blocks before it, so every dQ sum runs in one order."""

    ordered: bool = False

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_fused_wgmma_half"
    LAYOUT: ClassVar[str] = "cupyattn::BwdFusedWgmmaHalfLayout"

    @functools.cached_property
    def name_expression(self) -> str:
        return f"{super().name_expression[:-1]}, {'true' if self.ordered else 'false'}>"

    @property
    def valid(self) -> bool:
        two_key_warpgroups = self.block_n == 128 and self.num_warps == 8
        return super().valid and self.block_m == 64 and two_key_warpgroups and self.d_chunks <= 2

    def _builder(self) -> LayoutBuilder:
        return (
            super()
            ._builder()
            .add(
                "ds_tiles",
                (2, self.block_n, self.block_m),
                self.dtype,
                "dS^T (keys x queries, 128-byte swizzled) of two query tiles, which dQ and dK read: one written "
                "while the last one's products may still read the other",
                align=SWIZZLE_ALIGN,
            )
            .add(
                "dq_tiles",
                (2, self.d_chunks, self.block_m, 64),
                "float32",
                "dQ of two query tiles in accumulator order: one written while the TMA adds the other to the "
                "float32 accumulator",
            )
            .add(
                "dq_barriers",
                (4,),
                "uint64",
                "mbarriers: per dQ tile, written (each consumer warp arrives) and added (the dQ warp arrives)",
            )
        )

    @property
    def work_split(self) -> str | None:
        order = (
            "in the order of the key blocks (each waits for its turn at a tile: bitwise reproducible)"
            if self.ordered
            else "in whatever order the blocks get there"
        )
        return (
            f"{super().work_split}; each query tile's dS^T into a shared tile, from which each warpgroup "
            "computes a 64-column chunk of dQ = dS K (wgmma, shared memory) into a float32 shared tile; "
            "the producer warpgroup's second warp adds that tile to a float32 accumulator (TMA bulk "
            f"reduction), {order}; a last launch (attn_bwd_dq_convert) scales and rounds it into dq"
        )

    @property
    def _dk_operands(self) -> str:
        return "P^T from registers, dS^T from its shared tile" if self.dk_from_tile else super()._dk_operands

    @property
    def dk_from_tile(self) -> bool:
        """Whether dK reads dS^T from its shared tile (kernel: DK_FROM_TILE): where dS^T kept in
        registers would leave ptxas too few to let an item's dK product run on into the next,
        not causal (there the registers measured faster)."""
        return not self.causal and 64 * self.d_chunks + self.block_m > 160

    def accumulator_shape(self, batch: int, heads_q: int, seqlen_q: int) -> tuple[int, int, int, int]:
        """The float32 dQ accumulator it adds into: (batch, query head, query tile) tiles of
        d_chunks 64 x 64 chunks in accumulator order (kernel: DqAccumulator); ``ordered``, one
        int32 turn counter per tile (the first three dimensions)."""
        return (batch, heads_q, -(-seqlen_q // self.block_m), self.d_chunks * self.block_m * 64)

    # accumulators_per_lane as the dK/dV pass's: dQ's chunk (32) lives once S^T and dP^T have
    # become the packed P^T and dS^T.


@dataclasses.dataclass(frozen=True)
class BwdDqWgmmaHalfConfig(_BwdWgmmaHalf):
    """``attn_bwd_dq_wgmma_half``: dQ for ``block_m`` query rows on sm_90a, 64 a consumer
    warpgroup; K and V tiles of ``block_n`` keys through two stages."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dq_wgmma_half"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDqWgmmaHalfLayout"

    @property
    def valid(self) -> bool:
        return (
            self.dtype in ("float16", "bfloat16")
            and self.num_warps % 4 == 0
            and self.block_m == 16 * self.num_warps
            and self.block_n in _HALF_N
            and 64 * self.d_chunks in _HALF_N
            and self.head_dim_pad % 16 == 0
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        m, n, s = self.block_m, self.block_n, self.STAGES
        b = self._swizzled(LayoutBuilder(), "q_tile", m)
        b = self._swizzled(b, "do_tile", m)
        b = self._swizzled(b, "k_tiles", n, s)
        return (
            self._swizzled(b, "v_tiles", n, s)
            .add(
                "barriers",
                (1 + 3 * s,),
                "uint64",
                "mbarriers: Q and dO landed; per stage K landed, V landed; the stage free again",
            )
            .build()
        )

    @property
    def work_split(self) -> str | None:
        return (
            f"a producer warpgroup ({PRODUCER_REGISTERS} registers a thread, setmaxnreg) whose first thread "
            f"issues the TMA copies of Q, dO and each key tile's K and V; {self.num_warps // 4} consumer "
            f"warpgroups ({CONSUMER_REGISTERS} registers) of 64 query rows each: S = Q K^T and dP = dO V^T "
            "(wgmma, shared memory), dS in registers, dQ += dS K (wgmma, dS from registers)"
        )

    @property
    def accumulators_per_lane(self) -> int:  # dQ (64-column chunks), S, dP; dS packed
        return (64 * self.d_chunks + 2 * self.block_n + self.block_n // 2) // 2
