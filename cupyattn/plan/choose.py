"""The chooser: for each pass, the candidate tiles of the families a policy allows, in
preference order, less those that would spill registers; the first that fits the
device's shared memory and fills its SMs (else the fitting one with the most blocks)."""

from __future__ import annotations

import dataclasses
import functools

from ..device import DeviceSpec
from ..layout import Layout
from . import tiles as T
from .mma import BwdDkdvMmaConfig, BwdDqMmaConfig, FwdMmaConfig, MmaConfig
from .policy import Policy, resolve_policy
from .problem import AttentionProblem, blocks_per_sm, mma_eligible, mma_head_dim_pad, pad_head_dim
from .simt import (
    MAX_ACCUMULATORS_PER_LANE,
    BwdDeltaConfig,
    BwdDeltaWgmmaHalfConfig,
    BwdDkdvSimtConfig,
    BwdDqConvertConfig,
    BwdDqSimtConfig,
    FwdSimtConfig,
    SimtConfig,
)
from .wgmma import BwdDkdvWgmmaConfig, BwdDqWgmmaConfig, BwdFusedWgmmaConfig, FwdWgmmaConfig
from .wgmma_half import BwdDkdvWgmmaHalfConfig, BwdDqWgmmaHalfConfig, BwdFusedWgmmaHalfConfig, FwdWgmmaHalfConfig


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
    config: SimtConfig | MmaConfig
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
        from ..explain import precision_text

        return precision_text(self)

    @property
    def smem_bytes(self) -> int:
        return self.layout.total

    @property
    def blocks_per_sm_by_smem(self) -> int:
        return blocks_per_sm(self.smem_bytes, self.config.threads, self.device)

    def describe(self) -> str:
        from ..explain import describe_plan

        return describe_plan(self)


@dataclasses.dataclass(frozen=True)
class BackwardPlan:
    """The backward's launches, each planned on its own (never the forward's tiles): delta,
    dK/dV, dQ; or delta and one fused pass (``dq`` None: BwdFusedWgmmaConfig adds dQ to
    float32 dq; BwdFusedWgmmaHalfConfig to a float32 accumulator that ``dq_convert`` then
    scales and rounds into dq). ``delta`` None: the dK/dV pass's staging launch
    (stage_queries_tf32) computes delta as it reads dO, and no launch of its own reads dO
    again."""

    delta: BwdDeltaConfig | None
    dkdv: Plan
    dq: Plan | None
    dq_convert: BwdDqConvertConfig | None = None

    @property
    def plans(self) -> tuple[Plan, ...]:
        return (self.dkdv,) if self.dq is None else (self.dkdv, self.dq)

    def describe(self) -> str:
        from ..explain import describe_backward_plan

        return describe_backward_plan(self)


class PlanError(ValueError):
    """No candidate fits; the message lists every candidate with its bytes and the limit."""


def _first(preferred, tiles) -> tuple:
    """``tiles`` with those of ``preferred`` that it lists moved to the front, in that order."""
    first = tuple(t for t in preferred if t in tiles)
    return first + tuple(t for t in tiles if t not in first)


def _tf32_order(key: str, tiles, precision: str) -> tuple:
    """``tiles`` in the preference order of ``precision`` (tiles.TF32_TILE_MOVES)."""
    moved, before = T.TF32_TILE_MOVES.get(key, (None, None)) if precision == "tf32" else (None, None)
    if moved not in tiles or before not in tiles:
        return tuple(tiles)
    rest = [t for t in tiles if t != moved]
    i = rest.index(before)
    return tuple(rest[:i] + [moved] + rest[i:])


def _family(policy: Policy, family: str, cls, key: str, first=(), precision: str = ""):
    """(config class, tiles) of one family in preference order, or None where the policy
    leaves it out: the measured order (``first`` ahead, tf32's moves) unless overridden."""
    if not policy.allows(family):
        return None
    tiles, overridden = policy.candidates(key)
    if not overridden:
        tiles = _tf32_order(key, _first(first, tiles), precision)
    return cls, tiles


