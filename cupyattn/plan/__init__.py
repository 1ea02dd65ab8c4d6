"""Tile configurations and the planner.

A configuration is a frozen dataclass whose fields are its kernel's C++ template
parameters, one to one; its ``name_expression`` (e.g.
``cupyattn::attn_fwd_simt<float, 128, 128, 32, 64, 4, true>``) is its identity in
errors, logs, benchmark tables and cache keys. Each configuration knows its
shared-memory layout. The planner is a pure function of (problem, DeviceSpec, Policy).

Modules: ``problem`` (inputs: precision modes, AttentionProblem, head-dim padding),
``simt`` / ``mma`` / ``wgmma`` / ``staging`` (one per kernel family, with its layout),
``tiles`` (the candidate tiles and measured orders), ``policy`` (what the planner may
choose from) and ``choose`` (plan_forward, plan_backward).
"""

from .choose import (
    BackwardPlan,
    Plan,
    PlanError,
    Rejected,
    check_expression,
    plan_backward,
    plan_forward,
    planned_configs,
)
from .mma import BwdDkdvMmaConfig, BwdDqMmaConfig, FwdMmaConfig, MmaConfig
from .policy import DEFAULT_POLICY, FAMILIES, TILE_KEYS, Policy
from .problem import (
    CXX_TYPES,
    MAX_HEAD_DIM,
    MMA_OPS,
    NATIVE_PRECISION,
    PRECISION_TEXT,
    PRECISIONS,
    STAGED_DTYPES,
    AttentionProblem,
    blocks_per_sm,
    d_split_head_dim_pad,
    d_split_of,
    mma_eligible,
    mma_head_dim_pad,
    pad_head_dim,
    parse_precision,
)
from .simt import (
    MAX_ACCUMULATORS_PER_LANE,
    BwdDeltaConfig,
    BwdDkdvSimtConfig,
    BwdDqSimtConfig,
    FwdSimtConfig,
    SimtConfig,
)
from .staging import SM90_SMEM_PER_BLOCK, StagingConfig
from .tiles import (
    BWD_DKDV_MMA_TILES,
    BWD_DKDV_SIMT_TILES,
    BWD_DKDV_WGMMA_TILES,
    BWD_DQ_MMA_TILES,
    BWD_DQ_WGMMA_TILES,
    BWD_FUSED_WGMMA_TILES,
    BWD_FUSED_WHERE_FASTER,
    BWD_WGMMA_FIRST,
    FWD_MMA_TILES,
    FWD_SIMT_TILES,
    FWD_WGMMA_FIRST,
    FWD_WGMMA_HALF_TILES,
    FWD_WGMMA_TILES,
    TF32_TILE_MOVES,
    WGMMA_BACKWARD_MIN_ROWS,
    WGMMA_BACKWARD_MIN_ROWS_FROM_128,
    WGMMA_FORWARD_MIN_KEYS,
)
from .wgmma import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig, BwdFusedWgmmaConfig, FwdWgmmaConfig, WgmmaConfig
from .wgmma_half import BwdDkdvWgmmaHalfConfig, BwdDqWgmmaHalfConfig, FwdWgmmaHalfConfig, WgmmaHalfConfig

__all__ = [
    "AttentionProblem",
    "BackwardPlan",
    "BwdDeltaConfig",
    "BwdDkdvMmaConfig",
    "BwdDkdvSimtConfig",
    "BwdDkdvWgmmaConfig",
    "BwdDkdvWgmmaHalfConfig",
    "BwdDqMmaConfig",
    "BwdDqSimtConfig",
    "BwdDqWgmmaConfig",
    "BwdDqWgmmaHalfConfig",
    "BwdFusedWgmmaConfig",
    "CXX_TYPES",
    "DEFAULT_POLICY",
    "FAMILIES",
    "FwdMmaConfig",
    "FwdSimtConfig",
    "FwdWgmmaConfig",
    "FwdWgmmaHalfConfig",
    "MAX_HEAD_DIM",
    "MMA_OPS",
    "MmaConfig",
    "NATIVE_PRECISION",
    "PRECISIONS",
    "PRECISION_TEXT",
    "Plan",
    "PlanError",
    "Policy",
    "Rejected",
    "SM90_SMEM_PER_BLOCK",
    "STAGED_DTYPES",
    "SimtConfig",
    "StagingConfig",
    "TILE_KEYS",
    "WgmmaConfig",
    "WgmmaHalfConfig",
    "MAX_ACCUMULATORS_PER_LANE",
    "BWD_DKDV_MMA_TILES",
    "BWD_DKDV_SIMT_TILES",
    "BWD_DKDV_WGMMA_TILES",
    "BWD_DQ_MMA_TILES",
    "BWD_DQ_WGMMA_TILES",
    "BWD_FUSED_WGMMA_TILES",
    "BWD_FUSED_WHERE_FASTER",
    "BWD_WGMMA_FIRST",
    "FWD_MMA_TILES",
    "FWD_SIMT_TILES",
    "FWD_WGMMA_FIRST",
    "FWD_WGMMA_HALF_TILES",
    "FWD_WGMMA_TILES",
    "TF32_TILE_MOVES",
    "WGMMA_BACKWARD_MIN_ROWS",
    "WGMMA_BACKWARD_MIN_ROWS_FROM_128",
    "WGMMA_FORWARD_MIN_KEYS",
    "blocks_per_sm",
    "check_expression",
    "d_split_head_dim_pad",
    "d_split_of",
    "mma_eligible",
    "mma_head_dim_pad",
    "pad_head_dim",
    "parse_precision",
    "plan_backward",
    "plan_forward",
    "planned_configs",
]
