"""A/B two cupyattn trees in one device call: the same cases timed on each, rounds
alternating between the trees, so that before / after ratios do not carry the
run-to-run spread between device calls (up to ~9% on the H200: BENCHMARKS.md,
eleventh session).

The other tree is a plain copy of an earlier revision's code inside the checkout
(the device sees the working tree only; a directory git does not ignore travels with
it, and none of it may be committed):

    mkdir -p ab_before && git archive REV cupyattn kernels | tar -x -C ab_before
    PYTHONPATH=. python scripts/ab_trees.py --before ab_before \\
        --cases float16:64,tf32:128,fp32:128 [--causal yes|no|both] [--seqlens 1024,4096] [--rounds 2]

Each case is dtype or float32 precision : head dim; B=4, H=16 as the other benchmarks.
Inputs and timing come from each tree's own cupyattn.testing (device_values, median_ms:
any revision from 2026-12-02 on).
Each tree runs in its own process (CuPy's kernel cache keys on the kernels' hash, so the
trees' kernels do not mix). Before the first round every (tree, case, causal) runs once
in its own process, --warm-jobs at a time, so that the kernels compile in parallel
rather than one at a time in the first round's two processes (device time is what a
session is short of). Prints one table: median ms of each tree's rounds, and the change
after / before.
"""

import argparse
import json
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(tree, cases, seqlens, causals, passes, repeats):
    """Time every case with the cupyattn found in ``tree``; one JSON line each."""
    sys.path.insert(0, str(Path(tree).resolve()))
    import cupy

    import cupyattn
    from cupyattn.testing import device_values, median_ms  # the tree's own

    B, H = 4, 16
    for case in cases:
        mode, D = case.split(":")
        dtype, precision = (mode, None) if mode in ("float16", "bfloat16") else ("float32", mode)
        for S in seqlens:
            rng = cupy.random.default_rng(0)
            q, k, v, do = (device_values((B, S, H, int(D)), dtype, rng) for _ in range(4))
            for causal in causals:
                opts = dict(causal=causal, **({"precision": precision} if precision else {}))
                row = dict(case=case, S=S, causal=causal)
                if "fwd" in passes:
                    row["fwd"] = median_ms(lambda: cupyattn.attention(q, k, v, **opts), repeats=repeats)
                if "bwd" in passes:
                    out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
                    row["bwd"] = median_ms(lambda: cupyattn.attention_backward(do, q, k, v, out, lse, **opts),
                                          repeats=repeats)
                print(json.dumps(row), flush=True)


def worker_command(tree: str, args, cases: str, causal: str, repeats: int) -> list:
    """The command line of one worker: ``tree``'s cupyattn timing ``cases`` (comma-separated)."""
    return [sys.executable, __file__, "--worker", tree, "--before", args.before, "--cases", cases,
            "--seqlens", args.seqlens, "--causal", causal, "--pass", args.passes, "--repeats", str(repeats)]


def warm_commands(args) -> list:
    """(tree, command) of each warm-up worker: every tree, case and causality once, one
    repeat, so that each process compiles a few kernels."""
    causals = ["no", "yes"] if args.causal == "both" else [args.causal]
    return [(tree, worker_command(tree, args, case, causal, 1))
            for tree in (args.before, args.after) for case in args.cases.split(",") for causal in causals]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="directory holding the earlier tree's cupyattn/ and kernels/")
    parser.add_argument("--after", default=str(ROOT), help="the tree to compare (default: this checkout)")
    parser.add_argument("--cases", default="float16:64,float16:128,tf32:128,fp32:128")
    parser.add_argument("--seqlens", default="4096")
    parser.add_argument("--causal", default="both", choices=["yes", "no", "both"])
    parser.add_argument("--pass", dest="passes", default="fwd,bwd")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warm-jobs", type=int, default=8,
                        help="warm-up processes at a time before the first round (0: no warm-up)")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser


def main():
    parser = build_parser()
    args = parser.parse_args()
    cases = args.cases.split(",")
    seqlens = [int(s) for s in args.seqlens.split(",")]
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    if args.worker:
        _worker(args.worker, cases, seqlens, causals, args.passes.split(","), args.repeats)
        return
    for tree in (args.before, args.after):
        if not (Path(tree) / "cupyattn" / "__init__.py").is_file():
            parser.error(f"--before / --after: expected a directory with cupyattn/ and kernels/, got {tree!r}")
    if args.warm_jobs > 0:
        with ThreadPoolExecutor(args.warm_jobs) as pool:
            list(pool.map(lambda job: subprocess.run(job[1], check=True, capture_output=True, cwd=job[0]),
                          warm_commands(args)))
    results = {}  # (tree, case, S, causal, pass) -> [ms per round]
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", args.after)):
            cmd = worker_command(tree, args, args.cases, args.causal, args.repeats)
            lines = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=tree).stdout
            for line in lines.splitlines():
                row = json.loads(line)
                for p in args.passes.split(","):
                    results.setdefault((name, row["case"], row["S"], row["causal"], p), []).append(row[p])
    print(f"before: {args.before}, after: {args.after}; B=4, H=16, median ms over {args.rounds} rounds "
          f"(each the median of {args.repeats})\n")
    print("| case | S | causal | pass | before | after | change |")
    print("|---|---|---|---|---|---|---|")
    for (name, case, S, causal, p), times in results.items():
        if name != "before":
            continue
        before, after = statistics.median(times), statistics.median(results[("after", case, S, causal, p)])
        print(f"| {case} | {S} | {'yes' if causal else 'no'} | {p} | {before:.3f} | {after:.3f} | "
              f"{after / before - 1:+.1%} |")


if __name__ == "__main__":
    main()
