"""Tile configurations and the planner.

A configuration is a frozen dataclass whose fields are its kernel's C++ template
parameters, one to one; its ``name_expression`` (e.g.
``cupyattn::attn_fwd_simt<float, 128, 128, 32, 64, 4, true>``) is its identity in
errors, logs, benchmark tables and cache keys. Each configuration knows its
shared-memory layout. The planner is a pure function of (problem, DeviceSpec).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from .device import DeviceSpec
from .layout import DTYPE_BYTES, Layout, LayoutBuilder

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
PRECISION_TEXT = {"fp32": "3xTF32 (float32 accuracy)", "tf32": "one TF32 pass",
                  "bf16": "bfloat16 operands", "fp16": "float16 operands"}
NATIVE_PRECISION = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# The operand policy (kernels/mma.cuh) and shared-memory dtype of each mode.
MMA_OPS = {"fp16": "cupyattn::MmaHalf<__half>", "bf16": "cupyattn::MmaHalf<__nv_bfloat16>",
           "tf32": "cupyattn::MmaTf32<1>", "fp32": "cupyattn::MmaTf32<3>"}
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
        raise ValueError(f"precision: expected None, one of {PRECISIONS} or a sequence of them, "
                         f"got {precision!r}")
    if dtype != "float32" and modes != (native,):
        raise ValueError(f"precision: {dtype} inputs compute with {native!r} operands; got {precision!r} "
                         "(precision modes apply to float32 inputs)")
    return tuple(dict.fromkeys(modes))


def pad_head_dim(d: int) -> int:
    """Head dims are padded to a multiple of 8 in shared memory (zero-filled)."""
    return max(8, (int(d) + 7) // 8 * 8)


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

    def __post_init__(self):
        if self.dtype not in CXX_TYPES:
            raise ValueError(f"dtype: expected one of {sorted(CXX_TYPES)}, got {self.dtype!r}")
        object.__setattr__(self, "precision", parse_precision(self.precision or None, self.dtype))
        for name in ("head_dim", "head_dim_v"):
            d = getattr(self, name)
            if not 1 <= d <= MAX_HEAD_DIM:
                raise ValueError(f"{name}: expected 1..{MAX_HEAD_DIM}, got {d}")


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
        return (f"{self.KERNEL}<{self._cxx_type}, {self.head_dim_pad}, {self.head_dim_v_pad}, "
                f"{self.block_m}, {self.block_n}, {self.num_warps}, {causal}>")

    @property
    def layout_expression(self) -> str:
        return (f"{self.LAYOUT}<{self._cxx_type}, {self.head_dim_pad}, {self.head_dim_v_pad}, "
                f"{self.block_m}, {self.block_n}>")

    def _words_per_lane(self, dim_pad: int) -> int:
        return -(-(dim_pad // self.vec) // 32)

    @property
    def accumulators_per_lane(self) -> int:
        """float32 output accumulators each lane keeps in registers."""
        raise NotImplementedError


_PADDED = "+1 word per row: lanes read it by column without bank conflicts"


@dataclasses.dataclass(frozen=True)
class FwdSimtConfig(SimtConfig):
    """``attn_fwd_simt``: forward on CUDA cores, float32 accumulation (kernels/attn_fwd_simt.cuh)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_fwd_simt"
    LAYOUT: ClassVar[str] = "cupyattn::FwdSimtLayout"
    HEADER: ClassVar[str] = "attn_fwd_simt.cuh"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return (LayoutBuilder()
                .add("q_tile", (self.block_m, self.head_dim_pad), self.dtype)
                .add("k_tile", (self.block_n, self.head_dim_pad + self.vec), self.dtype, _PADDED)
                .add("v_tile", (self.block_n, self.head_dim_v_pad), self.dtype)
                .build())

    @property
    def accumulators_per_lane(self) -> int:  # O for block_m / num_warps rows
        return self.block_m // self.num_warps * self._words_per_lane(self.head_dim_v_pad) * self.vec