def _ordered(wgmma, mma, wgmma_first: bool) -> tuple:
    pairs = (wgmma, mma) if wgmma_first else (mma, wgmma)
    return tuple(p for p in pairs if p is not None)


def _forward_families(
    precision: str, head_dim_pad: int, causal: bool, streamed_keys: int, policy: Policy, tma: bool = True, seqlen_q=None
) -> tuple:
    """The forward's tensor-core (kernel class, tiles) in preference order: on sm_90 the
    float16 / bfloat16 wgmma kernel first where TMA maps can describe q, k and v (``tma``;
    after mma.sync for queries shorter than its 128-row tiles fill); the float32 wgmma tiles
    (the fastest of this mode, head dim class and causality first), then mma.sync's
    (elsewhere the wgmma classes are not eligible); mma.sync before the float32 wgmma tiles
    where a query block sees fewer than the policy's wgmma_forward_min_keys."""
    half = None
    if tma:
        first = T.fwd_wgmma_half_first(head_dim_pad)
        half = _family(policy, "wgmma_half", FwdWgmmaHalfConfig, "fwd_wgmma_half", first)
    wgmma = _family(policy, "wgmma", FwdWgmmaConfig, "fwd_wgmma", T.fwd_wgmma_first(precision, head_dim_pad, causal))
    mma = _family(policy, "mma", FwdMmaConfig, "fwd_mma", precision=precision)
    ordered = _ordered(wgmma, mma, streamed_keys >= policy.wgmma_forward_min_keys)
    if half is None:
        return ordered
    short = seqlen_q is not None and seqlen_q < T.WGMMA_HALF_FORWARD_MIN_QUERIES
    return (*ordered, half) if short else (half, *ordered)


def _backward_families(
    kind: str, precision: str, head_dim_pad: int, streamed_rows: int, policy: Policy, tma: bool = True
) -> tuple:
    """The (kernel class, tiles) of a backward pass ("dkdv" or "dq") in preference order:
    on sm_90 the float16 / bfloat16 wgmma tiles first where TMA maps can describe q, k, v
    and dout (``tma``); where a block streams at least the policy's wgmma backward rows,
    the float32 wgmma tiles (those that compile without spills: from head dim 208 for dK/dV
    only the d_split 2 tiles), then mma.sync's; else mma.sync's first."""
    if kind == "dkdv":
        half_cls, wgmma_cls, mma_cls = BwdDkdvWgmmaHalfConfig, BwdDkdvWgmmaConfig, BwdDkdvMmaConfig
    else:
        half_cls, wgmma_cls, mma_cls = BwdDqWgmmaHalfConfig, BwdDqWgmmaConfig, BwdDqMmaConfig
    half = _family(policy, "wgmma_half", half_cls, f"bwd_{kind}_wgmma_half") if tma else None
    wgmma = _family(policy, "wgmma", wgmma_cls, f"bwd_{kind}_wgmma", T.bwd_wgmma_first(kind, precision, head_dim_pad))
    mma = _family(policy, "mma", mma_cls, f"bwd_{kind}_mma", precision=precision)
    ordered = _ordered(wgmma, mma, streamed_rows >= policy.wgmma_backward_min_rows_at(head_dim_pad))
    return ordered if half is None else (half, *ordered)


def _mma_candidates(
    cls, tiles, problem: AttentionProblem, device: DeviceSpec, max_block_m: int, max_block_n: int, precision: str
) -> tuple[list, list]:
    """The tiles of ``tiles`` in ``precision`` that suit the problem's size and compile
    without spills on ``device`` (none unless ``mma_eligible`` and the kernel ``runs_on``
    the device), and (name, why) for those that would spill."""
    configs, skipped = [], []
    if not mma_eligible(problem, device) or not cls.runs_on(device, problem.dtype, precision):
        return configs, skipped
    capped = not getattr(cls, "FIXED_BLOCK_M", False)
    for block_m, block_n, warps in tiles:
        if capped and (block_m > max(16, max_block_m) or block_n > max(16, max_block_n)):
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


