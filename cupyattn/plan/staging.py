"""The staging launches that split a wgmma kernel's streamed tiles into TF32 parts once
per call (kernels/wgmma_staging.cuh)."""

from __future__ import annotations

import dataclasses
import functools
from typing import ClassVar

from ..layout import Layout
from .problem import MMA_OPS

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
    "dq keys" (K, V, K^T) or "dkdv queries" (Q, dO, Q^T, dO^T, lse, delta); ``rows`` per
    tile. ``parts_as_rows`` (3xTF32, the backward's 16-row tiles whose row tiles are the
    B operands of n32 score products: ``WgmmaConfig.score_parts_as_rows``): each row
    tile's small part as rows 16-31 of one 32-row tile, after its big part."""

    HEADER: ClassVar[str] = "wgmma_staging.cuh"
    ARCH_SUFFIX: ClassVar[str] = "a"  # compiled beside the wgmma kernels it feeds
    threads: ClassVar[int] = 128
    TILES: ClassVar[dict] = {"forward keys": 2, "dq keys": 3, "dkdv queries": 4}  # row and transposed tiles

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
        tail = ", true, true" if self.parts_as_rows else ""  # TRANSPOSED, PARTS_AS_ROWS
        if self.queries:
            return f"cupyattn::stage_queries_tf32<{op}, {self.head_dim_pad}, {self.rows}{tail}>"
        dq = "false" if self.operands == "forward keys" else "true"
        return f"cupyattn::stage_keys_tf32<{op}, {self.head_dim_pad}, {self.rows}, {dq}{tail}>"

    @functools.cached_property  # frozen dataclass: computed once, stored in __dict__
    def layout(self) -> Layout:
        return Layout(())  # static shared memory only (two 16-row pieces of an operand: stage_operand)
