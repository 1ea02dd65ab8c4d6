"""The human-facing views: where a kernel's shared memory goes, and what every
head dim gets on a device (the capability matrix). Both work for GPUs that are
not in the machine: planning is pure, and compiling goes through NVRTC for the
named architecture without a GPU.
"""

from __future__ import annotations

import dataclasses
import json
import math

from .compile import CompileReport, compile_only
from .device import DeviceSpec, resolve_device
from .layout import Buffer
from .plan import (
    PRECISION_TEXT,
    AttentionProblem,
    BackwardPlan,
    FwdWgmmaHalfConfig,
    MmaConfig,
    Plan,
    Rejected,
    WgmmaConfig,
    blocks_per_sm,
    plan_backward,
    plan_forward,
)

DTYPES = ("float16", "bfloat16", "float32")
CAPS_HEAD_DIMS = (32, 64, 96, 128, 160, 192, 256)

# Registers are allocated per warp in units of 256 (8 per thread), the rule of
# the CUDA occupancy calculator for sm_70 and newer.
_REG_ALLOC_UNIT = 256


def blocks_per_sm_by_registers(registers: int, threads: int, device: DeviceSpec) -> int:
    per_warp = -(-max(registers, 1) * 32 // _REG_ALLOC_UNIT) * _REG_ALLOC_UNIT
    warps = device.registers_per_sm // per_warp
    return warps // (threads // 32)


def precision_text(plan: Plan) -> str:
    """The precision mode that runs and on which units (Plan.precision_text)."""
    precision = plan.precision
    if isinstance(plan.config, FwdWgmmaHalfConfig):
        return (
            f"{precision}: {PRECISION_TEXT[precision]} on tensor cores, warpgroup MMA (wgmma, sm_90a) on "
            "tiles the TMA loads"
        )
    if isinstance(plan.config, WgmmaConfig):
        return (
            f"{precision}: {PRECISION_TEXT[precision]} on tensor cores, warpgroup MMA "
            "(wgmma, sm_90a), the kernel family measured faster here (cupyattn.plan.tiles)"
        )
    if isinstance(plan.config, MmaConfig):
        return f"{precision}: {PRECISION_TEXT[precision]} on tensor cores"
    rounded = {"tf32": "TF32", "bf16": "bfloat16", "fp16": "float16"}
    if plan.problem.dtype == "float32" and precision in rounded:
        return (
            f"{precision}: float32 arithmetic (FFMA) on CUDA cores, on copies of the "
            f"inputs rounded to {rounded[precision]}"
        )
    return f"{precision}: float32 arithmetic (FFMA) on CUDA cores"


def describe_plan(plan: Plan) -> str:
    """One kernel's plan as text: device, shared memory, why, precision, buffers, staging,
    and the candidates rejected or skipped (Plan.describe)."""
    d = plan.device
    lines = [
        f"{plan.config.name_expression}",
        f"  device: {d.summary()}",
        f"  shared memory: {plan.smem_bytes} of {d.smem_per_block_optin} bytes opt-in "
        f"({100 * plan.smem_bytes / d.smem_per_block_optin:.0f}%), "
        f"{plan.blocks_per_sm_by_smem} block(s) per SM by shared memory",
        f"  why: {plan.reason}",
        f"  precision: {precision_text(plan)}",
    ]
    if plan.work_split:
        lines.append(f"  work split: {plan.work_split}")
    lines.append(plan.layout.table())
    staging = getattr(plan.config, "staging", None)
    if staging is not None:
        p = plan.problem
        heads, seqlen = (p.heads_q, p.seqlen_q) if staging.queries else (p.heads_kv, p.seqlen_k)
        lines.append(
            f"  staged first by {staging.name_expression}: "
            f"{staging.workspace_bytes(p.batch, heads, seqlen)} bytes of global memory "
            f"({staging.tiles(seqlen)} tiles of {staging.tile_bytes} bytes a head)"
        )
    for r in plan.rejected:
        lines.append(f"  rejected {r.name_expression}: {r.smem_bytes} bytes, {r.over_by} over the {r.limit}-byte limit")
    for name, why in plan.register_skipped:
        lines.append(f"  skipped {name}: {why}")
    return "\n".join(lines)


def describe_backward_plan(bplan: BackwardPlan) -> str:
    """The backward's launches as text (BackwardPlan.describe)."""
    if bplan.delta is None:
        delta = f"delta: computed by {bplan.dkdv.config.staging.kernel_name}, as it stages dO"
    elif hasattr(bplan.delta, "padded_rows"):
        rows = bplan.delta.padded_rows(bplan.dkdv.problem.seqlen_q)
        p = bplan.dkdv.problem
        delta = (
            f"{bplan.delta.name_expression} (no shared memory): delta, and lse * log2(e) and delta in {rows} rows "
            f"a head for the dK/dV pass's bulk copies ({2 * p.batch * p.heads_q * rows * 4} bytes of global memory)"
        )
    else:
        delta = f"{bplan.delta.name_expression} (no shared memory)"
    convert = []
    if bplan.dq_convert is not None:
        cfg, p = bplan.dkdv.config, bplan.dkdv.problem
        shape = cfg.accumulator_shape(p.batch, p.heads_q, p.seqlen_q)
        turns = f" and {math.prod(shape[:3]) * 4} bytes of turn counters" if cfg.ordered else ""
        convert = [
            f"{bplan.dq_convert.name_expression} ({bplan.dq_convert.STATIC_SMEM_BYTES} bytes of static shared "
            f"memory: a 64-row tile): dq = scale * the float32 dQ accumulator ({math.prod(shape) * 4} bytes of "
            f"global memory{turns})"
        ]
    return "\n".join([delta] + [describe_plan(p) for p in bplan.plans] + convert)


@dataclasses.dataclass(frozen=True)
class KernelExplanation:
    """One kernel of a call: its plan, layout, rejected candidates and compiled resources."""

    role: str  # "forward", "backward dK/dV", "backward dQ"
    plan: Plan
    compiled: CompileReport | None = None

    @property
    def name_expression(self) -> str:
        return self.plan.config.name_expression

    @property
    def buffers(self) -> tuple[Buffer, ...]:
        return self.plan.layout.buffers

    @property
    def total(self) -> int:
        """Dynamic shared memory of the launch, bytes."""
        return self.plan.smem_bytes

    @property
    def limit(self) -> int:
        return self.plan.device.smem_per_block_optin

    @property
    def rejected(self) -> tuple[Rejected, ...]:
        return self.plan.rejected

    @property
    def blocks_per_sm_by_smem(self) -> int:
        static = self.compiled.static_smem_bytes if self.compiled else 0
        return blocks_per_sm(self.total + static, self.plan.config.threads, self.plan.device)

    @property
    def blocks_per_sm_by_registers(self) -> int | None:
        if self.compiled is None:
            return None
        return blocks_per_sm_by_registers(self.compiled.registers, self.plan.config.threads, self.plan.device)

    @property
    def occupancy(self) -> float | None:
        """Resident warps over the SM's maximum, from shared memory, registers and threads."""
        by_regs = self.blocks_per_sm_by_registers
        if by_regs is None:
            return None
        d = self.plan.device
        blocks = min(self.blocks_per_sm_by_smem, by_regs)
        return blocks * self.plan.config.threads / d.max_threads_per_sm

    def to_dict(self) -> dict:
        c = self.compiled
        return {
            "role": self.role,
            "name_expression": self.name_expression,
            "precision": self.plan.precision,
            "work_split": self.plan.work_split,
            "buffers": [
                dict(name=b.name, shape=list(b.shape), dtype=b.dtype, offset=b.offset, bytes=b.bytes, note=b.note)
                for b in self.buffers
            ],
            "total": self.total,
            "limit": self.limit,
            "rejected": [
                dict(name_expression=r.name_expression, bytes=r.smem_bytes, over_by=r.over_by) for r in self.rejected
            ],
            "skipped_for_registers": [dict(name_expression=n, reason=why) for n, why in self.plan.register_skipped],
            "blocks_per_sm_by_smem": self.blocks_per_sm_by_smem,
            "blocks_per_sm_by_registers": self.blocks_per_sm_by_registers,
            "compiled": None
            if c is None
            else dict(
                arch=c.arch,
                registers=c.registers,
                spill_store_bytes=c.spill_store_bytes,
                spill_load_bytes=c.spill_load_bytes,
                stack_bytes=c.stack_bytes,
                static_smem_bytes=c.static_smem_bytes,
            ),
        }

    def __str__(self) -> str:
        lines = [f"{self.role}: {self.name_expression}", self.plan.layout.table(with_total=False)]
        pct = 100 * self.total / self.limit
        lines.append(
            f"  total {self.total} of {self.limit} bytes opt-in ({pct:.1f}%), "
            f"{self.limit - self.total} to spare; {self.blocks_per_sm_by_smem} block(s) "
            f"per SM by shared memory"
        )
        lines.append(f"  chosen because: {self.plan.reason}")
        lines.append(f"  precision: {precision_text(self.plan)}")
        if self.plan.work_split:
            lines.append(f"  work split: {self.plan.work_split}")
        for r in self.rejected:
            lines.append(f"  rejected {r.name_expression}: {r.smem_bytes} bytes, {r.over_by} over the limit")
        for name, why in self.plan.register_skipped:
            lines.append(f"  skipped {name}: {why}")
        c = self.compiled
        if c is not None:
            lines.append(
                f"  compiled for {c.arch}: {c.registers} registers, spills "
                f"{c.spill_store_bytes} B stored / {c.spill_load_bytes} B loaded, "
                f"stack {c.stack_bytes} B, static shared memory {c.static_smem_bytes} B; "
                f"{self.blocks_per_sm_by_registers} block(s) per SM by registers, "
                f"occupancy {100 * self.occupancy:.0f}%"
            )
        return "\n".join(lines)


@dataclasses.dataclass(frozen=True)
class Explanation:
    device: DeviceSpec
    problem: AttentionProblem
    kernels: tuple[KernelExplanation, ...]

    # The single-kernel fields of the forward (or the first backward kernel),
    # for the common case of looking at one kernel.
    @property
    def buffers(self):
        return self.kernels[0].buffers

    @property
    def total(self) -> int:
        return self.kernels[0].total

    @property
    def limit(self) -> int:
        return self.kernels[0].limit

    @property
    def rejected(self):
        return self.kernels[0].rejected

    @property
    def compiled(self):
        return self.kernels[0].compiled

    def to_dict(self) -> dict:
        return {
            "device": dataclasses.asdict(self.device),
            "problem": dataclasses.asdict(self.problem),
            "kernels": [k.to_dict() for k in self.kernels],
        }

    def __str__(self) -> str:
        p = self.problem
        head = (
            f"{self.device.summary()}\n{p.dtype}, head_dim {p.head_dim}"
            f"{'' if p.head_dim_v == p.head_dim else f' / {p.head_dim_v}'}, "
            f"{'causal' if p.causal else 'not causal'}, B={p.batch} Hq={p.heads_q} "
            f"Hkv={p.heads_kv} Sq={p.seqlen_q} Sk={p.seqlen_k}"
        )
        return "\n\n".join([head] + [str(k) for k in self.kernels])


def _kernel_plans(problem: AttentionProblem, spec: DeviceSpec, backward: bool, policy=None):
    if not backward:
        return [("forward", plan_forward(problem, spec, policy))]
    b = plan_backward(problem, spec, policy)
    if b.dq is None:
        return [("backward dK/dV/dQ (fused)", b.dkdv)]
    return [("backward dK/dV", b.dkdv), ("backward dQ", b.dq)]


def explain(
    head_dim: int = 128,
    dtype: str = "float16",
    *,
    backward: bool = False,
    device: str | DeviceSpec | None = "current",
    smem_limit: int | None = None,
    causal: bool = False,
    head_dim_v: int | None = None,
    batch: int = 4,
    heads: int = 16,
    heads_kv: int | None = None,
    seqlen_q: int = 4096,
    seqlen_k: int | None = None,
    compile: bool = True,
    precision=None,
    deterministic: bool = True,
    policy=None,
) -> Explanation:
    """Where the shared memory of a call's kernels goes, buffer by buffer.

    ``device`` is ``"current"``, a named GPU (``"rtx6000ada"``, ``"sm_89"``) or a
    DeviceSpec; ``compile=True`` compiles each kernel through NVRTC for that
    architecture (no GPU needed) and adds registers, spills, static shared memory
    and occupancy. ``precision``: as ``attention``'s (float32 inputs), e.g. "bf16" to
    see the operands staged as bfloat16. ``deterministic``: as ``attention_backward``'s
    (False may plan one fused dK/dV/dQ pass). ``policy``: a ``cupyattn.plan.Policy`` to plan
    with (None: the default), e.g. to see a kernel family the planner would not take.
    """
    spec = resolve_device(device).with_smem_limit(smem_limit)
    problem = AttentionProblem(
        dtype,
        head_dim,
        head_dim_v or head_dim,
        bool(causal),
        batch,
        heads,
        heads_kv or heads,
        seqlen_q,
        seqlen_k or seqlen_q,
        precision=precision,
        deterministic=deterministic,
    )
    kernels = []
    for role, plan in _kernel_plans(problem, spec, backward, policy):
        report = compile_only(plan.config, spec.arch) if compile else None
        kernels.append(KernelExplanation(role, plan, report))
    return Explanation(spec, problem, tuple(kernels))


@dataclasses.dataclass(frozen=True)
class CapabilityRow:
    head_dim: int
    dtype: str
    kernel: KernelExplanation

    def cells(self) -> list[str]:
        k = self.kernel
        c = k.compiled
        by_regs = k.blocks_per_sm_by_registers
        return [
            str(self.head_dim),
            self.dtype,
            k.role,
            f"`{k.name_expression}`",
            str(k.total),
            f"{100 * k.total / k.limit:.0f}%",
            str(k.blocks_per_sm_by_smem),
            "-" if by_regs is None else str(by_regs),
            "-" if c is None else str(c.registers),
            "-" if c is None else str(c.spills),
        ]


CAPS_COLUMNS = [
    "head dim",
    "dtype",
    "pass",
    "config",
    "smem bytes",
    "of opt-in",
    "blocks/SM (smem)",
    "blocks/SM (regs)",
    "registers",
    "spill bytes",
]


@dataclasses.dataclass(frozen=True)
class CapabilityMatrix:
    device: DeviceSpec
    causal: bool
    rows: tuple[CapabilityRow, ...]

    def header(self) -> str:
        d = self.device
        return (
            f"{d.name} ({d.arch}, {d.sm_count} SMs): shared memory per block "
            f"{d.smem_per_block} default / {d.smem_per_block_optin} opt-in; "
            f"{d.smem_per_sm} per SM; {d.smem_reserved_per_block} reserved per block. "
            f"{'Causal' if self.causal else 'Not causal'}, B=4, H=16, S=4096."
        )

    def _table(self) -> tuple[list[str], list[list[str]]]:
        """Columns and cells; the three compiled columns only when something was compiled."""
        n = len(CAPS_COLUMNS) if any(r.kernel.compiled for r in self.rows) else len(CAPS_COLUMNS) - 3
        return CAPS_COLUMNS[:n], [r.cells()[:n] for r in self.rows]

    def to_markdown(self) -> str:
        columns, cells = self._table()
        lines = [self.header(), "", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines)

    def __str__(self) -> str:
        columns, cells = self._table()
        cells = [[c.strip("`") for c in row] for row in cells]
        widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(columns)]
        fmt = lambda row: "  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip()
        return "\n".join([self.header(), fmt(columns)] + [fmt(r) for r in cells])

    def to_dict(self) -> dict:
        return {
            "device": dataclasses.asdict(self.device),
            "causal": self.causal,
            "rows": [dict(head_dim=r.head_dim, dtype=r.dtype, **r.kernel.to_dict()) for r in self.rows],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1)