def _next_pow2_at_least_8(n: int) -> int:
    return max(8, 1 << (max(1, n) - 1).bit_length())


def _choose(
    kind: str, configs, problem: AttentionProblem, device: DeviceSpec, num_blocks, register_skipped=(), rejected=()
) -> Plan:
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
            f"per block for {problem.dtype} head_dim={problem.head_dim}; tried:\n{tried}"
        )
    for cfg in fitting:
        if num_blocks(cfg) >= device.sm_count:
            reason = (
                "the most preferred tile that fits the opt-in limit and fills "
                f"{device.sm_count} SMs ({num_blocks(cfg)} blocks)"
            )
            return Plan(cfg, device, problem, tuple(rejected), reason, tuple(register_skipped))
    cfg = max(fitting, key=num_blocks)
    reason = f"no fitting tile fills {device.sm_count} SMs; this one gives the most blocks ({num_blocks(cfg)})"
    return Plan(cfg, device, problem, tuple(rejected), reason, tuple(register_skipped))


def _simt_candidates(
    cls, key: str, problem: AttentionProblem, max_block_m: int, max_block_n: int, policy: Policy
) -> list:
    """The CUDA-core tiles that suit the problem's size and keep their accumulators in
    registers (none where the policy leaves the family out)."""
    if not policy.allows("simt"):
        return []
    d_pad, dv_pad = pad_head_dim(problem.head_dim), pad_head_dim(problem.head_dim_v)
    configs = []
    for block_m, block_n, warps in policy.candidates(key)[0]:
        if block_m > max_block_m or block_n > max_block_n:
            continue
        cfg = cls(problem.dtype, d_pad, dv_pad, block_m, block_n, warps, bool(problem.causal))
        if cfg.accumulators_per_lane <= MAX_ACCUMULATORS_PER_LANE:
            configs.append(cfg)
    return configs


