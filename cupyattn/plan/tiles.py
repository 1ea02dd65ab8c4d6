"""Tile tables: each kernel family's candidate tiles (block_m, block_n, num_warps), most
preferred first, by the architectures it runs on; where a precision mode or head dim
measured another order, the tiles that go first there; and the problem sizes from which
the wgmma kernels pay. One line of reason per entry; the measurements behind the orders
(scripts/tune_tiles.py, scripts/families.py on the H200) are kept in BENCHMARKS.md.
``Policy`` (policy.py) can replace any of them."""

from __future__ import annotations

from .wgmma import FwdWgmmaConfig

# ---- Every GPU: CUDA cores (float32 FFMA, the fallback) ----

# Forward and dQ: a block keeps block_m query rows and streams K/V tiles; a larger block_m
# reuses each loaded tile for more rows, within 32 accumulators a lane.
FWD_SIMT_TILES = (
    (64, 64, 8),  # most reuse where the accumulators fit (head dims up to 128)
    (64, 32, 8),
    (32, 64, 4),
    (32, 32, 4),
    (32, 64, 8),  # 8-warp 32-row tiles: head dims past 128 (4 rows a warp)
    (32, 32, 8),
    (16, 32, 4),
    (16, 16, 4),
    (8, 16, 2),  # the smallest: float32 at head dim 256 within a T4's 64 KiB
    (8, 8, 2),
)
# dK/dV: a block keeps block_n keys and their dK, dV accumulators and streams block_m
# query rows; no 16-warp tiles (128 registers a lane spill on sm_100 / sm_120).
BWD_DKDV_SIMT_TILES = (
    (64, 64, 8),  # 8 keys a warp: float32 head dims up to 64
    (64, 32, 8),  # 4 keys a warp: up to 128
    (32, 64, 8),
    (32, 32, 8),
    (32, 16, 8),  # 2 keys a warp: up to 256
    (16, 16, 4),
    (16, 16, 8),
    (16, 8, 4),
    (8, 8, 4),
    (8, 8, 2),  # the smallest: for GPUs with the least shared memory
)

# ---- sm_80 and newer: mma.sync ----
# Ordered by whole-call time (float16, B=4, H=16, S=4096) among the tiles that compile
# without spills; each list keeps smaller tiles for GPUs with less shared memory.

# Forward: a warp owns block_m / num_warps query rows (16: one ldmatrix per two mma; 32:
# each fragment feeds two m-tiles).
FWD_MMA_TILES = (
    (128, 64, 4),  # fastest at head dim 64 (two m-tiles a warp)
    (128, 32, 4),  # fastest at 128, where (128, 64, 4) spills
    (128, 64, 8),  # fastest at 256
    (64, 64, 4),
    (64, 32, 4),
    (128, 32, 8),
    (32, 32, 2),
    (16, 16, 1),  # the smallest: 3xTF32 at wide head dims
)
# Backward dK/dV: a block keeps block_n keys (16 a warp; two warps share 16 keys, half the
# head dim each, where num_warps * 16 = 2 * block_n) and streams block_m query rows.
BWD_DKDV_MMA_TILES = (
    (64, 64, 4),  # fastest at head dims 64 and 128 (sm_90; spills on sm_80-sm_89 at 128)
    (64, 128, 8),
    (32, 64, 4),
    (32, 32, 4),  # fastest at 256 (two warps share 16 keys)
    (16, 16, 1),
    (32, 64, 8),
    (16, 16, 2),
    (16, 32, 4),
)
# Backward dQ: a block keeps block_m query rows (16 a warp) and streams block_n keys.
BWD_DQ_MMA_TILES = (
    (64, 64, 4),  # fastest at head dim 128, within 5% at 64
    (128, 32, 8),  # fastest at 256
    (64, 32, 4),
    (128, 64, 8),
    (32, 32, 2),
    (16, 16, 1),
)
# One TF32 pass ("tf32") measured its own order: {tile key: (moved tile, the tile it goes before)}.
TF32_TILE_MOVES = {
    "fwd_mma": ((128, 64, 8), (128, 32, 4)),  # fastest at head dim 128
    "bwd_dq_mma": ((128, 32, 8), (64, 64, 4)),  # fastest at head dims 64 and 128
}

# ---- sm_90: wgmma (float32 in "fp32" / "tf32"; streamed tiles staged once a call) ----

