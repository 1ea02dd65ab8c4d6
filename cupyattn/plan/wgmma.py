"""The Hopper warpgroup-MMA (wgmma) kernels' configurations: float32 inputs in the TF32
modes on sm_90a, their layouts (kept tiles, staged tiles in pipeline stages or a ring,
mbarriers) and the register rules that keep out the tiles ptxas would spill."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from ..device import DeviceSpec
from ..layout import Layout, LayoutBuilder
from .mma import BwdDkdvMmaConfig, BwdDqMmaConfig, FwdMmaConfig
from .problem import MMA_OPS, d_split_head_dim_pad, d_split_of
from .staging import SM90_SMEM_PER_BLOCK, StagingConfig


class WgmmaConfig:
    """What the kernels on Hopper's warpgroup MMA share (float32 inputs in the TF32 modes
    "fp32" / "tf32"; kernels/wgmma_tiles.cuh): wgmma exists on sm_90a only, so they are
    compiled for that target and planned on compute capability 9.0 alone; operands are
    TF32 tiles in wgmma's core-matrix order: the tiles a block keeps split by the kernel,
    the tiles it streams staged once per call by a ``staging`` launch and copied whole.
    Mixed in before the mma.sync config of the same pass, whose fields (template
    parameters) it keeps; each subclass names ``staging`` and BARRIERS (per stage), and
    lays out the tiles a block keeps before ``_staged_tiles``."""

    ARCH_SUFFIX: ClassVar[str] = "a"  # sm_90 -> sm_90a: the architecture-specific features
    # Where only one stage fits, its two parts (named here) land apart, two barriers: the
    # backward's kernels.
    SPLIT_ONE_STAGE: ClassVar[str] = ""

    @staticmethod
    def runs_on(device: DeviceSpec, dtype: str, precision: str) -> bool:
        return device.compute_capability == (9, 0) and dtype == "float32" and precision in ("fp32", "tf32")

    @property
    def parts(self) -> int:
        """TF32 parts per operand: big and small for 3xTF32, one otherwise."""
        return 2 if self.precision == "fp32" else 1

    # A third, producer warpgroup (128 threads past the consumers' warps) that issues the
    # staged tiles' copies: the backward passes say where (their producer_warp), and the
    # kernel's layout takes it as its last parameter. The kernel decides it again from
    # its own template parameters (PRODUCER_RULE, a constexpr function of kernels/): the
    # layout check names that rule in place of producer_warp (checked_layout_expression),
    # so where the two disagree the layouts' mbarrier bytes do, and the kernel does not
    # compile, where it would otherwise launch with a thread count it does not expect.
    producer_warp = False
    PRODUCER_RULE: ClassVar[str] = ""

    @property
    def staging(self) -> StagingConfig:
        """The staging launch, which writes one pipeline stage's tile."""
        raise NotImplementedError

    @property
    def score_parts_as_rows(self) -> bool:
        """The staged row tiles hold their parts as rows (``StagingConfig.parts_as_rows``:
        the score products take big x (big | small) as one n32 wgmma; Layout::SCORE_PARTS_AS_ROWS)."""
        return self.staging.parts_as_rows

    @property
    def threads(self) -> int:
        return self.num_warps * 32 + (128 if self.producer_warp else 0)

    @property
    def layout_expression(self) -> str:
        return self._layout_with(", true" if self.producer_warp else "")

    @property
    def checked_layout_expression(self) -> str:
        """The layout as the kernel instantiates it: the producer flag from its rule."""
        if not self.PRODUCER_RULE:
            return self.layout_expression
        op = MMA_OPS[self.precision]
        return self._layout_with(
            f", {self.PRODUCER_RULE}<{op}, {self.head_dim_pad}, {self.block_m}, {self.block_n}, {self.num_warps}>()"
        )

    def _layout_with(self, producer: str) -> str:
        return (
            f"{self.LAYOUT}<{MMA_OPS[self.precision]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}{producer}>"
        )

    def _valid_tile(self, owned: int, streamed: int) -> bool:
        """What the kernels' static_asserts accept: float32 in a TF32 mode, 64 owned rows
        (queries or keys) a warpgroup, a streamed tile wgmma.cuh has an n-size for."""
        return (
            self.dtype == "float32"
            and self.precision in ("fp32", "tf32")
            and self.num_warps % 4 == 0
            and owned == 16 * self.num_warps
            and streamed in (16, 32, 64)
            and self.head_dim_pad % 16 == 0
        )

    @property
    def _parts_text(self) -> str:
        return "TF32 big and small parts (3xTF32)" if self.parts == 2 else "TF32"

    @property
    def _staged_parts_text(self) -> str:
        """How the staged tiles hold their parts (``staging.parts_as_rows``: the row tiles'
        small parts as rows 16-31, the B operands of n32 score products)."""
        if self.score_parts_as_rows:
            return (
                f"{self._parts_text} in core-matrix order, the row tiles' small parts as their rows "
                f"16-31 (one n32 wgmma takes big x (big | small) in the score products)"
            )
        return f"{self._parts_text} in core-matrix order"

    def _tf32_tile(self, builder: LayoutBuilder, name: str, shape: tuple, what: str = "") -> LayoutBuilder:
        note = f"{self._parts_text}, in 8-row x 16-byte core matrices (wgmma operands, no swizzle)"
        return builder.add(name, (self.parts, *shape), "float32", f"{what}; {note}" if what else note)

    @property
    def stages(self) -> int:
        """Staged tiles in shared memory at once: two where they fit in sm_90's shared
        memory beside the tiles a block keeps, else one (``_staged_tiles``)."""
        return self.layout["barriers"].shape[0]

    def _kept_pair(self, names: tuple, rows: int, as_words: bool) -> LayoutBuilder:
        """The two tiles (rows x head_dim_pad) a block keeps for the whole launch: float32
        words in register A order (``as_words``), else TF32 parts in core-matrix order."""
        if not as_words:
            return self._tf32_tile(
                self._tf32_tile(LayoutBuilder(), names[0], (rows, self.head_dim_pad)),
                names[1],
                (rows, self.head_dim_pad),
            )
        words = "float32 in each lane's wgmma A-register order, split into TF32 parts per k-step in registers"
        b = LayoutBuilder()
        for name in names:
            b = b.add(name, (1, rows, self.head_dim_pad), "float32", words)
        return b

    @property
    def stage_bytes(self) -> int:
        """Shared memory of one pipeline stage: the whole staged tile."""
        return self.staging.tile_bytes

    def _two_stages_fit(self, kept_bytes: int) -> bool:
        """Two stages of staged tiles (and their mbarriers) fit beside ``kept_bytes``."""
        return kept_bytes + 2 * (self.stage_bytes + self.BARRIERS * 8) <= SM90_SMEM_PER_BLOCK

    def _staged_tiles(
        self, builder: LayoutBuilder, name: str, what: str, shape: tuple, free_barriers: bool = False
    ) -> LayoutBuilder:
        """After the tiles a block keeps: one or two copies of the tile ``staging`` writes
        (two where they fit; kernels/wgmma_staging.cuh, stages_that_fit), and the
        mbarriers that count its bytes (BARRIERS per stage: the operands that land apart;
        with one stage and ``free_barriers``, two more that count the consumer warps done
        with each part, for a producer warpgroup)."""
        two = self._two_stages_fit(builder.end)
        stages = 2 if two else 1
        how = f"copied whole (cp.async.bulk) from {self.staging.kernel_name}'s tiles"
        builder = builder.add(
            name,
            (stages, *shape),
            "float32",
            f"{stages} stage{'s' if two else ''} of {what}; {self._staged_parts_text}, {how}",
        )
        if stages == 1 and self.SPLIT_ONE_STAGE:
            if free_barriers:
                return builder.add(
                    "barriers",
                    (1, 4),
                    "uint64",
                    f"mbarriers: the stage's two parts "
                    f"({self.SPLIT_ONE_STAGE}) have landed; each is free again (the producer "
                    f"warpgroup's cue)",
                )
            return builder.add(
                "barriers",
                (1, 2),
                "uint64",
                f"mbarriers: the stage's two parts "
                f"({self.SPLIT_ONE_STAGE}) have landed (each copied while the other is in use)",
            )
        return builder.add("barriers", (stages, self.BARRIERS), "uint64", "mbarriers: a stage's copies have landed")


