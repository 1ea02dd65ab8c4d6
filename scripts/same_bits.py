"""Two cupyattn trees' results on the same inputs, compared bit for bit, in one device call.

For a change that must not move a single result (a refactor, a new schedule that keeps
every sum in its order): each tree computes the forward and the backward of the same
random inputs in its own process (CuPy's kernel cache keys on the kernels' hash, so the
trees' kernels do not mix), and every output and gradient is compared as raw bits.
The other tree is made as for scripts/ab_trees.py:

    mkdir -p ab_before && git archive REV cupyattn kernels | tar -x -C ab_before
    PYTHONPATH=. python scripts/same_bits.py --before ab_before [--after .]

Cases: float32 "fp32" at head dims 64, 128, 200, 256 and "tf32" at 64, 128, 256, causal and
not, B=2, H=8, Sq=1000, Sk=1100 (deterministic backward); head dim 64 at Sq=2100, Sk=2200.
On the H200 every case plans the wgmma kernels, forward, dK/dV and dQ (the backward takes
them from 1024 streamed rows below padded head dim 128, plan.wgmma_backward_min_rows, and
with fewer blocks than SMs the planner picked smaller mma.sync tiles at H=4). Prints each array that
differs, then `bitwise: N same, M differ`; exits 1 if any differs.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CASES = [(d, causal, "fp32") for d in (64, 128, 200, 256) for causal in (False, True)]
CASES += [(d, causal, "tf32") for d in (64, 128, 256) for causal in (False, True)]
B, H = 2, 8


def lengths(head_dim: int) -> tuple:
    """(seqlen_q, seqlen_k) of a case: long enough that the backward takes the wgmma tiles."""
    return (2100, 2200) if head_dim < 128 else (1000, 1100)


def _worker(tree: str, out: str):
    """Every case's out, dq, dk, dv with the cupyattn found in ``tree``, into ``out`` (.npz)."""
    sys.path.insert(0, str(Path(tree).resolve()))
    import cupy

    import cupyattn

    results = {}
    for d, causal, precision in CASES:
        Sq, Sk = lengths(d)
        rng = cupy.random.default_rng(1)
        q = rng.standard_normal((B, Sq, H, d), dtype=cupy.float32)
        k = rng.standard_normal((B, Sk, H, d), dtype=cupy.float32)
        v = rng.standard_normal((B, Sk, H, d), dtype=cupy.float32)
        do = rng.standard_normal((B, Sq, H, d), dtype=cupy.float32)
        o, lse = cupyattn.attention(q, k, v, causal=causal, precision=precision, return_lse=True)
        grads = cupyattn.attention_backward(do, q, k, v, o, lse, causal=causal, precision=precision)
        key = f"{precision}_d{d}_{'causal' if causal else 'full'}"
        results[f"{key}_out"] = cupy.asnumpy(o)
        for name, g in zip(("dq", "dk", "dv"), grads):
            results[f"{key}_{name}"] = cupy.asnumpy(g)
    np.savez(out, **results)


def differing(before, after) -> list:
    """(name, max |before - after|) of each array whose bits differ (shape, or any bit:
    -0.0 against 0.0 too, while NaN against the same NaN is the same)."""
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


def worker_command(tree: str, out: str) -> list:
    """The command line of one tree's worker process."""
    return [sys.executable, __file__, "--worker", tree, out]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Not required=True: the worker's command line (worker_command) names no --before.
    parser.add_argument("--before", help="directory holding the earlier tree's cupyattn/ and kernels/")
    parser.add_argument("--after", default=str(ROOT), help="the tree to compare (default: this checkout)")
    parser.add_argument("--worker", nargs=2, default=None, help=argparse.SUPPRESS)
    return parser


def main():
    args = build_parser().parse_args()
    if args.worker:
        _worker(*args.worker)
        return 0
    if args.before is None:
        build_parser().error("--before: expected the directory of the earlier tree, got nothing")
    for tree in (args.before, args.after):
        if not (Path(tree) / "cupyattn" / "__init__.py").is_file():
            build_parser().error(f"--before / --after: expected a directory with cupyattn/ and kernels/, got {tree!r}")
    with tempfile.TemporaryDirectory() as tmp:
        files = []
        for i, tree in enumerate((args.before, args.after)):
            out = str(Path(tmp) / f"tree{i}.npz")
            subprocess.run(worker_command(tree, out), check=True)
            files.append(np.load(out))
        before, after = ({key: f[key] for key in f.files} for f in files)
        diffs = differing(before, after)
        for key, delta in diffs:
            print(f"DIFF {key}: max |before - after| {delta:.3e}", flush=True)
        print(f"bitwise: {len(before) - len(diffs)} same, {len(diffs)} differ")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