_ROW_PAD_NOTE = "+16 bytes per row: the 8 rows of an ldmatrix phase hit 8 bank groups"


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
        return (f"{self.KERNEL}<{CXX_TYPES[self.dtype]}, {MMA_OPS[self.precision]}, {self.head_dim_pad}, "
                f"{self.block_m}, {self.block_n}, {self.num_warps}, {causal}>")

    @property
    def layout_expression(self) -> str:
        return (f"{self.LAYOUT}<{CXX_TYPES[self.staged_dtype]}, {self.head_dim_pad}, {self.block_m}, "
                f"{self.block_n}>")

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
    # (scripts/spill_map.py: every candidate at head dims 32..256 through ptxas).
    # ptxas needs ~60-90 registers more for fragments, addresses and masks on
    # sm_80-sm_90; for sm_100 / sm_120 it spills from 96 (dK/dV) and 128 (dQ).
    BUDGET_SM80: ClassVar[int] = 160  # sm_80 - sm_89
    BUDGET_SM90: ClassVar[int] = 160
    BUDGET_SM100: ClassVar[int] = 160  # sm_100 and newer

    # Caps for the float32 modes that need more registers per accumulator: 3xTF32 keeps
    # each fragment as two TF32 parts and adds each k-step's products apart (mma.cuh);
    # staged float32 -> half loads go through registers. From
    # `spill_map.py --modes float32:fp32,float32:bf16` on sm_80 and sm_90, and sm_100 /
    # sm_120 for the 3xTF32 forward (the fewest accumulators that spilled, minus one
    # step); tf32 spills where float16 does.
    # {mode: {lowest compute capability: cap}}.
    PRECISION_BUDGETS: ClassVar[dict] = {}

    def register_budget(self, compute_capability: tuple[int, int]) -> int:
        if compute_capability >= (10, 0):
            budget = self.BUDGET_SM100
        else:
            budget = self.BUDGET_SM90 if compute_capability >= (9, 0) else self.BUDGET_SM80
        cap = _by_capability(self.PRECISION_BUDGETS.get(self.float32_mode, {}), compute_capability)
        return budget if cap is None else min(budget, cap)

    # Head dims above which every 3xTF32 tile of the kernel spilled although some
    # accumulator count admits one ({lowest compute capability: head dim}): near 255
    # registers ptxas's spills follow no count (tests/test_compile.py compiles every
    # planned 3xTF32 config at head dims 144-256 on sm_80, sm_90, sm_100 and sm_120).
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {}

    # TF32 modes whose every tile spilled on sm_100 / sm_120 (spill_map.py, head dims 32-256:
    # from 48 accumulators per lane): the backward kernels there run on CUDA cores.
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

    # 3xTF32: (128, 64, 8) at head dim 128 (96) is clean; at 192, (16, 16, 1) (104)
    # spills on sm_80 and sm_100 but not on sm_90, (64, 32, 4) (112) everywhere. On
    # sm_100 (16, 16, 1) at 176 (96) spills 60 bytes where (64, 32, 4) at 160 (96) is clean.
    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 96, (9, 0): 104, (10, 0): 96}}
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {(10, 0): 160}

    @property
    def accumulators_per_lane(self) -> int:  # O (head_dim) and S (block_n) per 16-row m-tile
        return self.m_tiles * (self.head_dim_pad + self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        if self.m_tiles == 1:
            return super().register_reason(compute_capability)
        # Two m-tiles: the scores' exp2 and mask temporaries count twice. 192 takes
        # (128, 64, 4) at head dim 64 and (128, 32, 4) at 128, both spill-free on
        # sm_80-sm_90; (128, 64, 4) spills at 96 (sm_90) and 128 (everywhere). On
        # sm_100 / sm_120, (128, 32, 4) at 128 needs 255 registers and spills 8 bytes
        # (sm_120): two m-tiles stop at head dim 96 there.
        major, minor = compute_capability
        fp32 = self.float32_mode == "fp32"
        if compute_capability >= (10, 0) and (self.head_dim_pad > 96 or fp32):
            return (f"two 16-row m-tiles per warp spill {'in 3xTF32' if fp32 else 'above head dim 96'} "
                    f"on sm_{major}{minor}")
        weighted = self.m_tiles * (self.head_dim_pad + 2 * self.block_n) // 2
        limit = 128 if fp32 else 192  # 3xTF32: (64, 128, 64, 4) spills above 128
        if weighted > limit:
            return (f"two 16-row m-tiles per warp: {weighted} accumulators per lane counting the "
                    f"scores twice, over the spill-free budget of {limit}")
        return None


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
    # Where the producer warpgroup also makes the transposed tiles from staged row tiles
    # (``staging``: the row tiles only; the backward passes, PRODUCER_MAKES_TRANSPOSED):
    # the kernel and its layout take it as their last template parameter (ROWS_ONLY).
    PRODUCER_MAKES_TRANSPOSED: ClassVar[bool] = False
    ROWS_OPERANDS: ClassVar[str] = ""  # StagingConfig.operands of those row tiles

    @property
    def rows_staged(self) -> bool:
        return self.producer_warp and self.PRODUCER_MAKES_TRANSPOSED

    @property
    def staging(self) -> StagingConfig:
        """The staging launch: the whole staged tile (``_stage_tile``), or where the
        producer warpgroup makes the transposed tiles (``rows_staged``), the row tiles only
        (``ROWS_OPERANDS``), their parts apart: a third to half fewer bytes staged and copied."""
        tile = self._stage_tile
        return dataclasses.replace(tile, operands=self.ROWS_OPERANDS, parts_as_rows=False) if self.rows_staged else tile

    @property
    def score_parts_as_rows(self) -> bool:
        """The staged row tiles hold their parts as rows (``StagingConfig.parts_as_rows``:
        the score products take big x (big | small) as one n32 wgmma; Layout::SCORE_PARTS_AS_ROWS)."""
        return self.staging.parts_as_rows

    @property
    def threads(self) -> int:
        return self.num_warps * 32 + (128 if self.producer_warp else 0)

    @property
    def name_expression(self) -> str:
        name = super().name_expression
        return f"{name[:-1]}, true>" if self.rows_staged else name

    @property
    def layout_expression(self) -> str:
        return self._layout_with(", true" if self.producer_warp else "")

    @property
    def checked_layout_expression(self) -> str:
        """The layout as the kernel instantiates it: the producer flag from its rule."""
        if not self.PRODUCER_RULE:
            return self.layout_expression
        op = MMA_OPS[self.precision]
        return self._layout_with(f", {self.PRODUCER_RULE}<{op}, {self.head_dim_pad}, {self.block_m}, "
                                 f"{self.block_n}, {self.num_warps}>()")

    def _layout_with(self, producer: str) -> str:
        rows_only = ", true" if self.rows_staged else ""
        return (f"{self.LAYOUT}<{MMA_OPS[self.precision]}, {self.head_dim_pad}, {self.block_m}, {self.block_n}"
                f"{producer}{rows_only}>")

    def _valid_tile(self, owned: int, streamed: int) -> bool:
        """What the kernels' static_asserts accept: float32 in a TF32 mode, 64 owned rows
        (queries or keys) a warpgroup, a streamed tile wgmma.cuh has an n-size for."""
        return (self.dtype == "float32" and self.precision in ("fp32", "tf32") and self.num_warps % 4 == 0
                and owned == 16 * self.num_warps and streamed in (16, 32, 64) and self.head_dim_pad % 16 == 0)

    @property
    def _parts_text(self) -> str:
        return "TF32 big and small parts (3xTF32)" if self.parts == 2 else "TF32"

    @property
    def _staged_parts_text(self) -> str:
        """How the staged tiles hold their parts (``staging.parts_as_rows``: the row tiles'
        small parts as rows 16-31, the B operands of n32 score products)."""
        if self.score_parts_as_rows:
            return (f"{self._parts_text} in core-matrix order, the row tiles' small parts as their rows "
                    f"16-31 (one n32 wgmma takes big x (big | small) in the score products)")
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
            return self._tf32_tile(self._tf32_tile(LayoutBuilder(), names[0], (rows, self.head_dim_pad)), names[1],
                                   (rows, self.head_dim_pad))
        words = "float32 in each lane's wgmma A-register order, split into TF32 parts per k-step in registers"
        b = LayoutBuilder()
        for name in names:
            b = b.add(name, (1, rows, self.head_dim_pad), "float32", words)
        return b

    @property
    def stage_bytes(self) -> int:
        """Shared memory of one pipeline stage: the whole staged tile (its transposed tiles
        too, where the kernel makes them from the row tiles: ``_stage_tile``)."""
        return self._stage_tile.tile_bytes

    @property
    def _stage_tile(self) -> StagingConfig:
        """The staged tile as one stage holds it, its transposed tiles included."""
        raise NotImplementedError

    def _two_stages_fit(self, kept_bytes: int) -> bool:
        """Two stages of staged tiles (and their mbarriers) fit beside ``kept_bytes``."""
        return kept_bytes + 2 * (self.stage_bytes + self.BARRIERS * 8) <= SM90_SMEM_PER_BLOCK

    def _staged_tiles(self, builder: LayoutBuilder, name: str, what: str, shape: tuple,
                      free_barriers: bool = False) -> LayoutBuilder:
        """After the tiles a block keeps: one or two copies of the tile ``staging`` writes
        (two where they fit; kernels/wgmma_staging.cuh, stages_that_fit), and the
        mbarriers that count its bytes (BARRIERS per stage: the operands that land apart;
        with one stage and ``free_barriers``, two more that count the consumer warps done
        with each part, for a producer warpgroup)."""
        staging = self.staging
        two = self._two_stages_fit(builder.end)
        stages = 2 if two else 1
        how = (f"copied whole (cp.async.bulk) from {staging.kernel_name}'s tiles" if staging.transposed else
               f"the row tiles copied (cp.async.bulk) from {staging.kernel_name}'s, the transposed one made from "
               f"them by the producer warpgroup")
        builder = builder.add(name, (stages, *shape), "float32",
                              f"{stages} stage{'s' if two else ''} of {what}; {self._staged_parts_text}, {how}")
        if stages == 1 and self.SPLIT_ONE_STAGE:
            if free_barriers:
                return builder.add("barriers", (1, 4), "uint64", f"mbarriers: the stage's two parts "
                                   f"({self.SPLIT_ONE_STAGE}) have landed; each is free again (the producer "
                                   f"warpgroup's cue)")
            return builder.add("barriers", (1, 2), "uint64", f"mbarriers: the stage's two parts "
                               f"({self.SPLIT_ONE_STAGE}) have landed (each copied while the other is in use)")
        return builder.add("barriers", (stages, self.BARRIERS), "uint64", "mbarriers: a stage's copies have landed")


# Every sm_90 GPU's opt-in shared memory per block (H100, H200, GH200: 227 KiB): the
# wgmma kernels, which run on sm_90 alone, keep two pipeline stages where two fit in it
# (kernels/wgmma_staging.cuh, SM90_SMEM_PER_BLOCK).
SM90_SMEM_PER_BLOCK = 232448


@dataclasses.dataclass(frozen=True)
class StagingConfig:
    """A staging launch (kernels/wgmma_staging.cuh): the tiles a wgmma kernel streams,
    split into TF32 parts once per call and written as one pipeline stage of that
    kernel's shared memory holds them, so that the kernel copies them whole instead of
    every block splitting every tile again. ``operands``: "forward keys" (K, V^T),
    "dq keys" (K, V, K^T) or "dkdv queries" (Q, dO, Q^T, dO^T, lse, delta); or the row
    tiles alone, "dq key rows" (K, V) and "dkdv query rows" (Q, dO, lse, delta), where
    the kernel's producer warpgroup makes the transposed ones in shared memory;
    ``rows`` per tile. ``parts_as_rows`` (3xTF32, the backward's 16-row tiles whose row
    tiles are the B operands of n32 score products: ``WgmmaConfig.score_parts_as_rows``):
    each row tile's small part as rows 16-31 of one 32-row tile, after its big part."""

    HEADER: ClassVar[str] = "wgmma_staging.cuh"
    ARCH_SUFFIX: ClassVar[str] = "a"  # compiled beside the wgmma kernels it feeds
    threads: ClassVar[int] = 128
    TILES: ClassVar[dict] = {"forward keys": 2, "dq keys": 3, "dkdv queries": 4,  # row / transposed tiles
                             "dq key rows": 2, "dkdv query rows": 2}

    operands: str
    precision: str
    head_dim_pad: int
    rows: int
    parts_as_rows: bool = False

    @property
    def parts(self) -> int:
        return 2 if self.precision == "fp32" else 1

    @property
    def queries(self) -> bool:
        """Staged from Q and dO (per query head), else from K and V (per key/value head)."""
        return self.operands.startswith("dkdv")

    @property
    def transposed(self) -> bool:
        """The transposed tiles staged too (not made by the kernel)."""
        return not self.operands.endswith("rows")

    @property
    def tile_bytes(self) -> int:
        """One staged tile: its TF32 tiles' parts (and for queries lse and delta per row)."""
        rowwise = 2 * self.rows * 4 if self.queries else 0
        return self.TILES[self.operands] * self.parts * self.rows * self.head_dim_pad * 4 + rowwise

    def tiles(self, seqlen: int) -> int:
        return -(-seqlen // self.rows)

    def workspace_bytes(self, batch: int, heads: int, seqlen: int) -> int:
        """Global memory the staged tiles of one call take."""
        return batch * heads * self.tiles(seqlen) * self.tile_bytes

    @property
    def kernel_name(self) -> str:
        return "stage_queries_tf32" if self.queries else "stage_keys_tf32"

    @property
    def name_expression(self) -> str:
        op = MMA_OPS[self.precision]
        tail = (f", {str(self.transposed).lower()}, true" if self.parts_as_rows
                else "" if self.transposed else ", false")  # TRANSPOSED, PARTS_AS_ROWS
        if self.queries:
            return f"cupyattn::stage_queries_tf32<{op}, {self.head_dim_pad}, {self.rows}{tail}>"
        dq = "false" if self.operands == "forward keys" else "true"
        return f"cupyattn::stage_keys_tf32<{op}, {self.head_dim_pad}, {self.rows}, {dq}{tail}>"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return Layout(())  # static shared memory only (two 16-row pieces of an operand: stage_operand)


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
    def _stage_tile(self) -> StagingConfig:
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
            b = LayoutBuilder().add("q_tile", (1, self.block_m, d), "float32",
                                    "float32 in each lane's wgmma A-register order, split into TF32 parts "
                                    "per k-step in registers")
        else:
            b = self._tf32_tile(LayoutBuilder(), "q_tile", (self.block_m, d))
        return self._staged_tiles(b, "kv_tiles", "a key tile's K and V^T (V transposed: TF32 B operands "
                                  "are K-major)", (2, self.parts, n, d)).build()

    @property
    def accumulators_per_lane(self) -> int:  # O (head_dim), S and its two k-step accumulators
        return (self.head_dim_pad + 3 * self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # 16 warps leave 128 registers a lane: 3xTF32 with 64-key tiles spills 200 bytes
        # at head dim 64, one TF32 pass from head dim 160 (8-288 bytes; NVRTC 13.5, every
        # listed tile at head dims 16-256 that fits, causal and not: these two rules keep
        # out every spilling one, and 4 clean ones at 160-176). tests/test_compile.py
        # compiles the planned ones.
        if self.num_warps == 16 and self.precision == "fp32" and self.block_n > 32:
            return "3xTF32 with 64-key tiles spills at 16 warps (128 registers a lane)"
        if self.num_warps == 16 and self.head_dim_pad >= 160:
            return "head dims from 160 spill at 16 warps (128 registers a lane)"
        # Q in registers (3xTF32 from head dim 128; NVRTC 13.5, every listed tile at head
        # dims 128-256 that fits, causal and not): every 16-warp tile with 32 keys spills
        # at 128-144 (128-276 bytes), (256, 16, 16) at 144 causal; at 12 warps (192, 64, 12)
        # at 128 (128-396), (192, 32, 12) at 160-176 (8-68), (192, 16, 12) at 208-224 (8-60).
        # The rules keep those out, and (256, 16, 16) at 128 and (192, 16, 12) at 192 (clean).
        if self.q_in_registers and self.num_warps == 16:
            return "3xTF32 with Q in registers spills at 16 warps (128 registers a lane)"
        if self.q_in_registers and self.num_warps == 12 and self.head_dim_pad + 2 * self.block_n > 208:
            return ("3xTF32 with Q in registers spills at 12 warps (168 registers a lane) where head dim + "
                    "2 x keys a tile exceeds 208")
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
        return (f"two warps share each 16 keys, each keeping dK's and dV's {self.head_dim_pad // 2} of "
                f"{self.head_dim_pad} columns; both compute S^T and dP^T")

    @property
    def valid(self) -> bool:
        return (self.block_n % 16 == 0 and self.num_warps * 16 == self.block_n * self.d_split
                and self.head_dim_pad % (16 * self.d_split) == 0 and self.block_m % 16 == 0)

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        b = self._tile(LayoutBuilder(), "k_tile", self.block_n)
        b = self._tile(b, "v_tile", self.block_n)
        b = self._tile(b, "q_tile", self.block_m, self.STAGES)
        b = self._tile(b, "do_tile", self.block_m, self.STAGES)
        return (b.add("lse_tile", (self.STAGES, self.block_m), "float32", "lse * log2(e) per query row")
                .add("delta_tile", (self.STAGES, self.block_m), "float32", "rowsum(dO * O) per query row")
                .build())

    BUDGET_SM90: ClassVar[int] = 192  # (64, 64, 4) at head dim 128: 255 registers, no spill
    BUDGET_SM100: ClassVar[int] = 80
    # Staged halves spill 12 bytes at 192 on sm_90. 3xTF32 counts S^T and dP^T twice
    # (register_load): on sm_90 (64, 64, 4) at head dim 64 (128 accumulators) spills
    # while (16, 32, 4) at 192 (112) does not; weighted, the clean tiles are <= 128
    # and the spilling ones >= 160, (16, 16, 2) at 256 by 8 bytes
    # (scripts/spill_map.py --modes float32:fp32).
    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 144}, "bf16": {(8, 0): 160}, "fp16": {(8, 0): 160}}
    TF32_SPILLS_SM100: ClassVar[bool] = True

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim / d_split each), S^T and dP^T (block_m each)
        return self.head_dim_pad // self.d_split + self.block_m

    @property
    def register_load(self) -> tuple[int, str]:
        if self.float32_mode != "fp32":
            return super().register_load
        return (self.head_dim_pad // self.d_split + 2 * self.block_m,
                "float32 accumulators per lane counting S^T and dP^T twice (3xTF32)")


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
    # 3xTF32 counts S and dP one and a half times (register_load): on sm_90 (64, 64, 4)
    # at head dim 128 and (16, 16, 1) at 256 (128 and 144 accumulators) spill while
    # (64, 32, 4) at 192 (128) does not; weighted, clean <= 144, spilling >= 152. On
    # sm_80 that (64, 32, 4) spills too (weighted 144; (16, 16, 1) there, 120, is clean).
    PRECISION_BUDGETS: ClassVar[dict] = {"fp32": {(8, 0): 128, (9, 0): 144}}
    TF32_SPILLS_SM100: ClassVar[bool] = True
    # (16, 16, 1), the smallest tile, spills from head dim 208 on sm_80 (116 bytes) and
    # from 224 on sm_90 (216) although (64, 32, 4) at 192, with more accumulators, is clean.
    FP32_MAX_HEAD_DIM: ClassVar[dict] = {(8, 0): 192, (9, 0): 208}

    @property
    def accumulators_per_lane(self) -> int:  # dQ (head_dim), S and dP (block_n each)
        return (self.head_dim_pad + 2 * self.block_n) // 2

    @property
    def register_load(self) -> tuple[int, str]:
        if self.float32_mode != "fp32":
            return super().register_load
        return ((self.head_dim_pad + 3 * self.block_n) // 2,
                "float32 accumulators per lane counting S and dP one and a half times (3xTF32)")


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
        return (self._valid_tile(owned=self.block_n * self.d_split, streamed=self.block_m) and self.d_split in (1, 2)
                and self.block_n % 64 == 0 and self.head_dim_pad % (16 * self.d_split) == 0)

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        d, m = self.head_dim_pad, self.block_m
        if self.ring:
            return self._kept_tiles().add(
                "q_tiles", (3, self.parts * m * d + 2 * m), "float32", "a ring of 3 slots of one operand tile each, "
                f"through which a query tile's dO, Q, dO^T (with lse * log2(e) and delta per row) and Q^T pass in "
                f"turn, each slot refilled once its tile is used; {self._staged_parts_text}, "
                + (f"copied (cp.async.bulk) from {self.staging.kernel_name}'s tiles" if self.staging.transposed else
                   f"dO (with lse and delta) and Q copied (cp.async.bulk) from {self.staging.kernel_name}'s tiles, "
                   f"dO^T and Q^T made from them by the producer warpgroup")).add(
                "barriers", (1, 6 if self.producer_warp else 3), "uint64", "mbarriers: a ring slot's tile has landed"
                + ("; a slot is free again (the producer warpgroup's cue)" if self.producer_warp else "")).build()
        return self._staged_tiles(self._kept_tiles(), "q_tiles", "a query tile's Q, dO, Q^T and dO^T "
                                  "(transposed: the B operands of dK = dS^T Q and dV = P^T dO), then "
                                  "lse * log2(e) and delta per row", (4 * self.parts * m * d + 2 * m,)).build()

    @property
    def work_split(self) -> str | None:
        if self.d_split == 1:
            return None
        return (f"two warpgroups share each 64 keys, each keeping dK's and dV's {self.head_dim_pad // 2} of "
                f"{self.head_dim_pad} columns; the first computes S^T, the second dP^T, and they swap them "
                f"through shared memory" + ("; a third warpgroup issues the ring's copies" if self.producer_warp
                                            else "") + (", and makes dO^T and Q^T from dO and Q there"
                                                        if self.rows_staged else ""))

    @property
    def producer_warp(self) -> bool:
        """A pair of warpgroups (d_split 2) whose query tiles stream through the ring: a
        third warpgroup issues the ring's copies as the consumer warps free its slots
        (kernels/attn_bwd_wgmma.cuh, dkdv_producer_warp), where they met at block
        barriers before. 3xTF32 ("fp32") only: one TF32 pass measured slower with it."""
        return self.d_split == 2 and self.ring and self.parts == 2

    # The producer warpgroup making dO^T and Q^T in the ring from staged Q and dO (half the
    # staged bytes; kernels/attn_bwd_wgmma.cuh, BwdDkdvWgmmaLayout::ROWS_STAGED): the same
    # bits as the staged transposes did (twenty-seventh session; since the planned score
    # products take B's parts as rows, which these row tiles do not, float32 accuracy:
    # tests/test_emulated_kernels.py on the CPU, test_backward_gpu on the H200), but the
    # "fp32" D=256 backward took 1.9-2.1x as long with it (its three transposer warps
    # cannot keep up: BENCHMARKS.md, twenty-seventh session), so not planned.
    PRODUCER_MAKES_TRANSPOSED: ClassVar[bool] = False

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

    ROWS_OPERANDS: ClassVar[str] = "dkdv query rows"  # (rows_staged: Q, dO, lse, delta; half the bytes)

    @property
    def _stage_tile(self) -> StagingConfig:
        # 3xTF32 16-query tiles with K and V as words (BwdDkdvWgmmaLayout::SCORE_PARTS_AS_ROWS):
        # Q's and dO's row tiles with their small parts as rows 16-31, so that the score
        # products take big x (big | small) as one n32 wgmma (wgmma_tiles.cuh, words_by_rows).
        parts_as_rows = self.parts == 2 and self.block_m == 16 and self.kv_in_registers
        return StagingConfig("dkdv queries", self.precision, self.head_dim_pad, self.block_m,
                             parts_as_rows=parts_as_rows)

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim / d_split each), S^T and dP^T (block_m each)
        return self.head_dim_pad // self.d_split + self.block_m

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # Every listed tile at head dims 16-256 through ptxas (NVRTC 13.5, causal and not;
        # the staged kernel, 542 dK/dV and dQ tiles that fit): these rules catch every one
        # that spills (and 21 clean dK/dV tiles with them, 20 at head dims 16-112).
        # tests/test_compile.py compiles the planned ones.
        # (Causal (16,64,4) "tf32" at 208 took 255 registers and spilled 8 bytes; eighteenth
        # session, scripts/rule_audit.py --admitted --causal yes.)
        if self.head_dim_pad // self.d_split >= 208:
            return "dK and dV (head_dim / 2 / d_split accumulators a lane each) spill from head dim 208 a warpgroup"
        # (One TF32 pass, 16-query tiles: (16,256,16) at 64 took 112-126 registers, no
        # spills; at 96, 288 bytes; at 80 causal, with the kept tiles loaded 8 chunks at a
        # time, 108-232. (32,256,16) at 64 spilled 36.)
        if self.num_warps == 16 and (self.precision == "fp32"
                                     or self.head_dim_pad >= (80 if self.block_m == 16 else 64)):
            return ("16 warps leave 128 registers a lane: spills in 3xTF32, and from head dim 64 "
                    "(16-query tiles: 80)")
        if self.num_warps == 12 and self.head_dim_pad >= (32 if self.precision == "fp32" else 112):
            return "12 warps leave 168 registers a lane: spills in 3xTF32 from head dim 32, else from 112"
        # (Through the ring, one product at a time: (64,128,8) at 64 took 234-238 registers.
        # Causal (64,128,8) and (64,64,4) at 48, both products at once, spilled 28 bytes.)
        if self.precision == "fp32" and self.block_m == 64 and self.head_dim_pad >= 48 and not self.ring:
            return "3xTF32 with 64-query tiles spills from head dim 48 (unless through the ring)"
        # K and V words (kv_in_registers) take a k-step's A operands in registers too: at
        # 128-192 (NVRTC 13.5) (32,64,4) at 128 spilled 276 bytes, (16,64,4) at 192 992.
        # The ring computes S^T and dP^T one after the other (one product's k-step words
        # and fresh accumulators at a time): (32,128,8) at 128 and (16,128,8) at 160 take
        # 239-254 registers, no spills; (32,64,4) at 160 spilled 28 bytes.
        words_limit = 192 if self.ring else 160
        if self.kv_in_registers and self.head_dim_pad // self.d_split + 2 * self.block_m > words_limit:
            return (f"3xTF32 with K and V words spills where head_dim / d_split + 2 x block_m > {words_limit}"
                    f"{' (products one at a time through the ring)' if self.ring else ''}")
        # ((32,64,4) "tf32" at 176-192 took 250-252 registers, no spills; at 208, 260 bytes.
        # With the kept tiles loaded 8 chunks at a time, 192 not causal took 255 and spilled 68.)
        if self.block_m == 32 and self.head_dim_pad // self.d_split >= 192:
            return "32-query tiles spill from 192 head-dim columns a warpgroup"
        # One TF32 pass, 64-query tiles, both products at once: (64,64,4) at 144 not causal
        # spilled 20-44 bytes with the kept tiles loaded 8 chunks at a time (255 registers
        # before; rule_audit.py --admitted, nineteenth session).
        if self.parts == 1 and self.block_m == 64 and not self.ring and self.head_dim_pad // self.d_split >= 144:
            return "one TF32 pass with 64-query tiles spills from head dim 144 (unless through the ring)"
        # One TF32 pass through the ring: (64,128,8) at 128, (32,128,8) at 160, (32,64,8) at
        # 256 took 204-240 registers, no spills; (64,64,4) at 160 spilled 24-56 bytes.
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
        return b.add("ds_tiles", (n // 64, self.parts, m, 64), "float32", "each warpgroup's dS (its 64 keys), the B "
                     f"operand of dQ^T; {self._parts_text} in core-matrix order")

    @property
    def accumulators_per_lane(self) -> int:  # dK, dV (head_dim each), S^T and dP^T, dQ^T (block_m each)
        return self.head_dim_pad + 3 * self.block_m // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # Every listed tile that fits beside K^T, at head dims 64, 128 and 192, causal and
        # not, compiled without spills (NVRTC 13.5, 110-251 registers; none fits at 256).
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
        return (f"two warpgroups share the 64 query rows, each keeping dQ's {self.head_dim_pad // 2} of "
                f"{self.head_dim_pad} columns; the first computes S, the second dP, and they swap them "
                f"through shared memory" + ("; a third warpgroup issues the copies" if self.producer_warp else "")
                + (", and makes K^T from K" if self.rows_staged else ""))

    @functools.cached_property
    def producer_warp(self) -> bool:
        """A pair of warpgroups (d_split 2) with one stage: a producer warpgroup issues the stage's
        copies as the consumer warps free its parts (kernels/attn_bwd_wgmma.cuh,
        dq_producer_warp), where they met at a block barrier before."""
        return self.d_split == 2 and not self._two_stages_fit(self._kept_tiles().end)

    # The producer warpgroup making K^T from staged K (a third fewer staged bytes;
    # BwdDqWgmmaLayout::ROWS_STAGED): as dK/dV's, as accurate, and slower ("fp32" D=192
    # backward, where only dQ takes it: +23% causal, +31% not), so not planned.
    PRODUCER_MAKES_TRANSPOSED: ClassVar[bool] = False

    @property
    def valid(self) -> bool:
        return (self._valid_tile(owned=self.block_m * self.d_split, streamed=self.block_n)
                and (self.d_split == 1 or (self.d_split == 2 and self.block_m == 64))
                and self.head_dim_pad % (16 * self.d_split) == 0)

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
        return self._staged_tiles(self._kept_tiles(), "kv_tiles", "a key tile's K, V and K^T (K transposed: the "
                                  "B operand of dQ = dS K)", (3, self.parts, self.block_n, self.head_dim_pad),
                                  free_barriers=self.producer_warp).build()

    def _kept_tiles(self) -> LayoutBuilder:
        """The tiles a block keeps, before the staged key tiles."""
        return self._kept_pair(("q_tile", "do_tile"), self.block_m, self.q_in_registers)

    ROWS_OPERANDS: ClassVar[str] = "dq key rows"  # (rows_staged: K and V; a third fewer bytes)

    @property
    def _stage_tile(self) -> StagingConfig:
        # As dK/dV's (BwdDqWgmmaLayout::SCORE_PARTS_AS_ROWS): 16-key tiles with Q and dO as
        # words take K's and V's row tiles with their parts as rows.
        parts_as_rows = self.parts == 2 and self.block_n == 16 and self.q_in_registers
        return StagingConfig("dq keys", self.precision, self.head_dim_pad, self.block_n, parts_as_rows=parts_as_rows)

    @property
    def accumulators_per_lane(self) -> int:  # dQ (head_dim / d_split), S and dP (block_n each)
        return (self.head_dim_pad // self.d_split + 2 * self.block_n) // 2

    def register_reason(self, compute_capability: tuple[int, int]) -> str | None:
        # As for dK/dV: from every listed tile at head dims 16-256 through ptxas.
        # 3xTF32 with 64-key tiles computes S, then dP (kernels/attn_bwd_wgmma.cuh): (128,64,8)
        # and (64,64,4) at head dims 16-64 (where they fit), causal and not, took 167-244
        # registers, no spills; both products at once took 250-255 and spilled at 48.
        if self.precision == "fp32" and self.num_warps > 8:
            return "3xTF32 spills with more than 8 warps (168 registers a lane or fewer)"
        return None


@dataclasses.dataclass(frozen=True)
class BwdDkdvSimtConfig(SimtConfig):
    """``attn_bwd_dkdv_simt``: dK and dV for a tile of keys (kernels/attn_bwd_simt.cuh)."""

    KERNEL: ClassVar[str] = "cupyattn::attn_bwd_dkdv_simt"
    LAYOUT: ClassVar[str] = "cupyattn::BwdDkdvSimtLayout"
    HEADER: ClassVar[str] = "attn_bwd_simt.cuh"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return (LayoutBuilder()
                .add("k_tile", (self.block_n, self.head_dim_pad), self.dtype)
                .add("v_tile", (self.block_n, self.head_dim_v_pad), self.dtype)
                .add("q_tile", (self.block_m, self.head_dim_pad + self.vec), self.dtype, _PADDED)
                .add("do_tile", (self.block_m, self.head_dim_v_pad + self.vec), self.dtype, _PADDED)
                .build())

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
        return (LayoutBuilder()
                .add("q_tile", (self.block_m, self.head_dim_pad), self.dtype)
                .add("do_tile", (self.block_m, self.head_dim_v_pad), self.dtype)
                .add("k_tile", (self.block_n, self.head_dim_pad + self.vec), self.dtype, _PADDED)
                .add("v_tile", (self.block_n, self.head_dim_v_pad + self.vec), self.dtype, _PADDED)
                .build())

    @property
    def accumulators_per_lane(self) -> int:  # dQ for block_m / num_warps rows
        return self.block_m // self.num_warps * self._words_per_lane(self.head_dim_pad) * self.vec


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


def check_expression(config) -> str | None:
    """The ``check_layout`` instantiation that pins the kernel's layout to the planner's
    (``check_staged_layout`` for a kernel fed by staged tiles: their bytes too)."""
    lay = config.layout
    if not lay.buffers:
        return None
    offsets = ", ".join(str(b.offset) for b in lay)
    layout = getattr(config, "checked_layout_expression", config.layout_expression)
    staging = getattr(config, "staging", None)
    if staging is not None:
        parts_as_rows = str(staging.parts_as_rows).lower()
        return f"cupyattn::check_staged_layout<{layout}, {staging.tile_bytes}, {parts_as_rows}, {lay.total}, {offsets}>"
    return f"cupyattn::check_layout<{layout}, {lay.total}, {offsets}>"


@dataclasses.dataclass(frozen=True)
class Rejected:
    name_expression: str
    smem_bytes: int
    limit: int

    @property
    def over_by(self) -> int:
        return self.smem_bytes - self.limit


@dataclasses.dataclass(frozen=True)
class Plan:
    config: "SimtConfig | MmaConfig"
    device: DeviceSpec
    problem: AttentionProblem
    rejected: tuple[Rejected, ...]
    reason: str
    # Tensor-core tiles left out before the shared-memory check: (name, why) for
    # each tile that would spill registers on this architecture.
    register_skipped: tuple[tuple[str, str], ...] = ()

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return self.config.layout

    @property
    def precision(self) -> str:
        """The precision mode that runs: the tensor-core config's, or on CUDA cores (FFMA,
        float32 arithmetic) the first allowed mode, whose operand rounding the launch
        applies to copies of the inputs ("tf32", "bf16", "fp16"; api._operands_for)."""
        return getattr(self.config, "precision", self.problem.precision[0])

    @property
    def work_split(self) -> str | None:
        """How the block's warps share its rows, where they do (d_split tiles), else None."""
        return getattr(self.config, "work_split", None)

    @property
    def precision_text(self) -> str:
        if isinstance(self.config, WgmmaConfig):
            return (f"{self.precision}: {PRECISION_TEXT[self.precision]} on tensor cores, warpgroup MMA "
                    "(wgmma, sm_90a), the kernel family measured faster here (plan._forward_families, "
                    "plan._backward_families)")
        if isinstance(self.config, MmaConfig):
            return f"{self.precision}: {PRECISION_TEXT[self.precision]} on tensor cores"
        rounded = {"tf32": "TF32", "bf16": "bfloat16", "fp16": "float16"}
        if self.problem.dtype == "float32" and self.precision in rounded:
            return (f"{self.precision}: float32 arithmetic (FFMA) on CUDA cores, on copies of the "
                    f"inputs rounded to {rounded[self.precision]}")
        return f"{self.precision}: float32 arithmetic (FFMA) on CUDA cores"

    @property
    def smem_bytes(self) -> int:
        return self.layout.total

    @property
    def blocks_per_sm_by_smem(self) -> int:
        return blocks_per_sm(self.smem_bytes, self.config.threads, self.device)

    def describe(self) -> str:
        d = self.device
        lines = [
            f"{self.config.name_expression}",
            f"  device: {d.summary()}",
            f"  shared memory: {self.smem_bytes} of {d.smem_per_block_optin} bytes opt-in "
            f"({100 * self.smem_bytes / d.smem_per_block_optin:.0f}%), "
            f"{self.blocks_per_sm_by_smem} block(s) per SM by shared memory",
            f"  why: {self.reason}",
            f"  precision: {self.precision_text}",
        ]
        if self.work_split:
            lines.append(f"  work split: {self.work_split}")
        lines.append(self.layout.table())
        staging = getattr(self.config, "staging", None)
        if staging is not None:
            p = self.problem
            heads, seqlen = (p.heads_q, p.seqlen_q) if staging.queries else (p.heads_kv, p.seqlen_k)
            lines.append(f"  staged first by {staging.name_expression}: "
                         f"{staging.workspace_bytes(p.batch, heads, seqlen)} bytes of global memory "
                         f"({staging.tiles(seqlen)} tiles of {staging.tile_bytes} bytes a head)")
        for r in self.rejected:
            lines.append(f"  rejected {r.name_expression}: {r.smem_bytes} bytes, "
                         f"{r.over_by} over the {r.limit}-byte limit")
        for name, why in self.register_skipped:
            lines.append(f"  skipped {name}: {why}")
        return "\n".join(lines)


class PlanError(ValueError):
    """No candidate fits; the message lists every candidate with its bytes and the limit."""


def blocks_per_sm(smem_bytes: int, threads: int, device: DeviceSpec) -> int:
    by_smem = device.smem_per_sm // (smem_bytes + device.smem_reserved_per_block)
    by_threads = device.max_threads_per_sm // threads
    return max(0, min(by_smem, by_threads, device.max_blocks_per_sm))


# SIMT candidates (block_m, block_n, num_warps), most preferred first.
#
# Forward and dQ: a block keeps block_m query rows and streams K/V tiles, so a
# larger block_m reuses each tile loaded into shared memory for more rows. Each
# warp keeps block_m / num_warps rows of its output in registers; past 32
# accumulators per lane (8 rows at head dim 256) ptxas needs ~168 registers for
# sm_90, so those head dims take the 8-warp 32-row tiles instead (and, with no
# minimum-blocks launch bound, it spilled). The smallest tiles exist so that
# float32 at head dim 256 fits the 64 KiB of a T4 (8 x 8 forward tiles: 24.3 KiB).
FWD_SIMT_TILES = (
    (64, 64, 8),
    (64, 32, 8),
    (32, 64, 4),
    (32, 32, 4),
    (32, 64, 8),
    (32, 32, 8),
    (16, 32, 4),
    (16, 16, 4),
    (8, 16, 2),
    (8, 8, 2),
)
# dK/dV: a block keeps block_n keys (K, V and their dK, dV accumulators) and
# streams Q/dO tiles of block_m rows; warps split the keys, so the accumulator
# cap (dK + dV per key) leaves 4 keys per warp at head dim 128, 2 at 256. No
# 16-warp tiles: at 512 threads a lane gets 128 registers, and ptxas spilled
# (up to 340 bytes) for sm_100 and sm_120 at float32 head dims 64 and 96.
BWD_DKDV_SIMT_TILES = (
    (64, 64, 8),
    (64, 32, 8),
    (32, 64, 8),
    (32, 32, 8),
    (32, 16, 8),
    (16, 16, 4),
    (16, 16, 8),
    (16, 8, 4),
    (8, 8, 4),
    (8, 8, 2),
)
MAX_ACCUMULATORS_PER_LANE = 32
# Tensor-core tiles (block_m, block_n, num_warps), most preferred first, ordered by
# the whole-call times of scripts/tune_tiles.py on the H200 (float16, B=4, H=16,
# S=4096, non-causal; BENCHMARKS.md "Tile choice") among the tiles that compile
# without spills (``fits_registers``); each list keeps smaller tiles for GPUs with
# less shared memory.
#
# Forward: a warp owns block_m / num_warps query rows. At 16 rows a warp reads one
# 512-byte ldmatrix x4 of K or V per two mma, as much shared-memory bandwidth as the
# tensor cores use; 32 rows (two m-tiles) feed each fragment to two m-tiles.
# Measured, ms: D=64 (128,64,4) 1.43 < (64,64,4) 1.60 < (128,32,8) 1.78;
# D=128 (128,64,4) 2.19 [spills] < (128,32,4) 2.46 < (128,64,8) 2.78 ~ (64,64,4) 2.81;
# D=256 (128,64,8) 4.86 < (64,32,4) 5.25 < (128,32,8) 5.62.
FWD_MMA_TILES = (
    (128, 64, 4),
    (128, 32, 4),
    (128, 64, 8),
    (64, 64, 4),
    (64, 32, 4),
    (128, 32, 8),
    (32, 32, 2),
    (16, 16, 1),
)
# Backward dK/dV: a block keeps block_n keys (16 per warp; two warps share 16 keys
# and split the head dim when num_warps * 16 = 2 * block_n) and streams block_m
# query rows. Measured (whole backward), ms: D=64 (64,64,4) 5.69 < (64,128,8) 6.05
# < (32,64,4) 6.78; D=128 (64,64,4) 8.87 [sm_90 only: spills on sm_80-sm_89]
# < (32,64,4) 10.25; D=256 (32,32,4) 25.96 < (32,64,8) 28.88 < (16,16,2) 29.83.
BWD_DKDV_MMA_TILES = (
    (64, 64, 4),
    (64, 128, 8),
    (32, 64, 4),
    (32, 32, 4),
    (16, 16, 1),
    (32, 64, 8),
    (16, 16, 2),
    (16, 32, 4),
)
# Backward dQ: a block keeps block_m query rows (16 per warp) and streams block_n
# keys. Measured: D=64 (32,32,2) 5.55 ~ (64,32,4) 5.75 ~ (64,64,4) 5.80;
# D=128 (64,64,4) 8.77 < (64,32,4) 9.20; D=256 (128,32,8) 26.96 < (64,64,4) 28.55.
BWD_DQ_MMA_TILES = (
    (64, 64, 4),
    (128, 32, 8),
    (64, 32, 4),
    (128, 64, 8),
    (32, 32, 2),
    (16, 16, 1),
)


# wgmma forward (float32 "fp32" / "tf32" on sm_90): a warpgroup owns 64 query rows, so
# block_m = 16 * num_warps; key tiles come split once per call (StagingConfig), so
# the tiles that fit and fill the GPU are ordered by mode, head dim and causality
# (FWD_WGMMA_FIRST); the rest follow in this order.
FWD_WGMMA_TILES = (
    (192, 64, 12),
    (128, 64, 8),
    (256, 32, 16),
    (128, 32, 8),
    (192, 32, 12),
    (64, 64, 4),
    (64, 32, 4),
    (128, 16, 8),
    (192, 16, 12),
    (256, 16, 16),
    (64, 16, 4),
)
# The fastest three of each sweep on the H200 (`tune_tiles.py --dtype float32 --precision
# fp32|tf32 [--causal] --families wgmma`, B=4, H=16, S=4096, whole-call ms; BENCHMARKS.md,
# eighth session), by (mode, head dim class, causal); a head dim takes the class of the
# next measured one (64, 128, 256):
#   tf32  64 (128,64,8) 1.39 < (128,32,8) 1.59 < (64,64,4) 1.65;  causal (128,64,8) 1.15 < (64,32,4) 1.32 < (128,32,8) 1.36
#   tf32 128 (192,64,12) 2.46 < (128,64,8) 2.58 < (256,32,16) 2.81;  causal (192,64,12) 2.01 < (256,32,16) 2.18 < (128,64,8) 2.20
#   tf32 256 (64,64,4) 5.23 < (128,32,8) 5.60 < (64,32,4) 7.04;  causal (128,32,8) 3.95 < (64,64,4) 4.38 < (192,16,12) 4.78
#   fp32  64 (192,64,12) 2.92 < (128,64,8) 3.10 < (256,32,16) 3.33;  causal (192,64,12) 2.43 < (256,32,16) 2.53 < (128,64,8) 2.55
#   fp32 128 (128,32,8) 6.51 < (64,64,4) 6.77 < (64,32,4) 8.17;  causal (128,32,8) 4.66 < (64,64,4) 5.42 < (192,16,12) 5.97
#            (Q's two parts in shared memory: "fp32" head dims 80-112 still, their class 112)
# "fp32" from head dim 128 keeps Q in registers (FwdWgmmaConfig.q_in_registers: Q takes
# half the bytes); the same sweep then (twelfth session; tiles the register rule keeps
# out not listed), its head dim classes 128 (up to 176) and 256:
#   fp32 128 (128,64,8) 5.93 < (192,32,12) 6.70 < (128,32,8) 6.92;  causal (128,64,8) 4.06 < (192,32,12) 4.32 < (128,32,8) 4.53
#   fp32 144 (128,64,8) 7.56 < (192,32,12) 8.62 < (128,32,8) 8.98;  causal (128,64,8) 4.82 < (192,32,12) 5.32 < (128,32,8) 6.01
#   fp32 176 (128,32,8) 10.74 < (64,64,4) 12.13 < (192,16,12) 13.02;  causal (128,32,8) 6.60 < (64,64,4) 7.90 < (192,16,12) 8.50
#   fp32 192 (128,32,8) 10.00 < (192,16,12) 11.98 < (64,32,4) 13.62;  causal (128,32,8) 6.02 < (192,16,12) 7.54 < (128,16,8) 8.55
#   fp32 256 (128,16,8) 17.05 < (64,32,4) 17.27 < (64,16,4) 27.06;  causal (128,16,8) 10.19 < (64,32,4) 10.93 < (64,16,4) 16.50
# (with Q's two parts in shared memory: 176 (64,32,4) 13.25; 256 (64,16,4) 19.94, causal
# 12.97, the only tile that fitted).
FWD_WGMMA_FIRST = {
    ("tf32", 64, False): ((128, 64, 8), (128, 32, 8), (64, 64, 4)),
    ("tf32", 64, True): ((128, 64, 8), (64, 32, 4), (128, 32, 8)),
    ("tf32", 128, False): ((192, 64, 12), (128, 64, 8), (256, 32, 16)),
    ("tf32", 128, True): ((192, 64, 12), (256, 32, 16), (128, 64, 8)),
    ("tf32", 256, False): ((64, 64, 4), (128, 32, 8), (64, 32, 4)),
    ("tf32", 256, True): ((128, 32, 8), (64, 64, 4), (192, 16, 12)),
    ("fp32", 64, False): ((192, 64, 12), (128, 64, 8), (256, 32, 16)),
    ("fp32", 64, True): ((192, 64, 12), (256, 32, 16), (128, 64, 8)),
    ("fp32", 112, False): ((128, 32, 8), (64, 64, 4), (64, 32, 4)),  # head dims 80-112
    ("fp32", 112, True): ((128, 32, 8), (64, 64, 4), (192, 16, 12)),
    ("fp32", 128, False): ((128, 64, 8), (192, 32, 12), (128, 32, 8)),  # 128-176
    ("fp32", 128, True): ((128, 64, 8), (192, 32, 12), (128, 32, 8)),
    ("fp32", 256, False): ((128, 32, 8), (128, 16, 8), (64, 32, 4)),  # 192-256
    ("fp32", 256, True): ((128, 32, 8), (128, 16, 8), (64, 32, 4)),
}


# wgmma backward (float32 "fp32" / "tf32" on sm_90): dK/dV, a warpgroup owns 64 keys
# (block_n = 16 * num_warps) and streams block_m query rows; dQ, a warpgroup owns 64
# query rows (block_m = 16 * num_warps) and streams block_n keys. Measured on the H200
# (`tune_tiles.py --dtype float32 --precision fp32|tf32 --families
# dkdv_wgmma,dq_wgmma,dkdv,dq`, B=4, H=16, S=4096, not causal, whole backward ms, the
# other pass as planned): dK/dV "tf32" D=64 (32,256,16) 8.94 < (32,192,12) 10.31 <
# (16,256,16) 10.48 < (16,128,8) 10.98 < (64,128,8) 11.51 < (16,192,12) 11.79 <
# (32,128,8) 12.36 < (16,64,4) 14.25 < (32,64,4) 14.95 < (64,64,4) 21.31; D=128
# (32,128,8) 22.44 < (16,128,8) 25.28 < (16,64,4) 30.34 < (32,64,4) 40.13; "fp32" D=64
# (32,128,8) 21.94 < (16,128,8) 25.04 < (16,64,4) 29.70 < (32,64,4) 37.51; D=128 (16,64,4)
# 94.93 (alone). dQ "tf32" D=64 (256,32,16) 8.32 < (128,32,8) 8.80 < (256,16,16) 9.22 <
# (192,32,12) 9.30 < (128,16,8) 9.73 < (128,64,8) 10.08 < (64,32,4) 10.78 < (64,16,4)
# 10.88 < (64,64,4) 16.78; D=128 (128,32,8) 22.54 < (128,16,8) 24.23 < (64,16,4) 27.33;
# D=256 (64,16,4) 87.87 (alone); "fp32" D=64 (128,32,8) 21.95 < (128,16,8) 24.10 <
# (64,16,4) 25.90; D=128 (64,16,4) 94.04 (alone). With the streamed tiles staged (ninth
# session, same sweep): dK/dV "tf32" D=64 (32,192,12) 6.88 < (64,128,8) 7.07 < (16,128,8)
# 7.15; D=128 (32,128,8) 13.55 < (16,128,8) 14.48; "fp32" D=64 (32,128,8) 15.72 <
# (16,128,8) 16.91; dQ "tf32" D=64 (128,32,8) 6.73 < (256,32,16) 6.88 < (192,32,12) 7.34;
# D=128 (128,64,8) 13.68 ~ (128,32,8) 13.81 < (64,16,4) 14.51; "fp32" D=64 (128,32,8)
# 15.63 < (64,16,4) 17.25; D=128 (64,32,4) 46.29 ~ (64,16,4) 46.46; with Q and dO as float32
# words (thirteenth session) D=128 (128,32,8) 35.51 < (128,16,8) 36.77 < (64,32,4) 41.21 <
# (64,16,4) 43.37, and D=256 (64,16,4) 300.01 (the only tile that fits).
# dQ (64,32,4) before the pair (64,32,8), (64,16,8): one warpgroup and 32-key tiles
# where the wider tiles do not fit ("tf32" from head dim 184, "fp32" 88-112 and 168-176;
# nineteenth session, `tune_tiles.py --dtype float32 --precision tf32|fp32 [--causal]
# --families dq_wgmma --tiles 64x32x8,64x32x4[,64x16x8]`, whole backward ms, not causal /
# causal, (64,32,4) against the pair planned before): "tf32" D=192 24.40 / 14.41 against
# 25.35 / 14.88, D=224 27.85 / 16.13 against 28.96 / 17.01, D=256 26.25 / 15.35 against
# 26.98 / 15.78; "fp32" D=96 28.43 / 15.72 against 30.38 / 16.88, D=112 34.34 / 18.94
# against 36.32 / 20.01, D=176 47.00 / 25.40 against (64,16,8) 53.27 / 29.37. (Head dims
# 184, 208 and 240 and "fp32" 88 / 104 / 168 follow their neighbours, unmeasured. "fp32" from
# 192 (64,32,4) does not fit; (64,16,4) against (64,16,8) 69.16 / 37.50 against 69.50 /
# 37.12 at 256, 52.66 / 28.66 against 53.43 / 28.90 at 192: kept as listed.)
# (16,64,8) and (32,64,8), d_split 2 (compiled for sm_90a without spills at every head
# dim 32-256 a multiple of 32 where they fit, causal and not, 64-219 registers): the
# only wgmma dK/dV tiles from head dim 208. Timed (eleventh session, whole backward
# ms, the mma.sync family in the same call): "tf32" D=256 (16,64,8) 44.64 against
# mma.sync (32,32,4) 61.76, causal 23.58 against 35.37 ((32,64,8) needs 262408 bytes
# there); where other tiles fit they are slower: "tf32" D=128 causal (32,64,8) 9.74 and
# (16,64,8) 12.05 against (32,128,8) 7.72; "fp32" D=128 (16,64,8) 55.14 against
# (16,64,4) 47.15. Last in the list, so planned only from head dim 208.
# "fp32" from head dim 128 keeps K and V as float32 words (BwdDkdvWgmmaConfig.kv_in_registers:
# half their bytes), so 8-warp tiles fit at 128 and (16,64,8) at 160-224; same sweep
# (thirteenth session, whole backward ms): D=128 (16,128,8) 29.63 < (32,64,8) 33.92 <
# (16,64,4) 38.54 < (16,64,8) 43.95 (main's (16,64,4) with two parts: 35.2-35.6 in the same
# session's A/B). At 64 the words measured no faster (A/B 14.11 vs 14.11, causal 7.65 vs
# 7.83: its (32,128,8) got a second stage only), so they start at 128 as dQ's do.
# "fp32" at 256 (fourteenth session): (16,64,8) with its query tiles through a ring of
# three slots (BwdDkdvWgmmaConfig.ring; no whole staged tile fits beside K and V's words),
# where FFMA ran before: A/B in one call, whole backward 300.16 -> 108.08 ms, causal
# 165.76 -> 55.94 (B=4, H=16, S=4096).
# The ring computes S^T and dP^T one after the other, so its register rule is looser
# (register_reason): "fp32" (32,128,8) at 128 and (16,128,8) at 152-160 go through it
# (seventeenth session, `ab_trees --cases fp32:128,fp32:160 --pass bwd`, whole backward
# ms, as planned before / after): D=128 (16,128,8) 25.90 -> (32,128,8) 24.08, causal
# 14.06 -> 13.12; D=160 (16,64,8) 45.09 -> (16,128,8) 39.46, causal 23.96 -> 20.94.
# d_split tiles where others fit (same session, `tune_tiles.py --tiles`): "fp32" D=64
# (32,128,8) 13.68 < (32,64,8) 17.41 < (16,64,8) 20.89; "tf32" D=64 (32,192,12) 6.11 <
# (32,128,8) 6.85 < (32,64,8) 8.27 < (16,64,8) 9.71, D=128 (32,128,8) 11.43 < (32,64,8)
# 15.41 < (16,64,8) 18.37 (and dQ: "fp32" D=64 (128,32,8) 13.78 < (64,32,8) 16.66, D=128
# 24.16 < 27.99; "tf32" D=128 11.43 < 14.52).
BWD_DKDV_WGMMA_TILES = (
    (32, 256, 16),
    (32, 192, 12),
    (32, 128, 8),
    (16, 256, 16),
    (16, 128, 8),
    (64, 128, 8),
    (16, 192, 12),
    (16, 64, 4),
    (32, 64, 4),
    (64, 64, 4),
    (16, 64, 8),  # d_split 2: two warpgroups share 64 keys
    (32, 64, 8),
)
BWD_DQ_WGMMA_TILES = (
    (128, 32, 8),
    (256, 32, 16),
    (256, 16, 16),
    (192, 32, 12),
    (128, 16, 8),
    (128, 64, 8),
    (64, 32, 4),  # before the pairs below (measured: see above)
    (64, 32, 8),  # d_split 2: two warpgroups share 64 query rows
    (64, 16, 8),
    (64, 16, 4),
    (64, 64, 4),
)

# Fused dK/dV/dQ (deterministic=False): dK/dV's tiles, with K^T and dS beside them.
# Measured on the H200 (`tune_tiles.py --dtype float32 --precision tf32|fp32 --families
# fused,dkdv_wgmma,dq_wgmma`, B=4, H=16, S=4096, not causal, whole backward ms; BENCHMARKS.md,
# ninth session): "tf32" D=64 (32,192,12) 6.29 < (32,128,8) 6.73 < (64,128,8) 7.02 <
# (16,192,12) 7.91 < (16,128,8) 8.63 < (16,64,4) 8.89 < (64,64,4) 9.63 < (32,64,4) 11.01,
# against the two passes' best 6.73 (dK/dV (32,192,12), dQ (128,32,8)); D=128 (32,64,4)
# 18.70 (only 4-warp tiles fit beside K^T) against 13.55; "fp32" D=64 (32,64,4) 18.23
# against 15.63. Hence BWD_FUSED_WHERE_FASTER: one TF32 pass at head dim 64.
BWD_FUSED_WGMMA_TILES = (
    (32, 192, 12),
    (32, 128, 8),
    (64, 128, 8),
    (16, 256, 16),
    (16, 192, 12),
    (16, 128, 8),
    (16, 64, 4),
    (64, 64, 4),
    (32, 64, 4),
)
BWD_FUSED_WHERE_FASTER = {("tf32", 64)}  # (precision, padded head dim)


# The wgmma backward pays from about this many streamed rows a block sees (queries for
# dK/dV, keys for dQ; half the sequence when causal): `scripts/families.py --pass bwd`
# on the H200 (B=4, H=16, head dims 64 and 128, as planned / mma.sync only): "tf32" at
# S = 512 0.86-0.89x, S = 1024 1.03-1.07x (causal, 512 rows seen: 0.94-1.01x), 2048
# and 4096 1.01-1.18x; "fp32" D=64 1.03-1.06x not causal, 0.94-0.98x causal up to 2048.
WGMMA_BACKWARD_MIN_ROWS = 1024
# From padded head dim 128 the wgmma passes are faster at every length measured (H200,
# eighteenth session, `families.py --pass bwd --dims 128,192,256 --seqlens 1024,512
# --wgmma-from 256`, wgmma / mma.sync only): 256 rows seen (S = 512 causal) "tf32"
# 1.08x (128), 1.14x (192), 1.46x (256), "fp32" 1.27x, 1.61x, 3.06x; 512 rows seen
# 1.32-5.22x. (Fewer rows were not measured.)
WGMMA_BACKWARD_MIN_ROWS_FROM_128 = 256


def wgmma_backward_min_rows(head_dim_pad: int) -> int:
    """Rows a block streams from which the backward plans its wgmma tiles first, at this
    padded head dim (the lower of the two thresholds from 128, so that lowering
    WGMMA_BACKWARD_MIN_ROWS, as tests do to force the wgmma kernels, lowers both)."""
    if head_dim_pad >= 128:
        return min(WGMMA_BACKWARD_MIN_ROWS, WGMMA_BACKWARD_MIN_ROWS_FROM_128)
    return WGMMA_BACKWARD_MIN_ROWS


def _first(preferred, tiles) -> tuple:
    """``tiles`` with those of ``preferred`` that it lists moved to the front, in that order."""
    first = tuple(t for t in preferred if t in tiles)
    return first + tuple(t for t in tiles if t not in first)


def _backward_families(kind: str, precision: str, head_dim_pad: int, streamed_rows: int) -> tuple:
    """The (kernel class, tiles) of a backward pass ("dkdv" or "dq") in preference order:
    where a block streams at least wgmma_backward_min_rows rows, the wgmma tiles first
    (those that compile without spills: from head dim 208 for dK/dV only the d_split 2 tiles), then
    mma.sync's; else mma.sync's first. With their streamed tiles staged once per call,
    the wgmma passes measured faster than mma.sync's at every head dim where they fit
    (H200, B=4, H=16, S=4096, whole backward ms, wgmma / mma.sync, one device call,
    BENCHMARKS.md eighth session): "tf32" D=64 7.01 / 10.00, D=128 13.57 / 22.41, D=256
    (dQ only) 61.65 / 106.48; "fp32" D=64 15.66 / 23.35, D=128 47.08 / 56.49."""
    if kind == "dkdv":
        wgmma, mma = (BwdDkdvWgmmaConfig, BWD_DKDV_WGMMA_TILES), (BwdDkdvMmaConfig, BWD_DKDV_MMA_TILES)
    else:
        wgmma, mma = (BwdDqWgmmaConfig, BWD_DQ_WGMMA_TILES), (BwdDqMmaConfig, BWD_DQ_MMA_TILES)
    wgmma = (wgmma[0], _first(BWD_WGMMA_FIRST.get((kind, precision, head_dim_pad), ()), wgmma[1]))
    return (wgmma, mma) if streamed_rows >= wgmma_backward_min_rows(head_dim_pad) else (mma, wgmma)


# Backward wgmma tiles that go before the lists' order at one mode and padded head dim
# (16-column multiples: 128 is head dims 113-128), where they measured faster (H200,
# seventeenth session, `tune_tiles.py --dtype float32 --precision fp32|tf32 [--causal]
# --tiles`, B=4, H=16, S=4096, whole backward ms, not causal / causal):
#   fp32 dK/dV 64:  (64,128,8) through the ring 13.15 / 7.21 < (32,128,8) 13.69 / 7.43
#   tf32 dK/dV 128: (64,128,8) through the ring 10.80 / 6.24 < (32,128,8) 11.37 / 6.54
#   tf32 dK/dV 256: (32,64,8), d_split 2, through the ring 27.50 / 15.48 < (16,64,8) 29.74 / 16.91
#   tf32 dQ 128:    (128,64,8) 11.04 / 6.53 < (128,32,8) 11.39 / 6.76
# and (eighteenth session, same command):
#   fp32 dQ 64:     (128,64,8), S then dP, 12.42 / 6.90 < (128,32,8) 13.12 / 7.28
# The list's order already takes the ring's wider tiles where they come first: "fp32"
# dK/dV 80 (32,128,8) 19.54 / 10.71 against the split stage's (16,128,8) 21.29 / 11.55;
# "tf32" 160 (32,128,8) 14.04 / 8.05 against (16,128,8) 15.56 / 8.81. Elsewhere these
# tiles are unmeasured or slower ("tf32" D=64: dQ (128,64,8) 3.94 against (128,32,8) 3.72
# causal, and 7.31 / 3.98 against 6.35 / 3.55 in the eighteenth session; dK/dV (16,256,16)
# 6.85 / 3.97 against the list's (32,192,12) 6.43 / 3.77).
BWD_WGMMA_FIRST = {
    ("dkdv", "fp32", 64): ((64, 128, 8),),
    ("dkdv", "tf32", 128): ((64, 128, 8),),
    ("dkdv", "tf32", 256): ((32, 64, 8),),
    ("dq", "tf32", 128): ((128, 64, 8),),
    ("dq", "fp32", 64): ((128, 64, 8),),
}


# The wgmma forward pays from about this many keys a query block sees (half the
# sequence when causal): `scripts/families.py --pass fwd` on the H200 (B=4, H=16, as
# planned / mma.sync only) measured it 0.71-0.93x at S = 256 (its staging launch and
# copies do not pay back over 4 key tiles), 1.09-1.90x at S = 1024 (causal: 512 keys
# seen) and 1.35-2.59x at 2048; "fp32" at head dim 256 (every mma.sync tile spills)
# 1.66-2.25x at 256 already, which the order keeps: wgmma still goes before FFMA.
WGMMA_FORWARD_MIN_KEYS = 512


def _forward_families(precision: str, head_dim_pad: int, causal: bool, streamed_keys: int) -> tuple:
    """The forward's tensor-core (kernel class, tiles) in preference order: on sm_90 the
    wgmma tiles, FWD_WGMMA_FIRST's of this mode, head dim class and causality first, then
    mma.sync's (elsewhere the wgmma class is not eligible); mma.sync first where a query
    block sees fewer than WGMMA_FORWARD_MIN_KEYS keys. With its key tiles split once per
    call, wgmma measured faster than mma.sync's best tile at every head dim and mode
    (`tune_tiles.py --families wgmma,forward`, S=4096, not causal, ms): "tf32" D=64
    1.39 vs 2.45, D=128 2.46 vs 5.15, D=256 5.23 vs 16.92; "fp32" D=64 2.92 vs 5.68, D=128
    6.51 vs 11.48, D=256 19.94 (every mma.sync tile spills there)."""
    d_class = 64 if head_dim_pad <= 64 else 128 if head_dim_pad <= 128 else 256
    if precision == "fp32" and 64 < head_dim_pad <= 176:  # FWD_WGMMA_FIRST's comment
        d_class = 128 if head_dim_pad >= FwdWgmmaConfig.Q_IN_REGISTERS_FROM else 112
    wgmma = (FwdWgmmaConfig, _first(FWD_WGMMA_FIRST.get((precision, d_class, causal), ()), FWD_WGMMA_TILES))
    mma = (FwdMmaConfig, FWD_MMA_TILES)
    return (wgmma, mma) if streamed_keys >= WGMMA_FORWARD_MIN_KEYS else (mma, wgmma)


# The TF32 mode (one pass, 32-bit operands) measured apart on the H200 (whole-call ms,
# B=4, H=16, S=4096, not causal; `tune_tiles.py --dtype float32 --precision tf32`):
# forward D=128 (128,64,8) 5.29 < (128,32,8) 5.88 < (128,32,4) 6.12; dQ D=64
# (128,32,8) 10.22 < (64,32,4) 10.69 < (64,64,4) 10.87, D=128 (128,32,8) 22.46 <
# (64,32,4) 26.40 < (64,64,4) 26.50; the other orders held (forward D=64: (128,64,4)
# first; dK/dV: (64,64,4) at 128, within 1% of the best at 64). (moved, goes before):
TF32_TILE_MOVES = {FwdMmaConfig: ((128, 64, 8), (128, 32, 4)), BwdDqMmaConfig: ((128, 32, 8), (64, 64, 4))}


def _tile_order(cls, tiles, precision: str) -> tuple:
    """``tiles`` in the preference order of ``precision`` (TF32_TILE_MOVES)."""
    moved, before = TF32_TILE_MOVES.get(cls, (None, None)) if precision == "tf32" else (None, None)
    if moved not in tiles or before not in tiles:
        return tuple(tiles)
    rest = [t for t in tiles if t != moved]
    i = rest.index(before)
    return tuple(rest[:i] + [moved] + rest[i:])


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


def mma_eligible(problem: AttentionProblem, device: DeviceSpec) -> bool:
    """Whether the tensor-core kernels can run this problem on this device: sm_80+,
    head_dim == head_dim_v, a multiple of 8, 16-byte aligned rows (every precision
    mode, float32 inputs included)."""
    return (device.compute_capability >= (8, 0)
            and problem.head_dim == problem.head_dim_v and problem.head_dim % 8 == 0
            and problem.aligned)


def _mma_candidates(cls, tiles, problem: AttentionProblem, device: DeviceSpec, max_block_m: int,
                    max_block_n: int, precision: str) -> tuple[list, list]:
    """The tiles of ``tiles`` in ``precision`` that suit the problem's size and compile
    without spills on ``device`` (none unless ``mma_eligible`` and the kernel ``runs_on``
    the device), and (name, why) for those that would spill."""
    configs, skipped = [], []
    if not mma_eligible(problem, device) or not cls.runs_on(device, problem.dtype, precision):
        return configs, skipped
    for block_m, block_n, warps in _tile_order(cls, tiles, precision):
        if block_m > max(16, max_block_m) or block_n > max(16, max_block_n):
            continue
        d_pad = cls.head_dim_pad_for(problem.head_dim, block_m, block_n, warps)
        cfg = cls(problem.dtype, precision, d_pad, block_m, block_n, warps, bool(problem.causal))
        if not cfg.valid:
            continue
        why = cfg.register_reason(device.compute_capability)
        if why is None:
            configs.append(cfg)
        else:
            skipped.append((cfg.name_expression, why))
    return configs, skipped


def _by_capability(table: dict, compute_capability: tuple[int, int]):
    """The value of ``table`` ({lowest compute capability: value}) for this capability, or None."""
    return max(((cc, v) for cc, v in table.items() if cc <= compute_capability), default=(None, None))[1]


def _next_pow2_at_least_8(n: int) -> int:
    return max(8, 1 << (max(1, n) - 1).bit_length())


def _choose(kind: str, configs, problem: AttentionProblem, device: DeviceSpec, num_blocks,
            register_skipped=(), rejected=()) -> Plan:
    """Among ``configs`` (preference order) that fit the opt-in limit, the first that
    fills every SM with at least one block, else the fitting one with the most blocks."""
    limit = device.smem_per_block_optin
    fitting, rejected = [], list(rejected)
    for cfg in configs:
        smem = cfg.layout.total
        if smem <= limit:
            fitting.append(cfg)
        else:
            rejected.append(Rejected(cfg.name_expression, smem, limit))
    if not fitting:
        tried = "\n".join(f"  {r.name_expression}: {r.smem_bytes} bytes" for r in rejected)
        raise PlanError(
            f"no {kind} configuration fits {device.name}: limit {limit} bytes of shared memory "
            f"per block for {problem.dtype} head_dim={problem.head_dim}; tried:\n{tried}")
    for cfg in fitting:
        if num_blocks(cfg) >= device.sm_count:
            reason = ("the most preferred tile that fits the opt-in limit and fills "
                      f"{device.sm_count} SMs ({num_blocks(cfg)} blocks)")
            return Plan(cfg, device, problem, tuple(rejected), reason, tuple(register_skipped))
    cfg = max(fitting, key=num_blocks)
    reason = (f"no fitting tile fills {device.sm_count} SMs; this one gives the most blocks "
              f"({num_blocks(cfg)})")
    return Plan(cfg, device, problem, tuple(rejected), reason, tuple(register_skipped))


def _candidates(cls, tiles, problem: AttentionProblem, max_block_m: int, max_block_n: int):
    d_pad, dv_pad = pad_head_dim(problem.head_dim), pad_head_dim(problem.head_dim_v)
    for block_m, block_n, warps in tiles:
        if block_m > max_block_m or block_n > max_block_n:
            continue
        cfg = cls(problem.dtype, d_pad, dv_pad, block_m, block_n, warps, bool(problem.causal))
        if cfg.accumulators_per_lane <= MAX_ACCUMULATORS_PER_LANE:
            yield cfg


def _query_tiles_blocks(problem: AttentionProblem):
    return lambda cfg: problem.batch * problem.heads_q * -(-max(1, problem.seqlen_q) // cfg.block_m)


def _plan_pass(kind: str, families, simt: list, problem: AttentionProblem, device: DeviceSpec,
               max_block_m: int, max_block_n: int, num_blocks) -> Plan:
    """Tensor cores in the first allowed precision mode that has a tile fitting the
    device's shared memory, else the CUDA-core tiles (float32 FFMA). ``families(precision)``
    gives the (config class, tiles) pairs in preference order (``_forward_families``,
    ``_backward_families``).
    Earlier modes' rejected tiles are reported. A tensor-core tile is taken even where a
    CUDA-core tile would give a small problem more blocks: the CUDA-core kernels are the
    fallback for what the tensor cores cannot run, not a competitor."""
    limit = device.smem_per_block_optin
    skipped, rejected = [], []
    for precision in problem.precision:
        mma = []
        for cls, tiles in families(precision):
            found, skip = _mma_candidates(cls, tiles, problem, device, max_block_m, max_block_n, precision)
            mma += found
            skipped += skip
        if any(cfg.layout.total <= limit for cfg in mma):
            return _choose(kind, mma, problem, device, num_blocks, skipped, rejected)
        rejected += [Rejected(cfg.name_expression, cfg.layout.total, limit) for cfg in mma]
    return _choose(kind, simt, problem, device, num_blocks, skipped, rejected)


@functools.lru_cache(maxsize=4096)  # pure, and called on every launch
def plan_forward(problem: AttentionProblem, device: DeviceSpec) -> Plan:
    """The forward configuration for ``problem`` on ``device``.

    Candidates: the tensor-core kernel's tiles on sm_80+ (head_dim == head_dim_v, a
    multiple of 8, 16-byte aligned rows) in the first allowed precision mode that has
    one fitting, else the SIMT kernel's (float32 FFMA; ``_plan_pass``). Among those
    whose shared memory fits the device's opt-in limit (the kernels use no static
    shared memory), take the first in preference order that
    also gives at least one full wave of blocks; if none fills the GPU (small
    batch x heads x seqlen_q), take the fitting one with the most blocks. Query
    tiles never exceed the query length rounded up to a power of two (at least 8),
    and tiles whose accumulators would not fit in registers are not considered.
    """
    max_block_m = _next_pow2_at_least_8(problem.seqlen_q)
    simt = list(_candidates(FwdSimtConfig, FWD_SIMT_TILES, problem, max_block_m, 64))
    d_pad = mma_head_dim_pad(problem.head_dim)
    seen_k = problem.seqlen_k // 2 if problem.causal else problem.seqlen_k
    return _plan_pass("forward", lambda precision: _forward_families(precision, d_pad, problem.causal, seen_k), simt,
                      problem, device, max_block_m, _next_pow2_at_least_8(problem.seqlen_k),
                      _query_tiles_blocks(problem))


@dataclasses.dataclass(frozen=True)
class BackwardPlan:
    """The backward's launches, each planned on its own (never the forward's tiles): delta,
    dK/dV, dQ; or delta and one fused pass (``dq`` None: BwdFusedWgmmaConfig adds dQ).
    ``delta`` None: the dK/dV pass's staging launch (stage_queries_tf32) computes delta
    as it reads dO, and no launch of its own reads dO again."""

    delta: "BwdDeltaConfig | None"
    dkdv: Plan
    dq: "Plan | None"

    @property
    def plans(self) -> tuple[Plan, ...]:
        return (self.dkdv,) if self.dq is None else (self.dkdv, self.dq)

    def describe(self) -> str:
        delta = (f"{self.delta.name_expression} (no shared memory)" if self.delta is not None
                 else f"delta: computed by {self.dkdv.config.staging.kernel_name}, as it stages dO")
        return "\n".join([delta] + [p.describe() for p in self.plans])


def _delta_launch(problem: AttentionProblem, dkdv: Plan) -> "BwdDeltaConfig | None":
    """delta's own launch, unless the dK/dV pass stages its query tiles (the staging
    launch computes delta from the dO it reads: BackwardPlan)."""
    staging = getattr(dkdv.config, "staging", None)
    return None if staging is not None and staging.queries else BwdDeltaConfig(problem.dtype)


@functools.lru_cache(maxsize=4096)
def plan_backward(problem: AttentionProblem, device: DeviceSpec) -> BackwardPlan:
    """The backward configurations: the dK/dV pass tiles keys, the dQ pass query rows;
    each is chosen as ``plan_forward`` chooses, from its own candidates."""
    max_m, max_n = _next_pow2_at_least_8(problem.seqlen_q), _next_pow2_at_least_8(problem.seqlen_k)
    dkdv_simt = list(_candidates(BwdDkdvSimtConfig, BWD_DKDV_SIMT_TILES, problem, 64, max_n))
    dq_simt = list(_candidates(BwdDqSimtConfig, FWD_SIMT_TILES, problem, max_m, 64))
    d_pad = mma_head_dim_pad(problem.head_dim)
    # Rows a block streams: queries for dK/dV, keys for dQ; about half of them when causal.
    seen_q, seen_k = ((problem.seqlen_q, problem.seqlen_k) if not problem.causal
                      else (problem.seqlen_q // 2, problem.seqlen_k // 2))
    dkdv_blocks = lambda cfg: (problem.batch * problem.heads_kv
                               * -(-max(1, problem.seqlen_k) // cfg.block_n))
    if not problem.deterministic and seen_q >= wgmma_backward_min_rows(d_pad):
        fused = _plan_fused(problem, device, max_m, max_n, dkdv_blocks)
        if fused is not None:
            return BackwardPlan(delta=_delta_launch(problem, fused), dkdv=fused, dq=None)
    dkdv = _plan_pass("backward dK/dV", lambda precision: _backward_families("dkdv", precision, d_pad, seen_q),
                      dkdv_simt, problem, device, max_m, max_n, dkdv_blocks)
    return BackwardPlan(
        delta=_delta_launch(problem, dkdv),
        dkdv=dkdv,
        dq=_plan_pass("backward dQ", lambda precision: _backward_families("dq", precision, d_pad, seen_k),
                      dq_simt, problem, device, max_m, max_n, _query_tiles_blocks(problem)),
    )


def _plan_fused(problem: AttentionProblem, device: DeviceSpec, max_m: int, max_n: int, num_blocks) -> "Plan | None":
    """The fused dK/dV/dQ pass in the first allowed precision mode, if a tile of it fits
    the device (none off sm_90 or outside the TF32 modes), else None."""
    if (problem.precision[0], mma_head_dim_pad(problem.head_dim)) not in BWD_FUSED_WHERE_FASTER:
        return None
    found, skipped = _mma_candidates(BwdFusedWgmmaConfig, BWD_FUSED_WGMMA_TILES, problem, device, max_m, max_n,
                                     problem.precision[0])
    if not any(cfg.layout.total <= device.smem_per_block_optin for cfg in found):
        return None
    plan = _choose("backward dK/dV/dQ", found, problem, device, num_blocks, skipped)
    why = (f"{plan.reason}; one pass for dK, dV and dQ (deterministic=False; dQ added to dq with float32 "
           f"atomics, not bitwise reproducible), measured faster than two passes for "
           f"{problem.precision[0]!r} at this head dim (plan.BWD_FUSED_WHERE_FASTER)")
    return dataclasses.replace(plan, reason=why)


def planned_configs(device: DeviceSpec, head_dims, dtypes, causals=(True,), precisions=(None,),
                    seqlens=(4096,)) -> dict:
    """Every configuration (forward, delta, dK/dV, dQ) the planner picks on ``device``
    for B=4, H=16, S in ``seqlens`` at these head dims, dtypes, causal settings and
    (float32) precision modes, by name."""
    configs = {}
    for d in head_dims:
        for dtype in dtypes:
            for causal in causals:
                for precision in (precisions if dtype == "float32" else (None,)):
                    for s in seqlens:
                        problem = AttentionProblem(dtype, d, d, causal, 4, 16, 16, s, s, precision=precision)
                        bwd = plan_backward(problem, device)
                        for cfg in (plan_forward(problem, device).config, bwd.delta, *(p.config for p in bwd.plans)):
                            if cfg is not None:
                                configs[cfg.name_expression] = cfg
    return configs
