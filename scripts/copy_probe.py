"""What the wgmma kernels' bulk copies cost: A/B the tree against copies of itself whose
copies (kernels/wgmma.cuh, bulk_copy_to_shared, at its `// copy probe` mark) move fewer
bytes, or as many bytes of which fewer are distinct. Results of the probed copies are
wrong (timing only); one device call, ~1 minute a variant and case.

    PYTHONPATH=. python scripts/copy_probe.py --cases fp32:256 [--causal both]
        [--pass bwd] [--variants half,same-source,none] [--rounds 2] [--compile-only]

Variants (each copy's `bytes` as the kernel asks for them):
  half         its first half only (the rest of the destination keeps what it held);
  same-source  all of them, the second half from the source's first half again: the
               same bytes into the SM, half of them distinct (fewer misses in L2);
  none         16 bytes.
Where `half` and `same-source` gain alike, the distinct bytes (memory behind L2) are
what costs, not the bytes moved into the SMs (twenty-fourth session: "fp32" D=256 causal
backward -4.4% / -4.8%, not causal -2.7% / -1.0%). Each variant runs as the "after" tree
of scripts/ab_trees.py against this tree; --compile-only (no GPU) compiles each
variant's planned backward kernels of the first case for sm_90a instead.
"""

import argparse
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from phase_clocks import compile_planned_backward  # (scripts/ is this script's own directory)

ROOT = Path(__file__).resolve().parents[1]
HEADER = "wgmma.cuh"
MARK = "    // copy probe\n"
_ARRIVE = ('asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\\n" '
           '::"r"(wg_smem_addr(bar)), "r"(bytes) : "memory");')


def _copy(dst: str, src: str, size: str) -> str:
    return ('asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\\n" '
            f'::"r"({dst}), "l"({src}), "r"({size}), "r"(wg_smem_addr(bar)) : "memory");')


VARIANTS = {
    "half": "    bytes = (bytes / 2 + 15) / 16 * 16;  // copy probe: half\n",
    "same-source": ("    if (bytes % 32 == 0) {  // copy probe: same-source\n"
                    f"        {_ARRIVE}\n"
                    f"        {_copy('wg_smem_addr(dst)', 'src', 'bytes / 2')}\n"
                    f"        {_copy('wg_smem_addr(dst) + bytes / 2', 'src', 'bytes / 2')}\n"
                    "        return;\n"
                    "    }\n"),
    "none": "    bytes = 16u;  // copy probe: none\n",
}


def probe(source: str, variant: str) -> str:
    """The header with the copy probe's mark replaced by ``variant``'s code."""
    if source.count(MARK) != 1:
        raise ValueError(f"{HEADER}: expected one '{MARK.strip()}' mark in bulk_copy_to_shared")
    return source.replace(MARK, VARIANTS[variant])


def probed_copy(tree: Path, into: Path, variant: str) -> None:
    """cupyattn/, kernels/ and scripts/ of ``tree`` in ``into``, the header probed."""
    for part in ("cupyattn", "kernels", "scripts"):
        shutil.copytree(tree / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))
    header = into / "kernels" / HEADER
    header.write_text(probe(header.read_text(), variant))


def _compile_worker(copy: str, case: str, causal: bool) -> None:
    precision, dim = case.split(":")
    compile_planned_backward(copy, int(dim), precision, causal)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", default="fp32:256", help="float32 precision : head dim, comma-separated")
    parser.add_argument("--causal", default="both", choices=["yes", "no", "both"])
    parser.add_argument("--pass", dest="passes", default="bwd")
    parser.add_argument("--variants", default="half,same-source,none")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tree", default=str(ROOT), help="directory holding cupyattn/, kernels/ and scripts/")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--compile-worker", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.compile_worker:
        copy, case, causal = args.compile_worker
        return _compile_worker(copy, case, causal == "yes")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        parser.error(f"--variants: expected some of {', '.join(VARIANTS)}, got {', '.join(unknown)}")
    tree = Path(args.tree).resolve()
    rc = 0
    for variant in variants:
        with tempfile.TemporaryDirectory() as tmp:
            probed_copy(tree, Path(tmp), variant)
            print(f"== {variant}", flush=True)
            if args.compile_only:
                cmd = [sys.executable, str(Path(__file__).resolve()), "--compile-worker", tmp, args.cases.split(",")[0],
                       "yes" if args.causal == "yes" else "no"]
            else:
                cmd = [sys.executable, str(Path(tmp) / "scripts" / "ab_trees.py"), "--before", str(tree),
                       "--cases", args.cases, "--causal", args.causal, "--pass", args.passes,
                       "--rounds", str(args.rounds)]
            rc |= subprocess.run(cmd).returncode
    sys.exit(rc)


if __name__ == "__main__":
    main()