@dataclasses.dataclass(frozen=True)
class FwdWgmmaConfig(WgmmaConfig, FwdMmaConfig):
    """``attn_fwd_wgmma``: the forward on warpgroup MMA (kernels/attn_fwd_wgmma.cuh); each
    warpgroup (4 warps) owns 64 query rows. K and V come split into TF32 tiles by
    ``staging`` (a launch before it), ``stages`` key tiles in flight."""

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_wgmma"
    LAYOUT: ClassVar[str] = "cupyattn::FwdWgmmaLayout"
    HEADER: ClassVar[str] = "attn_fwd_wgmma.cuh"
    BARRIERS: ClassVar[int] = 2  # K, then V^T: with one stage the next K comes in while P V runs

    @property
    def valid(self) -> bool:
        return self._valid_tile(owned=self.block_m, streamed=self.block_n)

    @property
    def staging(self) -> StagingConfig:
        return StagingConfig("forward keys", self.precision, self.head_dim_pad, self.block_n)

    Q_IN_REGISTERS_FROM: ClassVar[int] = 128  # kernels/attn_fwd_wgmma.cuh, FwdWgmmaLayout::Q_IN_REGISTERS

    @property
    def q_in_registers(self) -> bool:
        """3xTF32 from head dim 128: Q kept once as float32 and split per k-step in
        registers (the register A operand of S = Q K^T), half the bytes of two parts."""
        return self.precision == "fp32" and self.head_dim_pad >= self.Q_IN_REGISTERS_FROM

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        d, n = self.head_dim_pad, self.block_n
        if self.q_in_registers:
            b = LayoutBuilder().add(
                "q_tile",
                (1, self.block_m, d),
                "float32",
                "float32 in each lane's wgmma A-register order, split into TF32 parts per k-step in registers",
            )
        else:
            b = self._tf32_tile(LayoutBuilder(), "q_tile", (self.block_m, d))
        return self._staged_tiles(
            b, "kv_tiles", "a key tile's K and V^T (V transposed: TF32 B operands are K-major)", (2, self.parts, n, d)
        ).build()

    @property
    def accumulators_per_lane(self) -> int:  # O (head_dim), S and its two k-step accumulators
        return (self.head_dim_pad + 3 * self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # From every listed tile at head dims 16-256 through ptxas, causal and not: these
        # rules keep out every one that spills (tests/test_compile.py compiles the planned ones).
        if self.num_warps == 16 and self.precision == "fp32" and self.block_n > 32:
            return "3xTF32 with 64-key tiles spills at 16 warps (128 registers a lane)"
        if self.num_warps == 16 and self.head_dim_pad >= 160:
            return "head dims from 160 spill at 16 warps (128 registers a lane)"
        if self.q_in_registers and self.num_warps == 16:
            return "3xTF32 with Q in registers spills at 16 warps (128 registers a lane)"
        if self.q_in_registers and self.num_warps == 12 and self.head_dim_pad + 2 * self.block_n > 208:
            return (
                "3xTF32 with Q in registers spills at 12 warps (168 registers a lane) where head dim + "
                "2 x keys a tile exceeds 208"
            )
        return None


@dataclasses.dataclass(frozen=True)
class BwdDkdvWgmmaConfig(WgmmaConfig, BwdDkdvMmaConfig):
    """``attn_bwd_dkdv_wgmma``: dK and dV on warpgroup MMA (kernels/attn_bwd_wgmma.cuh);
    each warpgroup owns 64 keys, Q and dO tiles of ``block_m`` rows stream. Where
    ``num_warps * 16`` is twice ``block_n`` (``d_split`` = 2), two warpgroups share their
    64 keys, each with half of dK's and dV's columns (one computes S^T, the other dP^T,
    and they swap them through shared memory): at head dims whose accumulators one
    warpgroup's registers do not hold."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dkdv_wgmma"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDkdvWgmmaLayout"
    PRODUCER_RULE: ClassVar[str] = "cupyattn::dkdv_producer_warp"
    HEADER: ClassVar[str] = "attn_bwd_wgmma.cuh"
    BARRIERS: ClassVar[int] = 1
    SPLIT_ONE_STAGE: ClassVar[str] = "Q, dO | Q^T, dO^T, lse, delta"

    @property
    def valid(self) -> bool:
        return (
            self._valid_tile(owned=self.block_n * self.d_split, streamed=self.block_m)
            and self.d_split in (1, 2)
            and self.block_n % 64 == 0
            and self.head_dim_pad % (16 * self.d_split) == 0
        )

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        d, m = self.head_dim_pad, self.block_m
        if self.ring:
            return (
                self._kept_tiles()
                .add(
                    "q_tiles",
                    (3, self.parts * m * d + 2 * m),
                    "float32",
                    "a ring of 3 slots of one operand tile each, "
                    f"through which a query tile's dO, Q, dO^T (with lse * log2(e) and delta per row) and Q^T pass in "
                    f"turn, each slot refilled once its tile is used; {self._staged_parts_text}, "
                    f"copied (cp.async.bulk) from {self.staging.kernel_name}'s tiles",
                )
                .add(
                    "barriers",
                    (1, 6 if self.producer_warp else 3),
                    "uint64",
                    "mbarriers: a ring slot's tile has landed"
                    + ("; a slot is free again (the producer warpgroup's cue)" if self.producer_warp else ""),
                )
                .build()
            )
        return self._staged_tiles(
            self._kept_tiles(),
            "q_tiles",
            "a query tile's Q, dO, Q^T and dO^T "
            "(transposed: the B operands of dK = dS^T Q and dV = P^T dO), then "
            "lse * log2(e) and delta per row",
            (4 * self.parts * m * d + 2 * m,),
        ).build()

    @property
    def work_split(self) -> str | None:
        if self.d_split == 1:
            return None
        return (
            f"two warpgroups share each 64 keys, each keeping dK's and dV's {self.head_dim_pad // 2} of "
            f"{self.head_dim_pad} columns; the first computes S^T, the second dP^T, and they swap them "
            f"through shared memory" + ("; a third warpgroup issues the ring's copies" if self.producer_warp else "")
        )

    @property
    def producer_warp(self) -> bool:
        """A pair of warpgroups (d_split 2) whose query tiles stream through the ring: a
        third warpgroup issues the ring's copies as the consumer warps free its slots
        (kernels/attn_bwd_wgmma.cuh, dkdv_producer_warp), where they met at block
        barriers before. 3xTF32 ("fp32") only: one TF32 pass measured slower with it."""
        return self.d_split == 2 and self.ring and self.parts == 2

    @property
    def ring(self) -> bool:
        """Where not even one staged query tile fits beside K and V (e.g. 3xTF32 at head
        dim 256, "tf32" with 32-query tiles there): its four operand tiles stream through a
        ring of three slots, S^T and dP^T computed one after the other
        (kernels/attn_bwd_wgmma.cuh, BwdDkdvWgmmaLayout::RING)."""
        return self._kept_tiles().end + self.stage_bytes + 2 * 8 > SM90_SMEM_PER_BLOCK

    KV_IN_REGISTERS_FROM: ClassVar[int] = 128  # kernels/attn_bwd_wgmma.cuh, BwdDkdvWgmmaLayout::KV_IN_REGISTERS

    @classmethod
    def head_dim_pad_for(cls, head_dim: int, block_m: int, block_n: int, num_warps: int) -> int:
        """Two warpgroups that share 64 keys (d_split 2) each take half of the head dim in
        whole 16-column tiles: padded to a multiple of 32 (144 -> 160, 240 -> 256; zeros past
        head_dim), so that these tiles also serve the head dims where every other tile
        spills (3xTF32 at 136-144, 168-176, 200-208 and 232-240; "tf32" at 232-240)."""
        return d_split_head_dim_pad(head_dim, d_split_of(num_warps, block_n))

    @property
    def kv_in_registers(self) -> bool:
        """3xTF32 from head dim 128: K and V kept once as float32 and split per k-step in
        registers (the register A operands of S^T = K Q^T and dP^T = V dO^T), as the dQ
        pass keeps Q and dO: half the bytes of two parts."""
        return self.precision == "fp32" and self.head_dim_pad >= self.KV_IN_REGISTERS_FROM

    def _kept_tiles(self) -> LayoutBuilder:
        """The tiles a block keeps, before the staged query tiles."""
        return self._kept_pair(("k_tile", "v_tile"), self.block_n, self.kv_in_registers)

    @property
    def staging(self) -> StagingConfig:
        # 3xTF32 16-query tiles with K and V as words (BwdDkdvWgmmaLayout::SCORE_PARTS_AS_ROWS):
        # Q's and dO's row tiles with their small parts as rows 16-31, so that the score
        # products take big x (big | small) as one n32 wgmma (wgmma_tiles.cuh, words_by_rows).
        parts_as_rows = self.parts == 2 and self.block_m == 16 and self.kv_in_registers
        return StagingConfig(
            "dkdv queries", self.precision, self.head_dim_pad, self.block_m, parts_as_rows=parts_as_rows
        )

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim / d_split each), S^T and dP^T (block_m each)
        return self.head_dim_pad // self.d_split + self.block_m

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # From every listed tile at head dims 16-256 through ptxas, causal and not: these
        # rules catch every one that spills (tests/test_compile.py compiles the planned ones).
        if self.head_dim_pad // self.d_split >= 208:
            return "dK and dV (head_dim / 2 / d_split accumulators a lane each) spill from head dim 208 a warpgroup"
        if self.num_warps == 16 and (
            self.precision == "fp32" or self.head_dim_pad >= (80 if self.block_m == 16 else 64)
        ):
            return "16 warps leave 128 registers a lane: spills in 3xTF32, and from head dim 64 (16-query tiles: 80)"
        if self.num_warps == 12 and self.head_dim_pad >= (32 if self.precision == "fp32" else 112):
            return "12 warps leave 168 registers a lane: spills in 3xTF32 from head dim 32, else from 112"
        # The ring computes S^T and dP^T one after the other, which leaves it more registers.
        if self.precision == "fp32" and self.block_m == 64 and self.head_dim_pad >= 48 and not self.ring:
            return "3xTF32 with 64-query tiles spills from head dim 48 (unless through the ring)"
        # K and V as words take a k-step's A operands in registers too.
        words_limit = 192 if self.ring else 160
        if self.kv_in_registers and self.head_dim_pad // self.d_split + 2 * self.block_m > words_limit:
            return (
                f"3xTF32 with K and V words spills where head_dim / d_split + 2 x block_m > {words_limit}"
                f"{' (products one at a time through the ring)' if self.ring else ''}"
            )
        if self.block_m == 32 and self.head_dim_pad // self.d_split >= 192:
            return "32-query tiles spill from 192 head-dim columns a warpgroup"
        if self.parts == 1 and self.block_m == 64 and not self.ring and self.head_dim_pad // self.d_split >= 144:
            return "one TF32 pass with 64-query tiles spills from head dim 144 (unless through the ring)"
        if self.ring and self.parts == 1 and self.head_dim_pad // self.d_split + self.block_m > 192:
            return "one TF32 pass through the ring spills where head_dim / d_split + block_m > 192"
        return None


@dataclasses.dataclass(frozen=True)
class BwdFusedWgmmaConfig(BwdDkdvWgmmaConfig):
    """``attn_bwd_fused_wgmma``: dK, dV and dQ in one pass (kernels/attn_bwd_wgmma.cuh), for
    ``deterministic=False``: the dK/dV pass, in which each warpgroup also writes its dS to
    shared memory and adds dQ^T = K^T dS^T over its 64 keys to dQ with float32 atomics, so
    that no dQ pass recomputes S and dP. Keeps K^T beside K and V."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_fused_wgmma"
    LAYOUT: ClassVar[str] = "cupyattn::BwdFusedWgmmaLayout"
    PRODUCER_RULE: ClassVar[str] = ""  # (no producer warpgroup: its layout has no flag)
    kv_in_registers: ClassVar[bool] = False  # K's core-matrix tile is transposed into K^T
    ring: ClassVar[bool] = False  # BwdFusedWgmmaLayout::RING: a whole stage beside K^T, or no fit

    @property
    def valid(self) -> bool:  # dQ^T's wgmma rows: 64 head-dim rows each; a warpgroup's dS, all of dK's columns
        return super().valid and self.head_dim_pad % 64 == 0 and self.d_split == 1

    def _kept_tiles(self) -> LayoutBuilder:  # dK/dV's K and V, then K^T and the dS tiles
        d, m, n = self.head_dim_pad, self.block_m, self.block_n
        b = self._tf32_tile(super()._kept_tiles(), "kt_tile", (d, n), "K transposed: the A operand of dQ^T = K^T dS^T")
        return b.add(
            "ds_tiles",
            (n // 64, self.parts, m, 64),
            "float32",
            f"each warpgroup's dS (its 64 keys), the B operand of dQ^T; {self._parts_text} in core-matrix order",
        )

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim each), S^T and dP^T, dQ^T (block_m each)
        return self.head_dim_pad + 3 * self.block_m // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # Every listed tile that fits beside K^T compiles without spills (none fits at 256).
        return None


@dataclasses.dataclass(frozen=True)
class BwdDqWgmmaConfig(WgmmaConfig, BwdDqMmaConfig):
    """``attn_bwd_dq_wgmma``: dQ on warpgroup MMA (kernels/attn_bwd_wgmma.cuh); each
    warpgroup owns 64 query rows, K and V tiles of ``block_n`` keys stream. Where
    ``num_warps * 16`` is twice ``block_m`` (``d_split`` = 2, a block of 64 rows), two
    warpgroups share the rows, each with half of dQ's columns (one computes S, the other
    dP, and they swap them through shared memory): twice the warps where only 64 rows of
    Q and dO fit (3xTF32 from head dim 160)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dq_wgmma"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDqWgmmaLayout"
    PRODUCER_RULE: ClassVar[str] = "cupyattn::dq_producer_warp"
    HEADER: ClassVar[str] = "attn_bwd_wgmma.cuh"
    BARRIERS: ClassVar[int] = 1
    SPLIT_ONE_STAGE: ClassVar[str] = "K, V | K^T"

    @property
    def d_split(self) -> int:
        return d_split_of(self.num_warps, self.block_m)

    @property
    def work_split(self) -> str | None:
        if self.d_split == 1:
            return None
        return (
            f"two warpgroups share the 64 query rows, each keeping dQ's {self.head_dim_pad // 2} of "
            f"{self.head_dim_pad} columns; the first computes S, the second dP, and they swap them "
            f"through shared memory" + ("; a third warpgroup issues the copies" if self.producer_warp else "")
        )

    @functools.cached_property
    def producer_warp(self) -> bool:
        """A pair of warpgroups (d_split 2) with one stage: a producer warpgroup issues the stage's
        copies as the consumer warps free its parts (kernels/attn_bwd_wgmma.cuh,
        dq_producer_warp), where they met at a block barrier before."""
        return self.d_split == 2 and not self._two_stages_fit(self._kept_tiles().end)

    @property
    def valid(self) -> bool:
        return (
            self._valid_tile(owned=self.block_m * self.d_split, streamed=self.block_n)
            and (self.d_split == 1 or (self.d_split == 2 and self.block_m == 64))
            and self.head_dim_pad % (16 * self.d_split) == 0
        )

    @classmethod
    def head_dim_pad_for(cls, head_dim: int, block_m: int, block_n: int, num_warps: int) -> int:
        """Padded to a multiple of 32 for a pair of warpgroups (d_split 2), as dK/dV's."""
        return d_split_head_dim_pad(head_dim, d_split_of(num_warps, block_m))

    Q_IN_REGISTERS_FROM: ClassVar[int] = 128  # kernels/attn_bwd_wgmma.cuh, BwdDqWgmmaLayout::Q_IN_REGISTERS

    @property
    def q_in_registers(self) -> bool:
        """3xTF32 from head dim 128: Q and dO kept once as float32 and split per k-step in
        registers (the register A operands of S = Q K^T and dP = dO V^T), as the forward
        keeps Q: half the bytes of two parts."""
        return self.precision == "fp32" and self.head_dim_pad >= self.Q_IN_REGISTERS_FROM

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return self._staged_tiles(
            self._kept_tiles(),
            "kv_tiles",
            "a key tile's K, V and K^T (K transposed: the B operand of dQ = dS K)",
            (3, self.parts, self.block_n, self.head_dim_pad),
            free_barriers=self.producer_warp,
        ).build()

    def _kept_tiles(self) -> LayoutBuilder:
        """The tiles a block keeps, before the staged key tiles."""
        return self._kept_pair(("q_tile", "do_tile"), self.block_m, self.q_in_registers)

    @property
    def staging(self) -> StagingConfig:
        # As dK/dV's (BwdDqWgmmaLayout::SCORE_PARTS_AS_ROWS): 16-key tiles with Q and dO as
        # words take K's and V's row tiles with their parts as rows.
        parts_as_rows = self.parts == 2 and self.block_n == 16 and self.q_in_registers
        return StagingConfig("dq keys", self.precision, self.head_dim_pad, self.block_n, parts_as_rows=parts_as_rows)

    @property
    def accumulators_per_lane(self) -> int:  # dQ (head_dim / d_split), S and dP (block_n each)
        return (self.head_dim_pad // self.d_split + 2 * self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # 3xTF32 computes S, then dP (kernels/attn_bwd_wgmma.cuh): up to 8 warps fit.
        if self.precision == "fp32" and self.num_warps > 8:
            return "3xTF32 spills with more than 8 warps (168 registers a lane or fewer)"
        return None
