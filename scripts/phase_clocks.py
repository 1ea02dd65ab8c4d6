"""Where an item's time goes inside the wgmma backward kernels, phase by phase, from the
SM's own clock: one device call, no profiler.

kernels/attn_bwd_wgmma.cuh marks the phases of dK/dV's item and dQ's key tile with
comments (`// clock phases: begin`, `// clock phase: NAME` after each phase, `// clock
phases: end`), which compile to nothing. This script copies a tree's cupyattn/ and
kernels/ to a temporary directory, turns the comments into code there (lane 0 of each
warpgroup reads clock() at each mark and adds the cycles since the last one to the
phase's count; at the end the first two warpgroups add their counts to a __device__
array, cupyattn_clock_phases), runs one backward call of that copy (after a warm-up
one), every launch timed alone, and prints each phase's share of each warpgroup's
cycles for the dK/dV and dQ launches. Each block's thread 0 also keeps the global timer
at the loop's begin and end and its SM, for one more line a launch: the share of the SMs'
time inside the loop, between loops (epilogues, launches, prologues) and idle at the end
(the last wave's tail). The copy's kernels are not the tree's (the clock reads and their
registers move instructions), so read shares, not milliseconds.

    PYTHONPATH=. python scripts/phase_clocks.py --dim 256 --precision fp32 [--causal]
        [--tree DIR] [--compile-only]

--compile-only (no GPU needed) builds the instrumented copy and compiles the planned
dK/dV and dQ kernels for sm_90a, printing registers and spills.
"""

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADER = "attn_bwd_wgmma.cuh"
GLOBAL = "cupyattn_clock_phases"
TIMES = "cupyattn_block_times"  # per block: %globaltimer at the loop's begin and end, %smid, at entry
MAX_PHASES = 16
MAX_BLOCKS = 16384
MARK = re.compile(r"^(\s*)// clock (phases: begin|phases: end|block: entry|phase: (.+?))\s*$")


def phase_names(source: str) -> list[str]:
    """The phase names in order of first appearance (one index each, kernels sharing them)."""
    names = []
    for line in source.splitlines():
        m = MARK.match(line)
        if m and m.group(3) and m.group(3) not in names:
            names.append(m.group(3))
    if len(names) > MAX_PHASES:
        raise ValueError(f"{len(names)} phases marked; at most {MAX_PHASES}")
    return names


def instrument(source: str) -> str:
    """The header with its clock comments turned into code (see the module's text)."""
    names = phase_names(source)
    out = []
    for line in source.splitlines():
        m = MARK.match(line)
        if not m:
            out.append(line)
            continue
        pad, what = m.group(1), m.group(2)
        if what == "phases: begin":
            # The counts in shared memory, a row a warpgroup, each its lane 0's alone: in
            # registers (all threads) they spilled the "fp32" D=256 dQ copy.
            out.append(f"{pad}__shared__ unsigned clock_cycles[4][{MAX_PHASES}];")
            out.append(f"{pad}if (threadIdx.x % 128 == 0)")
            out.append(f"{pad}    for (int i = 0; i < {MAX_PHASES}; ++i) clock_cycles[threadIdx.x / 128][i] = 0;")
            out.append(f"{pad}unsigned clock_last = (unsigned)clock();")
            out.append(f"{pad}{_block_time(0, with_sm=True)}")
        elif what == "block: entry":
            out.append(f"{pad}{_block_time(3)}")
        elif what == "phases: end":
            out.append(f"{pad}{_block_time(1)}")
            out.append(f"{pad}if (threadIdx.x % 128 == 0 && threadIdx.x / 128 < 2)")
            out.append(f"{pad}    for (int i = 0; i < {MAX_PHASES}; ++i)")
            out.append(f"{pad}        atomicAdd(&{GLOBAL}[threadIdx.x / 128][i], "
                       f"(unsigned long long)clock_cycles[threadIdx.x / 128][i]);")
        else:
            i = names.index(m.group(3))
            out.append(f"{pad}if (threadIdx.x % 128 == 0) {{ const unsigned clock_now = (unsigned)clock(); "
                       f"clock_cycles[threadIdx.x / 128][{i}] += clock_now - clock_last; clock_last = clock_now; }}")
    text = "\n".join(out) + "\n"
    # The array, once per module (every kernel's module includes the header once).
    anchor = "namespace cupyattn {"
    return text.replace(anchor, f'extern "C" {{ __device__ unsigned long long {GLOBAL}[2][{MAX_PHASES}]; '
                                f"__device__ unsigned long long {TIMES}[{MAX_BLOCKS}][4]; }}\n{anchor}", 1)