def capabilities(
    device: str | DeviceSpec | None = "current",
    *,
    dtypes=DTYPES,
    head_dims=CAPS_HEAD_DIMS,
    causal: bool = True,
    smem_limit: int | None = None,
    compile: bool = False,
    policy=None,
) -> CapabilityMatrix:
    """The capability matrix: for each head dim x dtype, the forward and backward
    kernels the planner picks on ``device`` (B=4, H=16, S=4096) under ``policy`` (None:
    the default), their shared memory and, with ``compile``, registers and spills from NVRTC."""
    spec = resolve_device(device).with_smem_limit(smem_limit)
    rows = []
    for d in head_dims:
        for dtype in dtypes:
            problem = AttentionProblem(dtype, d, d, causal, 4, 16, 16, 4096, 4096)
            for backward in (False, True):
                for role, plan in _kernel_plans(problem, spec, backward, policy):
                    report = compile_only(plan.config, spec.arch) if compile else None
                    rows.append(CapabilityRow(d, dtype, KernelExplanation(role, plan, report)))
    return CapabilityMatrix(spec, causal, tuple(rows))


def named_devices_markdown() -> str:
    """The capability report for every named GPU (plans only, so it is exact and
    reproducible anywhere); docs/capabilities.md holds it and a test compares."""
    from .device import NAMED_DEVICES

    parts = [
        "# Capabilities on named GPUs",
        "",
        "Generated by `python scripts/device_caps.py`; a test checks that this file matches "
        "what the planner produces now. Shared memory per kernel against the GPU's opt-in "
        "limit, for causal attention at B=4, H=16, S=4096. `python -m cupyattn caps --device "
        "NAME --compile` adds registers and spills from NVRTC.",
        "",
    ]
    for key in NAMED_DEVICES:
        parts += [f"## `{key}`", "", capabilities(key).to_markdown(), ""]
    return "\n".join(parts)