def _query_tiles_blocks(problem: AttentionProblem):
    return lambda cfg: problem.batch * problem.heads_q * -(-max(1, problem.seqlen_q) // cfg.block_m)


def _plan_pass(
    kind: str,
    families,
    simt: list,
    problem: AttentionProblem,
    device: DeviceSpec,
    max_block_m: int,
    max_block_n: int,
    num_blocks,
) -> Plan:
    """Tensor cores in the first allowed precision mode that has a tile fitting the
    device's shared memory, else the CUDA-core tiles (float32 FFMA). ``families(precision)``
    gives the (config class, tiles) pairs in preference order (``_forward_families``,
    ``_backward_families``). Earlier modes' rejected tiles are reported. A tensor-core tile
    is taken even where a CUDA-core tile would give a small problem more blocks: the
    CUDA-core kernels are the fallback for what the tensor cores cannot run, not a competitor."""
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
def plan_forward(problem: AttentionProblem, device: DeviceSpec, policy: Policy | None = None) -> Plan:
    """The forward configuration for ``problem`` on ``device``, from what ``policy`` allows
    (None: DEFAULT_POLICY).

    Candidates: the tensor-core kernel's tiles on sm_80+ (head_dim == head_dim_v, a
    multiple of 8, 16-byte aligned rows) in the first allowed precision mode that has
    one fitting, else the SIMT kernel's (float32 FFMA; ``_plan_pass``). Among those
    whose shared memory fits the device's opt-in limit (the kernels use no static
    shared memory), take the first in preference order that also gives at least one
    full wave of blocks; if none fills the GPU (small batch x heads x seqlen_q), take
    the fitting one with the most blocks. Query tiles never exceed the query length
    rounded up to a power of two (at least 8), and tiles whose accumulators would not
    fit in registers are not considered.
    """
    policy = resolve_policy(policy)
    max_block_m = _next_pow2_at_least_8(problem.seqlen_q)
    simt = _simt_candidates(FwdSimtConfig, "fwd_simt", problem, max_block_m, 64, policy)
    d_pad = mma_head_dim_pad(problem.head_dim)
    seen_k = problem.seqlen_k // 2 if problem.causal else problem.seqlen_k
    return _plan_pass(
        "forward",
        lambda precision: _forward_families(
            precision, d_pad, problem.causal, seen_k, policy, problem.tma, problem.seqlen_q
        ),
        simt,
        problem,
        device,
        max_block_m,
        _next_pow2_at_least_8(problem.seqlen_k),
        _query_tiles_blocks(problem),
    )


def _delta_launch(problem: AttentionProblem, dkdv: Plan) -> BwdDeltaConfig | None:
    """delta's own launch, unless the dK/dV pass stages its query tiles (the staging
    launch computes delta from the dO it reads: BackwardPlan); for the float16 / bfloat16
    wgmma dK/dV pass, with its tiles' lse and delta rows padded for bulk copies."""
    if isinstance(dkdv.config, BwdDkdvWgmmaHalfConfig):
        return BwdDeltaWgmmaHalfConfig(problem.dtype, block_m=dkdv.config.block_m)
    staging = getattr(dkdv.config, "staging", None)
    return None if staging is not None and staging.queries else BwdDeltaConfig(problem.dtype)


@functools.lru_cache(maxsize=4096)
def plan_backward(problem: AttentionProblem, device: DeviceSpec, policy: Policy | None = None) -> BackwardPlan:
    """The backward configurations: the dK/dV pass tiles keys, the dQ pass query rows;
    each is chosen as ``plan_forward`` chooses, from its own candidates; or one fused pass
    where the policy has it: with ``deterministic=False`` where its fused_where does, with
    ``deterministic=True`` (dQ added in the key blocks' order) where its ordered_fused_where
    does."""
    policy = resolve_policy(policy)
    max_m, max_n = _next_pow2_at_least_8(problem.seqlen_q), _next_pow2_at_least_8(problem.seqlen_k)
    dkdv_simt = _simt_candidates(BwdDkdvSimtConfig, "bwd_dkdv_simt", problem, 64, max_n, policy)
    dq_simt = _simt_candidates(BwdDqSimtConfig, "bwd_dq_simt", problem, max_m, 64, policy)
    d_pad = mma_head_dim_pad(problem.head_dim)
    # Rows a block streams: queries for dK/dV, keys for dQ; about half of them when causal.
    seen_q, seen_k = (
        (problem.seqlen_q, problem.seqlen_k) if not problem.causal else (problem.seqlen_q // 2, problem.seqlen_k // 2)
    )
    dkdv_blocks = lambda cfg: problem.batch * problem.heads_kv * -(-max(1, problem.seqlen_k) // cfg.block_n)
    half = problem.dtype in ("float16", "bfloat16")
    # (the float16 / bfloat16 wgmma passes go first at every length, the float32 ones from a
    # length on: _backward_families)
    long_enough = half or seen_q >= policy.wgmma_backward_min_rows_at(d_pad)
    if policy.allows("fused") and long_enough:
        fused = _plan_fused(problem, device, max_m, max_n, dkdv_blocks, policy)
        if fused is not None:
            convert = BwdDqConvertConfig(problem.dtype) if half else None
            return BackwardPlan(delta=_delta_launch(problem, fused), dkdv=fused, dq=None, dq_convert=convert)
    dkdv = _plan_pass(
        "backward dK/dV",
        lambda precision: _backward_families("dkdv", precision, d_pad, seen_q, policy, problem.tma),
        dkdv_simt,
        problem,
        device,
        max_m,
        max_n,
        dkdv_blocks,
    )
    return BackwardPlan(
        delta=_delta_launch(problem, dkdv),
        dkdv=dkdv,
        dq=_plan_pass(
            "backward dQ",
            lambda precision: _backward_families("dq", precision, d_pad, seen_k, policy, problem.tma),
            dq_simt,
            problem,
            device,
            max_m,
            max_n,
            _query_tiles_blocks(problem),
        ),
    )


def _plan_fused(
    problem: AttentionProblem, device: DeviceSpec, max_m: int, max_n: int, num_blocks, policy: Policy
) -> Plan | None:
    """The fused dK/dV/dQ pass in the first allowed precision mode, if the policy has it at
    this head dim for the problem's determinism and a tile of it fits the device (none off
    sm_90, nor for float16 / bfloat16 inputs TMA maps cannot describe or that the policy
    keeps off the wgmma_half family; deterministic, float16 / bfloat16 only), else None."""
    where = (problem.precision[0], mma_head_dim_pad(problem.head_dim))
    ordered = problem.deterministic
    if where not in (policy.ordered_fused_where if ordered else policy.fused_where):
        return None
    if problem.dtype == "float32":
        if ordered:
            return None
        cls, key = BwdFusedWgmmaConfig, "bwd_fused_wgmma"
    elif problem.tma and policy.allows("wgmma_half"):
        cls, key = BwdFusedWgmmaHalfConfig, "bwd_fused_wgmma_half"
    else:
        return None
    found, skipped = _mma_candidates(
        cls,
        policy.candidates(key)[0],
        problem,
        device,
        max_m,
        max_n,
        problem.precision[0],
    )
    if ordered:
        found = [dataclasses.replace(cfg, ordered=True) for cfg in found]
    if not any(cfg.layout.total <= device.smem_per_block_optin for cfg in found):
        return None
    plan = _choose("backward dK/dV/dQ", found, problem, device, num_blocks, skipped)
    table = "BWD_ORDERED_FUSED_WHERE_FASTER" if ordered else "BWD_FUSED_WHERE_FASTER"
    field = "ordered_fused_where" if ordered else "fused_where"
    why = (
        f"measured faster than two passes for {problem.precision[0]!r} at head dims like this (plan.{table})"
        if where in getattr(T, table)
        else f"as the planner policy's {field} asks"
    )
    if ordered:
        how = "deterministic: each key block adds its dQ to a float32 accumulator in turn, bitwise reproducible"
    elif problem.dtype == "float32":
        how = "deterministic=False: dQ added to dq by float32 atomics, not bitwise reproducible"
    else:
        how = "deterministic=False: dQ added to a float32 accumulator in any order, not bitwise reproducible"
    return dataclasses.replace(plan, reason=f"{plan.reason}; one pass for dK, dV and dQ ({how}), {why}")


def planned_configs(
    device: DeviceSpec,
    head_dims,
    dtypes,
    causals=(True,),
    precisions=(None,),
    seqlens=(4096,),
    policy: Policy | None = None,
) -> dict:
    """Every configuration (forward, delta, dK/dV, dQ) the planner picks on ``device``
    for B=4, H=16, S in ``seqlens`` at these head dims, dtypes, causal settings and
    (float32) precision modes, by name."""
    configs = {}
    for d in head_dims:
        for dtype in dtypes:
            for causal in causals:
                for precision in precisions if dtype == "float32" else (None,):
                    for s in seqlens:
                        problem = AttentionProblem(dtype, d, d, causal, 4, 16, 16, s, s, precision=precision)
                        bwd = plan_backward(problem, device, policy)
                        fwd = plan_forward(problem, device, policy)
                        for cfg in (fwd.config, bwd.delta, bwd.dq_convert, *(p.config for p in bwd.plans)):
                            if cfg is not None:
                                configs[cfg.name_expression] = cfg
    return configs