def _block_time(slot: int, with_sm: bool = False) -> str:
    """Thread 0 keeps the global timer (ns) in its block's ``slot`` (and, at the loop's
    begin, the SM it runs on)."""
    sm = (f' unsigned sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm)); {TIMES}[blockIdx.x][2] = sm;'
          if with_sm else "")
    return (f"if (threadIdx.x == 0 && blockIdx.x < {MAX_BLOCKS}) {{ unsigned long long ns; "
            f'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns)); {TIMES}[blockIdx.x][{slot}] = ns;{sm} }}')


def timeline(times, blocks: int) -> str:
    """Where the SMs' time went in one launch, from each block's loop begin, loop end, SM
    and entry (``times`` rows: ns, ns, SM, ns):
    the share of SM time inside the items' loop, between loops on an SM (a block's
    epilogue, the next one's launch and prologue; before the first), and idle at the end
    (SMs done before the last one)."""
    import numpy as np

    t = np.asarray(times[:blocks], dtype=np.int64)
    begin, end, sm, entry = t[:, 0], t[:, 1], t[:, 2], t[:, 3]
    t0, t1 = begin.min(), end.max()
    sms = np.unique(sm)
    whole = (t1 - t0) * len(sms)
    loop = int((end - begin).sum())
    idle_end = int(sum(t1 - end[sm == s].max() for s in sms))
    between = whole - loop - idle_end
    prologue = int((begin - entry).sum())
    per_sm = np.array([(sm == s).sum() for s in sms])
    return (f"loop {100 * loop / whole:.1f}%, between loops {100 * between / whole:.1f}% (prologues "
            f"{100 * prologue / whole:.1f}%: entry to loop), idle at the end "
            f"{100 * idle_end / whole:.1f}% of {len(sms)} SMs x {(t1 - t0) / 1e6:.3f} ms (first loop begin to last "
            f"end); blocks an SM {per_sm.min()}-{per_sm.max()}; mean loop {(end - begin).mean() / 1e3:.1f} us")


def instrumented_copy(tree: Path, into: Path) -> list[str]:
    """cupyattn/ and kernels/ of ``tree`` in ``into``, the header instrumented; the phase names."""
    for part in ("cupyattn", "kernels"):
        shutil.copytree(tree / part, into / part, ignore=shutil.ignore_patterns("__pycache__"))
    header = into / "kernels" / HEADER
    source = header.read_text()
    header.write_text(instrument(source))
    return phase_names(source)


def compile_planned_backward(copy: str, dim: int, precision: str, causal: bool) -> None:
    """Compile the dK/dV and dQ kernels the cupyattn in ``copy`` plans for the H200 (B=4,
    H=16, S=4096) for sm_90a, without a GPU; print each one's registers and spills."""
    sys.path.insert(0, copy)
    from cupyattn import compile as cc, plan as P
    from cupyattn.device import named_device

    problem = P.AttentionProblem("float32", dim, dim, causal, 4, 16, 16, 4096, 4096, precision=(precision,))
    bwd = P.plan_backward(problem, named_device("h200"))
    for plan in (bwd.dkdv, bwd.dq):
        report = cc.compile_only(plan.config, "sm_90")
        print(f"{plan.config.name_expression}: {report.registers} registers, {report.spills} bytes spilled")


