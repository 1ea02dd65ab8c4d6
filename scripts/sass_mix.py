"""Instruction mix and stall samples by opcode, per kernel, from Nsight Compute's SASS page.

The warp-state samples of `WarpStateStats` say why warps stall; this says at which
instructions, grouped by opcode (HGMMA, FADD, the uniform-datapath ops that build wgmma
descriptors, ...), and lists the hottest instructions. From a report with source
counters (`--set full`), on the GPU machine:

    ncu --clock-control none -k 'regex:attn_bwd_(dkdv|dq)_wgmma' --launch-skip 2 --launch-count 2 \\
        --set full --import-source no -o rep python3 scripts/profile_case.py --dtype float32 \\
        --precision fp32 --dim 128 --seqlen 4096
    ncu -i rep.ncu-rep --page source --csv --print-source sass > sass.csv

then anywhere: `python scripts/sass_mix.py sass.csv [--top 12] [--hot 10] [--reasons 8]`
(--reasons: each stall reason's share and the opcodes it stalled at; the twentieth
session found a load's wait and a branch an entry that way: BENCHMARKS.md).
"""

import argparse
import collections
import csv
import io
import sys

SAMPLES = "Warp Stall Sampling (All Samples)"
EXECUTED = "Instructions Executed"


def kernels(text: str) -> list:
    """(kernel name, rows) per kernel of the CSV: each row a dict of its columns."""
    out = []
    for block in text.split('"Kernel Name"')[1:]:
        lines = block.splitlines()
        name = next(csv.reader([lines[0]]))[1] if lines[0].startswith(",") else lines[0]
        rows = list(csv.DictReader(io.StringIO("\n".join(lines[1:]))))
        out.append((name, rows))
    return out


def opcode(source: str) -> str:
    """The opcode of a SASS line without its predicate and modifiers: '@P0 FADD.FTZ R1, ...' -> 'FADD'."""
    words = source.split()
    if not words:
        return "?"
    op = words[1] if words[0].startswith("@") and len(words) > 1 else words[0]
    return op.split(".")[0]


def mix(rows) -> tuple:
    """({opcode: (share of instructions executed, share of stall samples)}, executed, samples)."""
    executed, samples = collections.Counter(), collections.Counter()
    for row in rows:
        op = opcode(row["Source"])
        executed[op] += int(row[EXECUTED] or 0)
        samples[op] += int(row[SAMPLES] or 0)
    total_e, total_s = sum(executed.values()), sum(samples.values())
    shares = {op: (executed[op] / max(total_e, 1), samples[op] / max(total_s, 1)) for op in executed}
    return shares, total_e, total_s


def reasons(rows) -> list:
    """[(stall reason, share of all samples, [(opcode, share of all samples), ...])], most
    sampled first: ncu's per-instruction stall columns (``stall_*``, all samples, not the
    not-issued ones) summed by reason and, within each, by the opcode the warp waited at
    (a long scoreboard at an IMAD.MOV after a load, a barrier at WARPGROUP.DEPBAR, ...)."""
    columns = [c for c in (rows[0] if rows else {}) if c.startswith("stall_") and "Not Issued" not in c]
    by_reason = {c: collections.Counter() for c in columns}
    for row in rows:
        op = opcode(row["Source"])
        for c in columns:
            by_reason[c][op] += int(row[c] or 0)
    total = sum(sum(ops.values()) for ops in by_reason.values())
    out = [(c[len("stall_"):], sum(ops.values()) / max(total, 1),
            [(op, n / max(total, 1)) for op, n in ops.most_common() if n])
           for c, ops in by_reason.items()]
    return sorted(out, key=lambda r: -r[1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", help="ncu -i REPORT --page source --csv --print-source sass > FILE")
    parser.add_argument("--top", type=int, default=12, help="opcodes to list, by instructions executed")
    parser.add_argument("--hot", type=int, default=10, help="instructions to list, by stall samples")
    parser.add_argument("--reasons", type=int, default=8,
                        help="stall reasons to list, each with the opcodes it stalled at (0: none)")
    args = parser.parse_args()
    with open(args.csv) as f:
        found = kernels(f.read())
    if not found:
        parser.error(f"csv: expected ncu's SASS source page (a \"Kernel Name\" line per kernel), got none in {args.csv}")
    for name, rows in found:
        shares, executed, samples = mix(rows)
        print(f"{name[:120]}\n  {executed:,} instructions executed, {samples:,} stall samples")
        for op, (e, s) in sorted(shares.items(), key=lambda kv: -kv[1][0])[:args.top]:
            print(f"  {op:12s} {100 * e:5.1f}% of instructions  {100 * s:5.1f}% of stall samples")
        if args.reasons:
            print("  stall reasons (share of samples; where):")
            for reason, share, ops in reasons(rows)[:args.reasons]:
                where = ", ".join(f"{op} {100 * x:.1f}%" for op, x in ops[:4])
                print(f"  {reason:18s} {100 * share:5.1f}%  {where}")
        print("  hottest:")
        for row in sorted(rows, key=lambda r: -int(r[SAMPLES] or 0))[:args.hot]:
            print(f"  {int(row[SAMPLES] or 0):>9,}  {row['Source'].strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
