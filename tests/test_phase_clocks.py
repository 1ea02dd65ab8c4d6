"""scripts/phase_clocks.py without a GPU: the clock marks of kernels/attn_bwd_wgmma.cuh
become code in the copy, and the copy's planned D=256 kernels compile without spills."""

import sys
from pathlib import Path

import pytest
from _script_runs import assert_copy_compiles_without_spills

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))

import phase_clocks  # noqa: E402


def test_every_clock_mark_becomes_code_and_the_phases_are_the_marked_ones():
    source = (ROOT / "kernels" / phase_clocks.HEADER).read_text()
    names = phase_clocks.phase_names(source)
    assert names[:2] == ["loop", "top barrier and fetch"] and "score product" in names and "dQ" in names
    text = phase_clocks.instrument(source)
    assert "// clock phase" not in text
    assert text.count("__shared__ unsigned clock_cycles[") == source.count("// clock phases: begin") == 2  # dK/dV, dQ
    assert text.count(f"atomicAdd(&{phase_clocks.GLOBAL}") == 2
    marks = sum(line.strip().startswith("// clock phase: ") for line in source.splitlines())
    # one add a mark (+ a declaration, the zeroing and an atomicAdd a kernel)
    assert text.count("clock_cycles[") - 2 * 3 == marks
    with pytest.raises(ValueError):
        phase_clocks.phase_names("".join(f"// clock phase: p{i}\n" for i in range(phase_clocks.MAX_PHASES + 1)))


def test_the_instrumented_kernels_compile_for_sm_90a_without_spills():
    assert_copy_compiles_without_spills("phase_clocks.py", "--dim", "256")


def test_timeline_splits_the_sms_time_into_loop_between_and_idle_at_the_end():
    # Two SMs from 0 to 100 ns: SM 0 runs loops 0-40 and 50-100; SM 1 runs 10-70, then idles.
    times = [(0, 40, 0, 0), (50, 100, 0, 45), (10, 70, 1, 5)]  # begin, end, SM, entry
    line = phase_clocks.timeline(times, 3)
    assert line.startswith("loop 75.0%, between loops 10.0% (prologues 5.0%: entry to loop), idle at the end 15.0% of 2 SMs"), line
    assert "blocks an SM 1-2" in line
    source = phase_clocks.instrument((ROOT / "kernels" / phase_clocks.HEADER).read_text())
    assert source.count(f"{phase_clocks.TIMES}[blockIdx.x][0] = ns") == 2  # dK/dV's and dQ's loop begin
    assert source.count(f"{phase_clocks.TIMES}[blockIdx.x][1] = ns") == 2
    assert source.count(f"{phase_clocks.TIMES}[blockIdx.x][3] = ns") == 2  # at entry
