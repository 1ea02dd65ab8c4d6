"""Two cupyattn trees on one GPU: is a change faster, and does it keep every result bit
for bit?

  time  The same cases timed on each tree, rounds alternating between the trees, so that
        before / after ratios do not carry the spread between separate runs. Each case is
        dtype or float32 precision : head dim; B=4, H=16; inputs and timing from each
        tree's own cupyattn.testing (device_values, median_ms). Before the first round
        every (tree, case, causal) runs once in its own process, --warm-jobs at a time,
        so that the kernels compile in parallel. Prints one table: median ms of each
        tree's rounds, and the change after / before.
  bits  For a change that must not move a single result (a refactor, a schedule that
        keeps every sum in its order): each tree computes the forward and the backward
        of the same random inputs (float32 "fp32" at head dims 64, 128, 200, 256 and
        "tf32" at 64, 128, 256, causal and not, B=2, H=8, deterministic backward, long
        enough that the H200 plans the wgmma kernels), and every output and gradient is
        compared as raw bits (-0.0 against 0.0 differs, a NaN against the same NaN does
        not). Prints each array that differs, then `bitwise: N same, M differ`; exits 1
        if any differs. --save DIR keeps each tree's results (before.npz, after.npz);
        --compare BEFORE.npz AFTER.npz compares two kept files, no GPU needed.

Each tree runs in its own process with the tree on PYTHONPATH (CuPy's kernel cache keys
on the kernels' hash, so the trees' kernels do not mix). The earlier tree is a copy of a
revision's code inside the checkout (not committed):

    mkdir -p ab_before && git archive REV cupyattn kernels | tar -x -C ab_before
    PYTHONPATH=. python scripts/ab_trees.py time --before ab_before \\
        --cases float16:64,tf32:128,fp32:128 [--causal yes|no|both] [--seqlens 1024,4096] [--rounds 2]
    PYTHONPATH=. python scripts/ab_trees.py bits --before ab_before [--after .] [--save DIR]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
BITS_CASES = [(d, causal, "fp32") for d in (64, 128, 200, 256) for causal in (False, True)]
BITS_CASES += [(d, causal, "tf32") for d in (64, 128, 256) for causal in (False, True)]


def _own_cupyattn(tree: str):
    """cupyattn, checked to be the one in ``tree`` (the worker's PYTHONPATH)."""
    import cupyattn

    found = Path(cupyattn.__file__).resolve().parents[1]
    if found != Path(tree).resolve():
        raise SystemExit(f"worker: expected the cupyattn of {tree}, imported {found}")
    return cupyattn


def _time_worker(args):
    """Time every case with this tree's cupyattn; one JSON line each."""
    cupyattn = _own_cupyattn(args.worker)
    import cupy

    from cupyattn.testing import device_values, median_ms

    B, H = 4, 16
    causals = {"yes": [True], "no": [False], "both": [False, True]}[args.causal]
    for case in args.cases.split(","):
        mode, D = case.split(":")
        dtype, precision = (mode, None) if mode in ("float16", "bfloat16") else ("float32", mode)
        for S in (int(s) for s in args.seqlens.split(",")):
            rng = cupy.random.default_rng(0)
            q, k, v, do = (device_values((B, S, H, int(D)), dtype, rng) for _ in range(4))
            for causal in causals:
                opts = dict(causal=causal, **({"precision": precision} if precision else {}))
                row = dict(case=case, S=S, causal=causal)
                if "fwd" in args.passes:
                    row["fwd"] = median_ms(lambda: cupyattn.attention(q, k, v, **opts), repeats=args.repeats)
                if "bwd" in args.passes:
                    out, lse = cupyattn.attention(q, k, v, return_lse=True, **opts)
                    row["bwd"] = median_ms(
                        lambda: cupyattn.attention_backward(do, q, k, v, out, lse, **opts), repeats=args.repeats
                    )
                print(json.dumps(row), flush=True)


def _bits_worker(args):
    """Every case's out, dq, dk, dv with this tree's cupyattn, into args.out (.npz)."""
    cupyattn = _own_cupyattn(args.worker)
    import cupy

    B, H = 2, 8
    results = {}
    for d, causal, precision in BITS_CASES:
        Sq, Sk = (2100, 2200) if d < 128 else (1000, 1100)
        rng = cupy.random.default_rng(1)
        q, k, v, do = (
            rng.standard_normal(shape, dtype=cupy.float32)
            for shape in ((B, Sq, H, d), (B, Sk, H, d), (B, Sk, H, d), (B, Sq, H, d))
        )
        o, lse = cupyattn.attention(q, k, v, causal=causal, precision=precision, return_lse=True)
        grads = cupyattn.attention_backward(do, q, k, v, o, lse, causal=causal, precision=precision)
        key = f"{precision}_d{d}_{'causal' if causal else 'full'}"
        results[f"{key}_out"] = cupy.asnumpy(o)
        for name, g in zip(("dq", "dk", "dv"), grads):
            results[f"{key}_{name}"] = cupy.asnumpy(g)
    np.savez(args.out, **results)


def differing(before, after) -> list:
    """(name, max |before - after|) of each array whose bits differ (shape, dtype, a missing
    array: NaN)."""
    out = []
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            out.append((key, float("nan")))
            continue
        x, y = np.asarray(before[key]), np.asarray(after[key])
        if x.shape != y.shape or x.dtype != y.dtype:
            out.append((key, float("nan")))
        elif not np.array_equal(x.view(np.uint8), y.view(np.uint8)):
            with np.errstate(invalid="ignore"):
                out.append((key, float(np.nanmax(np.abs(x.astype(np.float64) - y.astype(np.float64))))))
    return out


def _run_worker(tree: str, argv: list, **kwargs) -> subprocess.CompletedProcess:
    """This script as a worker (argv after the script's path) with ``tree`` on PYTHONPATH, run
    in the tree (named by its absolute path: a relative one would not name it from there)."""
    tree = str(Path(tree).resolve())
    env = {**os.environ, "PYTHONPATH": tree}
    return subprocess.run([sys.executable, __file__, *argv, "--worker", tree], env=env, cwd=tree, check=True, **kwargs)


def _time_argv(args, cases: str, causal: str, repeats: int) -> list:
    return [
        "time",
        "--cases",
        cases,
        "--seqlens",
        args.seqlens,
        "--causal",
        causal,
        "--pass",
        args.passes,
        "--repeats",
        str(repeats),
    ]


def time_trees(args):
    causals = ["no", "yes"] if args.causal == "both" else [args.causal]
    warm = [
        (tree, _time_argv(args, case, causal, 1))
        for tree in (args.before, args.after)
        for case in args.cases.split(",")
        for causal in causals
    ]
    if args.warm_jobs > 0:
        with ThreadPoolExecutor(args.warm_jobs) as pool:
            list(pool.map(lambda job: _run_worker(*job, capture_output=True), warm))
    results = {}  # (tree, case, S, causal, pass) -> [ms per round]
    for _ in range(args.rounds):
        for name, tree in (("before", args.before), ("after", args.after)):
            lines = _run_worker(
                tree, _time_argv(args, args.cases, args.causal, args.repeats), capture_output=True, text=True
            ).stdout
            for line in lines.splitlines():
                row = json.loads(line)
                for p in args.passes.split(","):
                    results.setdefault((name, row["case"], row["S"], row["causal"], p), []).append(row[p])
    print(
        f"before: {args.before}, after: {args.after}; B=4, H=16, median ms over {args.rounds} rounds "
        f"(each the median of {args.repeats})\n"
    )
    print("| case | S | causal | pass | before | after | change |")
    print("|---|---|---|---|---|---|---|")
    for (name, case, S, causal, p), times in results.items():
        if name == "before":
            before, after = statistics.median(times), statistics.median(results[("after", case, S, causal, p)])
            print(
                f"| {case} | {S} | {'yes' if causal else 'no'} | {p} | {before:.3f} | {after:.3f} | "
                f"{after / before - 1:+.1%} |"
            )


def compare(before_file, after_file) -> int:
    with np.load(before_file) as b, np.load(after_file) as a:
        before, after = {k: b[k] for k in b.files}, {k: a[k] for k in a.files}
    diffs = differing(before, after)
    for key, delta in diffs:
        print(f"DIFF {key}: max |before - after| {delta:.3e}", flush=True)
    print(f"bitwise: {len(set(before) | set(after)) - len(diffs)} same, {len(diffs)} differ")
    return 1 if diffs else 0


def bits(args) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        keep = Path(args.save or tmp)
        keep.mkdir(parents=True, exist_ok=True)
        files = [str((keep / f"{name}.npz").resolve()) for name in ("before", "after")]
        for tree, out in zip((args.before, args.after), files):
            _run_worker(tree, ["bits", "--out", out])
        return compare(*files)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("time", help="time the same cases on both trees")
    b = sub.add_parser("bits", help="compare both trees' results bit for bit")
    for p in (t, b):
        p.add_argument("--before", help="directory holding the earlier tree's cupyattn/ and kernels/")
        p.add_argument("--after", default=str(ROOT), help="the tree to compare (default: this checkout)")
        p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    t.add_argument("--cases", default="float16:64,float16:128,tf32:128,fp32:128")
    t.add_argument("--seqlens", default="4096")
    t.add_argument("--causal", default="both", choices=["yes", "no", "both"])
    t.add_argument("--pass", dest="passes", default="fwd,bwd")
    t.add_argument("--rounds", type=int, default=2)
    t.add_argument("--repeats", type=int, default=10)
    t.add_argument(
        "--warm-jobs", type=int, default=8, help="warm-up processes at a time before the first round (0: no warm-up)"
    )
    b.add_argument("--save", default=None, help="keep each tree's results here (before.npz, after.npz)")
    b.add_argument(
        "--compare",
        nargs=2,
        metavar=("BEFORE", "AFTER"),
        default=None,
        help="compare two kept result files, no GPU needed",
    )
    b.add_argument("--out", default=None, help=argparse.SUPPRESS)
    return parser


def main() -> int:
    parser = build_parser()
    args = parser.parse_args()
    if args.worker:
        (_time_worker if args.command == "time" else _bits_worker)(args)
        return 0
    if args.command == "bits" and args.compare:
        return compare(*args.compare)
    if args.before is None:
        parser.error("--before: expected the directory of the earlier tree, got nothing")
    for tree in (args.before, args.after):
        if not (Path(tree) / "cupyattn" / "__init__.py").is_file():
            parser.error(f"--before / --after: expected a directory with cupyattn/ and kernels/, got {tree!r}")
    if args.command == "time":
        time_trees(args)
        return 0
    return bits(args)


if __name__ == "__main__":
    sys.exit(main())