# Forward: a warpgroup owns 64 query rows (block_m = 16 * num_warps); the fastest tiles of
# each mode, head dim class and causality go first (fwd_wgmma_first), then these.
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
    (64, 16, 4),  # the only tile that fits "fp32" at 256 with Q's two parts in shared memory
)
# The three fastest by (mode, head dim class, causal); a head dim takes the class of the
# next measured one (64, 128, 256; "fp32" also 112, the last with Q's parts in shared memory).
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
    ("fp32", 128, False): ((128, 64, 8), (192, 32, 12), (128, 32, 8)),  # 128-176: Q in registers
    ("fp32", 128, True): ((128, 64, 8), (192, 32, 12), (128, 32, 8)),
    ("fp32", 256, False): ((128, 32, 8), (128, 16, 8), (64, 32, 4)),  # 192-256
    ("fp32", 256, True): ((128, 32, 8), (128, 16, 8), (64, 32, 4)),
}


def fwd_wgmma_first(precision: str, head_dim_pad: int, causal: bool) -> tuple:
    """The wgmma forward tiles that go first for this mode, padded head dim and causality."""
    d_class = 64 if head_dim_pad <= 64 else 128 if head_dim_pad <= 128 else 256
    if precision == "fp32" and 64 < head_dim_pad <= 176:
        d_class = 128 if head_dim_pad >= FwdWgmmaConfig.Q_IN_REGISTERS_FROM else 112
    return FWD_WGMMA_FIRST.get((precision, d_class, causal), ())


# Backward dK/dV: a warpgroup owns 64 keys (block_n = 16 * num_warps, or two warpgroups
# share them: d_split 2) and streams block_m query rows.
BWD_DKDV_WGMMA_TILES = (
    (32, 256, 16),
    (32, 192, 12),  # fastest "tf32" at head dim 64
    (32, 128, 8),  # fastest "tf32" at 128, "fp32" at 64 and 128
    (16, 256, 16),
    (16, 128, 8),
    (64, 128, 8),
    (16, 192, 12),
    (16, 64, 4),
    (32, 64, 4),
    (64, 64, 4),
    (16, 64, 8),  # d_split 2: the only tiles from head dim 208; slower where others fit
    (32, 64, 8),
)
# Backward dQ: a warpgroup owns 64 query rows (or two share them: d_split 2) and streams
# block_n keys.
BWD_DQ_WGMMA_TILES = (
    (128, 32, 8),  # fastest "tf32" at head dim 64, "fp32" at 128
    (256, 32, 16),
    (256, 16, 16),
    (192, 32, 12),
    (128, 16, 8),
    (128, 64, 8),
    (64, 32, 4),  # one warpgroup, 32-key tiles: faster than the pairs below where both fit
    (64, 32, 8),  # d_split 2: two warpgroups share 64 query rows
    (64, 16, 8),
    (64, 16, 4),
    (64, 64, 4),
)
# Tiles that go before the lists' order at one (pass, mode, padded head dim).
BWD_WGMMA_FIRST = {
    ("dkdv", "fp32", 64): ((64, 128, 8),),  # through the ring, products one at a time
    ("dkdv", "tf32", 128): ((64, 128, 8),),  # through the ring
    ("dkdv", "tf32", 256): ((32, 64, 8),),  # d_split 2 through the ring
    ("dq", "tf32", 128): ((128, 64, 8),),
    ("dq", "fp32", 64): ((128, 64, 8),),  # S, then dP
}


def bwd_wgmma_first(kind: str, precision: str, head_dim_pad: int) -> tuple:
    """The wgmma backward tiles of pass ``kind`` ("dkdv" or "dq") that go first here."""
    return BWD_WGMMA_FIRST.get((kind, precision, head_dim_pad), ())