def _worker(copy: str, dim: int, precision: str, causal: bool, compile_only: bool):
    if compile_only:
        return compile_planned_backward(copy, dim, precision, causal)
    sys.path.insert(0, copy)
    import cupy
    import numpy as np

    import cupyattn
    from cupyattn import api, compile as cc, testing

    rng = np.random.default_rng(0)
    shape = (4, 4096, 16, dim)
    q, k, v, do = (testing.to_device(testing.host_values(shape, "float32", rng), "float32") for _ in range(4))
    out, lse = cupyattn.attention(q, k, v, causal=causal, return_lse=True, precision=precision)
    original = api._launch
    counts = {}

    def launch(config, spec_, blocks, what, args, smem=0):
        name = config.name_expression
        if "attn_bwd_dkdv_wgmma" not in name and "attn_bwd_dq_wgmma" not in name:
            return original(config, spec_, blocks, what, args, smem)
        module = cc.get_kernel(config, spec_).kernel.module  # RawKernel -> Function -> Module
        ptr, times_ptr = module.get_global_var(GLOBAL), module.get_global_var(TIMES)
        nbytes = 2 * MAX_PHASES * 8
        cupy.cuda.Device().synchronize()
        cupy.cuda.runtime.memset(ptr, 0, nbytes)
        start, stop = cupy.cuda.Event(), cupy.cuda.Event()
        start.record()
        original(config, spec_, blocks, what, args, smem)
        stop.record()
        stop.synchronize()
        host = np.zeros((2, MAX_PHASES), np.uint64)
        cupy.cuda.runtime.memcpy(host.ctypes.data, ptr, nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        times = np.zeros((MAX_BLOCKS, 4), np.uint64)
        cupy.cuda.runtime.memcpy(times.ctypes.data, times_ptr, times.nbytes, cupy.cuda.runtime.memcpyDeviceToHost)
        counts[name] = (cupy.cuda.get_elapsed_time(start, stop), host, timeline(times, min(blocks, MAX_BLOCKS)))

    api._launch = launch
    try:
        for _ in range(2):  # the first compiles; the second is the one printed
            cupyattn.attention_backward(do, q, k, v, out, lse, causal=causal, precision=precision)
    finally:
        api._launch = original
    for name, (ms, host, blocks_line) in counts.items():
        print(f"RESULT {ms:.3f} {' '.join(map(str, host.ravel()))} {name}")
        print(f"  blocks: {blocks_line}")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--precision", default="fp32", choices=["fp32", "tf32"])
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--tree", default=str(ROOT), help="directory holding cupyattn/ and kernels/")
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        _worker(args.worker, args.dim, args.precision, args.causal, args.compile_only)
        return
    with tempfile.TemporaryDirectory() as tmp:
        names = instrumented_copy(Path(args.tree), Path(tmp))
        cmd = [sys.executable, __file__, "--worker", tmp, "--dim", str(args.dim), "--precision", args.precision]
        cmd += ["--causal"] * args.causal + ["--compile-only"] * args.compile_only
        res = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp)
        if res.returncode != 0:
            sys.exit(f"worker failed:\n{res.stdout}\n{res.stderr}")
    for line in res.stdout.splitlines():
        if not line.startswith("RESULT "):
            print(line)
            continue
        _, ms, *rest = line.split(" ")
        cycles = [int(x) for x in rest[:2 * MAX_PHASES]]
        name = " ".join(rest[2 * MAX_PHASES:])
        per_wg = [cycles[:MAX_PHASES], cycles[MAX_PHASES:]]
        totals = [sum(c) or 1 for c in per_wg]
        print(f"{name}: {float(ms):.3f} ms; warpgroups 0 / 1, share of their cycles")
        for i, phase in enumerate(names):
            if per_wg[0][i] or per_wg[1][i]:
                print(f"  {phase:40s} {100 * per_wg[0][i] / totals[0]:5.1f}% / {100 * per_wg[1][i] / totals[1]:5.1f}%")


if __name__ == "__main__":
    main()
