"""Command line.

check     the self-check on this GPU: forward and backward against the float64 reference
caps      the capability matrix: head dim x dtype x pass on a device (named ones need no GPU)
explain   where one call's shared memory goes, buffer by buffer, with compiled resources
plan      the chosen forward configuration and its layout (short form of explain)
warmup    compile every configuration this GPU will use, ahead of time
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np

from .plan import PRECISIONS
from .testing import gpu_unavailable_reason

# (batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal): square, GQA, odd
# sizes with Sq != Sk, and float32 at head dim 128, S = 4096 (past 48 KiB of shared memory).
CHECK_SHAPES = (
    (2, 1024, 1024, 8, 8, 64, False),
    (2, 1024, 1024, 8, 2, 128, True),
    (1, 777, 1029, 4, 4, 96, "top_left"),
    (1, 1, 513, 4, 1, 256, True),
)
FLOAT32_SHAPE = (4, 4096, 4096, 4, 4, 128, True)
CHECK_ROWS = 256  # query rows checked against the float64 reference per shape


def _check_case(dtype, shape, rng, spec, smem_limit, backward):
    """Run one shape against the float64 reference; returns (ok, ms, config names, detail)."""
    import cupy

    from . import api, testing
    from .plan import plan_backward, plan_forward
    from .reference import attention_backward_reference, attention_reference, logit_bound

    B, Sq, Sk, Hq, Hkv, D, causal = shape
    hq = testing.host_values((B, Sq, Hq, D), dtype, rng)
    hk = testing.host_values((B, Sk, Hkv, D), dtype, rng)
    hv = testing.host_values((B, Sk, Hkv, D), dtype, rng)
    q, k, v = (testing.to_device(x, dtype) for x in (hq, hk, hv))
    out = cupy.empty((B, Sq, Hq, D), dtype=q.dtype)
    testing.poison(out)
    run = lambda: api.attention(q, k, v, causal=causal, out=out, return_lse=True, smem_limit=smem_limit)
    _, lse = run()
    problem = api._validate(q, k, v, causal, None, "bshd").problem(out)
    bound = logit_bound(hq, hk)
    if not backward:
        rows = np.sort(rng.choice(Sq, size=min(Sq, CHECK_ROWS), replace=False))
        ref, ref_lse = attention_reference(hq, hk, hv, causal=causal, rows=rows)
        ref_p, _ = attention_reference(hq, hk, hv, causal=causal, rows=rows, precision=dtype)
        cmp = testing.compare(testing.to_host(out)[:, rows], ref, ref_p, dtype, Sk, logit_bound=bound)
        lse_ok = np.allclose(cupy.asnumpy(lse)[:, :, rows], ref_lse, rtol=1e-4, atol=1e-4)
        detail = f"{cmp}; lse {'ok' if lse_ok else 'mismatch'}"
        return cmp.ok and lse_ok, testing.median_ms(run), [plan_forward(problem, spec).config.name_expression], detail
    hdo = testing.host_values((B, Sq, Hq, D), dtype, rng)
    dout = testing.to_device(hdo, dtype)
    grads = [cupy.empty_like(x) for x in (q, k, v)]
    for g in grads:
        testing.poison(g)
    bwd = lambda: api.attention_backward(
        dout, q, k, v, out, lse, causal=causal, dq=grads[0], dk=grads[1], dv=grads[2], smem_limit=smem_limit
    )
    bwd()
    ref = attention_backward_reference(hdo, hq, hk, hv, causal=causal)
    ref_p = attention_backward_reference(hdo, hq, hk, hv, causal=causal, precision=dtype)
    cmps = [
        testing.compare(testing.to_host(g), r, rp, dtype, max(Sq * Hq // Hkv, Sk), factor=3.0, logit_bound=bound)
        for g, r, rp in zip(grads, ref, ref_p)
    ]
    bp = plan_backward(problem, spec)
    names = [p.config.name_expression for p in bp.plans]
    detail = "; ".join(f"{n}: {c}" for n, c in zip(("dq", "dk", "dv"), cmps))
    return all(c.ok for c in cmps), testing.median_ms(bwd), names, detail


def cmd_check(args) -> int:
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"cupyattn check: no usable GPU ({reason}); nothing to check")
        return 1
    from . import testing
    from .device import current_device

    spec = current_device().with_smem_limit(args.smem_limit)
    print(spec.summary())
    rng = np.random.default_rng(args.seed)
    dtypes = ["float16", "bfloat16", "float32"]
    if testing.bfloat16_dtype() is None:
        print("bfloat16 skipped: install ml_dtypes to create bfloat16 arrays")
        dtypes.remove("bfloat16")
    cases = [(dt, shape, bwd) for dt in dtypes for shape in CHECK_SHAPES for bwd in (False, True)]
    cases.append(("float32", FLOAT32_SHAPE, False))
    failures = 0
    print(
        f"{'pass':<4} {'dtype':<9} {'B':>2} {'Sq':>5} {'Sk':>5} {'Hq':>3} {'Hkv':>3} {'D':>4} "
        f"{'causal':<10} {'ms':>8}  result  config"
    )
    for dtype, shape, backward in cases:
        ok, ms, names, detail = _check_case(dtype, shape, rng, spec, args.smem_limit, backward)
        failures += not ok
        B, Sq, Sk, Hq, Hkv, D, causal = shape
        print(
            f"{'bwd' if backward else 'fwd':<4} {dtype:<9} {B:>2} {Sq:>5} {Sk:>5} {Hq:>3} {Hkv:>3} {D:>4} "
            f"{str(causal):<10} {ms:>8.3f}  {'pass' if ok else 'FAIL'}    {' + '.join(names)}"
        )
        if not ok:
            print(f"    {detail}")
    print(f"{len(cases) - failures} passed, {failures} failed")
    return 0 if failures == 0 else 1


def cmd_plan(args) -> int:
    from .device import resolve_device
    from .plan import AttentionProblem, plan_forward

    spec = resolve_device(args.device).with_smem_limit(args.smem_limit)
    problem = AttentionProblem(
        args.dtype,
        args.head_dim,
        args.head_dim_v or args.head_dim,
        args.causal,
        args.batch,
        args.heads,
        args.heads,
        args.seqlen,
        args.seqlen,
        precision=args.precision,
    )
    print(plan_forward(problem, spec).describe())
    return 0


def _device_or_exit(name: str):
    from .device import resolve_device

    reason = gpu_unavailable_reason() if name == "current" else None
    if reason is not None:
        print(f"cupyattn: no usable GPU for --device current ({reason}); name one instead, e.g. --device rtx6000ada")
        sys.exit(1)
    return resolve_device(name)


def cmd_caps(args) -> int:
    from .explain import CAPS_HEAD_DIMS, DTYPES, capabilities

    spec = _device_or_exit(args.device)
    matrix = capabilities(
        spec,
        dtypes=args.dtype or DTYPES,
        head_dims=args.head_dim or CAPS_HEAD_DIMS,
        causal=not args.not_causal,
        smem_limit=args.smem_limit,
        compile=args.compile,
    )
    print(matrix.to_json() if args.json else matrix)
    return 0


def cmd_explain(args) -> int:
    from .explain import explain

    spec = _device_or_exit(args.device)
    result = explain(
        args.head_dim,
        args.dtype,
        backward=args.backward,
        device=spec,
        smem_limit=args.smem_limit,
        causal=args.causal,
        head_dim_v=args.head_dim_v,
        batch=args.batch,
        heads=args.heads,
        seqlen_q=args.seqlen,
        compile=not args.no_compile,
        precision=args.precision,
        deterministic=not args.nondeterministic,
    )
    if args.json:
        import json

        print(json.dumps(result.to_dict(), indent=1))
    else:
        print(result)
    return 0


def cmd_warmup(args) -> int:
    reason = gpu_unavailable_reason()
    if reason is not None:
        print(f"cupyattn warmup: no usable GPU ({reason}); nothing to compile")
        return 1
    from .compile import get_kernel
    from .device import current_device
    from .explain import CAPS_HEAD_DIMS, DTYPES
    from .plan import planned_configs

    spec = current_device().with_smem_limit(args.smem_limit)
    configs = planned_configs(
        spec, args.head_dim or CAPS_HEAD_DIMS, args.dtype or DTYPES, (False, True), precisions=args.precision or (None,)
    )
    if args.shard:  # "i/n": every n-th configuration from the i-th, for n processes side by side
        i, n = (int(x) for x in args.shard.split("/"))
        configs = dict(list(configs.items())[i::n])
    start = time.perf_counter()
    for i, cfg in enumerate(configs.values(), 1):
        t0 = time.perf_counter()
        get_kernel(cfg, spec)
        bar = "#" * (30 * i // len(configs))
        print(
            f"\r[{bar:<30}] {i}/{len(configs)} {time.perf_counter() - t0:6.2f}s {cfg.name_expression:<70}",
            end="",
            flush=True,
        )
    print(
        f"\n{len(configs)} configurations ready in {time.perf_counter() - start:.1f}s "
        "(CuPy's disk cache keeps them for the next process)"
    )
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cupyattn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="run forward and backward against the float64 reference on this GPU")
    check.add_argument("--smem-limit", type=int, default=None, help="plan as if a block had this many bytes")
    check.add_argument("--seed", type=int, default=int(time.time()))
    check.set_defaults(func=cmd_check)
    plan = sub.add_parser("plan", help="show the forward plan and its shared-memory layout")
    plan.add_argument("--device", default="current", help="current, or a named GPU (t4, rtx6000ada, sm_89, ...)")
    plan.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    plan.add_argument("--head-dim", type=int, default=128)
    plan.add_argument("--head-dim-v", type=int, default=None)
    plan.add_argument("--causal", action="store_true")
    plan.add_argument("--batch", type=int, default=4)
    plan.add_argument("--heads", type=int, default=16)
    plan.add_argument("--seqlen", type=int, default=4096)
    plan.add_argument("--smem-limit", type=int, default=None)
    plan.add_argument(
        "--precision",
        action="append",
        choices=PRECISIONS,
        help="float32 only; repeatable, most preferred first (default fp32)",
    )
    plan.set_defaults(func=cmd_plan)

    caps = sub.add_parser("caps", help="capability matrix: head dim x dtype x {forward, backward}")
    caps.add_argument("--device", default="current", help="current, or a named GPU (t4, rtx6000ada, sm_89, ...)")
    caps.add_argument(
        "--dtype", action="append", choices=["float16", "bfloat16", "float32"], help="repeatable; default all three"
    )
    caps.add_argument("--head-dim", action="append", type=int, help="repeatable; default 32 64 96 128 160 192 256")
    caps.add_argument("--not-causal", action="store_true", help="plan the non-causal kernels")
    caps.add_argument("--smem-limit", type=int, default=None)
    caps.add_argument("--compile", action="store_true", help="add registers and spills (NVRTC, no GPU needed)")
    caps.add_argument("--json", action="store_true")
    caps.set_defaults(func=cmd_caps)

    exp = sub.add_parser("explain", help="every shared-memory buffer of a call's kernels")
    exp.add_argument("--device", default="current", help="current, or a named GPU (t4, rtx6000ada, sm_89, ...)")
    exp.add_argument("--dtype", default="float16", choices=["float16", "bfloat16", "float32"])
    exp.add_argument("--head-dim", type=int, default=128)
    exp.add_argument("--head-dim-v", type=int, default=None)
    exp.add_argument("--backward", action="store_true", help="the backward's dK/dV and dQ kernels")
    exp.add_argument(
        "--nondeterministic",
        action="store_true",
        help="the backward with deterministic=False (dQ may be fused into dK/dV, by atomics)",
    )
    exp.add_argument("--causal", action="store_true")
    exp.add_argument("--batch", type=int, default=4)
    exp.add_argument("--heads", type=int, default=16)
    exp.add_argument("--seqlen", type=int, default=4096)
    exp.add_argument("--smem-limit", type=int, default=None)
    exp.add_argument(
        "--precision",
        action="append",
        choices=PRECISIONS,
        help="float32 only; repeatable, most preferred first (default fp32)",
    )
    exp.add_argument("--no-compile", action="store_true", help="skip the NVRTC resource report")
    exp.add_argument("--json", action="store_true")
    exp.set_defaults(func=cmd_explain)

    warm = sub.add_parser("warmup", help="precompile every configuration this GPU will use")
    warm.add_argument("--dtype", action="append", choices=["float16", "bfloat16", "float32"])
    warm.add_argument("--head-dim", action="append", type=int)
    warm.add_argument(
        "--precision", action="append", choices=PRECISIONS, help="float32 modes to compile (repeatable; default fp32)"
    )
    warm.add_argument(
        "--shard",
        default=None,
        help="i/n: compile every n-th configuration from the i-th "
        "(run n processes side by side; NVRTC compiles one at a time per process)",
    )
    warm.add_argument("--smem-limit", type=int, default=None)
    warm.set_defaults(func=cmd_warmup)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except ValueError as exc:  # unknown device name, no plan fits, bad limit: one readable line
        print(f"cupyattn {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