# Fused dK/dV/dQ (deterministic=False): dK/dV's tiles that fit with K^T and dS beside them.
BWD_FUSED_WGMMA_TILES = (
    (32, 192, 12),  # fastest "tf32" at head dim 64, faster than the two passes
    (32, 128, 8),
    (64, 128, 8),
    (16, 256, 16),
    (16, 192, 12),
    (16, 128, 8),
    (16, 64, 4),
    (64, 64, 4),
    (32, 64, 4),
)
# (precision, padded head dim) where the fused pass measured faster than two passes: float32
# elsewhere only 4-warp tiles fit beside K^T, or none. float16 / bfloat16 at every head dim it
# takes (measured at 32, 64, 96 and 128: one and two dQ chunks a tile).
_FUSED_HALF = frozenset((p, d) for p in ("bf16", "fp16") for d in range(16, 129, 16))
BWD_FUSED_WHERE_FASTER = frozenset({("tf32", 64)}) | _FUSED_HALF
# Where its deterministic form (dQ added in the key blocks' order) measured faster than the two
# deterministic passes: float16 / bfloat16 at every head dim it takes (measured as above).
BWD_ORDERED_FUSED_WHERE_FASTER = _FUSED_HALF

# ---- sm_90: wgmma on float16 / bfloat16 (TMA-loaded tiles; attn_fwd_wgmma_half) ----

# Forward: two or three consumer warpgroups of 64 query rows (block_m 128, 8 warps; 192, 12)
# and a producer warpgroup; K and V tiles of block_n keys, 2 stages (3 at head dims up to 64).
# The first that fits sm_90's 232448 bytes at the head dim goes first (fwd_wgmma_half_first).
FWD_WGMMA_HALF_TILES = (
    (192, 128, 12),  # head dims up to 64 (past it, it spills: register_reason): 10-16% faster there than 128 rows
    (128, 192, 8),  # head dims up to 128: the fastest there, Q + 2 stages in 224 KiB (3 stages at 64: 160)
    (128, 176, 8),  # 208 KiB at 128 (FlashAttention-3's tile there)
    (128, 128, 8),  # 160 KiB at 128 (3 stages at 64: 112 KiB)
    (128, 80, 8),  # up to 256: the widest key tile whose two stages fit beside Q (224 KiB at 256)
    (128, 64, 8),  # the smallest: 192 KiB at 256
)
# Its 128-row tiles go first from this many query rows; shorter queries take mma.sync's
# shorter tiles first (the planner's cap on block_m does not apply to this fixed tile).
WGMMA_HALF_FORWARD_MIN_QUERIES = 65
# The tiles that go first from a padded head dim on (FlashAttention-3's, tile_size.h).
FWD_WGMMA_HALF_FIRST = ((144, ((128, 80, 8),)),)


def fwd_wgmma_half_first(head_dim_pad: int) -> tuple:
    """The float16 / bfloat16 wgmma forward tiles that go first at this padded head dim."""
    return next((tiles for start, tiles in reversed(FWD_WGMMA_HALF_FIRST) if head_dim_pad >= start), ())


# Backward: consumer warpgroups of 64 keys (dK/dV) or 64 query rows (dQ) beside a producer
# warpgroup; two stages of the streamed tiles. dK/dV keeps dK and dV in registers: up to
# padded head dim 128 two warpgroups of 64 keys each, from 193 two sharing 64 keys (each
# half the columns); the head dims between take mma.sync's tiles.
BWD_DKDV_WGMMA_HALF_TILES = (
    (64, 128, 8),  # head dims up to 128: K, V and two stages of Q and dO in 128 KiB at 128
    (64, 64, 8),  # d_split 2 from 193: 192 KiB at 256
    (64, 64, 4),
)
BWD_DQ_WGMMA_HALF_TILES = (
    (128, 64, 8),  # Q, dO and two stages of K and V: 128 KiB at head dim 128
    (64, 64, 4),  # head dims from 193: 192 KiB at 256
)
# Fused dK/dV/dQ (deterministic=False): 64-query dS^T tiles of two warpgroups' 64 keys, whose
# dQ chunks of 64 columns one each (head dims up to 128: dK, dV and a dQ chunk in registers).
BWD_FUSED_WGMMA_HALF_TILES = ((64, 128, 8),)

# The wgmma forward pays from this many keys a query block sees (half the sequence when
# causal): below it its staging launch does not pay back over so few key tiles.
WGMMA_FORWARD_MIN_KEYS = 512
# The wgmma backward pays from this many rows a block streams (queries for dK/dV, keys for
# dQ; half when causal) ...
WGMMA_BACKWARD_MIN_ROWS = 1024
# ... and from padded head dim 128 at every length measured (from 256 rows).
WGMMA_BACKWARD_MIN_ROWS_FROM_128 = 256
