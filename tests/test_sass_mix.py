"""scripts/sass_mix.py on a small CSV shaped as ncu's SASS source page."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import sass_mix  # noqa: E402

HEADER = ('"Address","Source","Warp Stall Sampling (All Samples)","Warp Stall Sampling (Not-issued Samples)",'
          '"Instructions Executed","stall_wait","stall_long_sb","stall_wait (Not Issued)"')
CSV = "\n".join([
    '"Kernel Name","void first<1>(float *)",',
    HEADER,
    '"0x10","      FADD R1, R2, R3","30","20","600","30","0","20"',
    '"0x20","  @P0 FADD.FTZ R4, R4, -R5","10","5","200","0","10","5"',
    '"0x30","      HGMMA.64x16x8.F32.TF32 R8, R16, gdesc[UR4], RZ, !UPT","60","60","200","20","50","60"',
    '"Kernel Name","void second(int)",',
    HEADER,
    '"0x10","      EXIT","0","0","10","0","0","0"',
])


def test_opcode_drops_predicate_and_modifiers():
    assert sass_mix.opcode("  @!P1 FADD.FTZ R4, R4, -R5") == "FADD"
    assert sass_mix.opcode("HGMMA.64x16x8.F32.TF32 R8, R16, gdesc[UR4], RZ, !UPT") == "HGMMA"
    assert sass_mix.opcode("   ") == "?"


def test_mix_per_kernel_in_shares_of_instructions_and_samples():
    (name, rows), (second, other) = sass_mix.kernels(CSV)
    assert name == "void first<1>(float *)" and second == "void second(int)" and len(other) == 1
    shares, executed, samples = sass_mix.mix(rows)
    assert (executed, samples) == (1000, 100)
    assert shares["FADD"] == pytest.approx((0.8, 0.4)) and shares["HGMMA"] == pytest.approx((0.2, 0.6))


def test_main_prints_each_kernel_and_refuses_a_file_without_kernels(tmp_path, capsys, monkeypatch):
    good, bad = tmp_path / "sass.csv", tmp_path / "other.csv"
    good.write_text(CSV)
    bad.write_text("a,b\n1,2\n")
    monkeypatch.setattr(sys, "argv", ["sass_mix.py", str(good), "--hot", "1"])
    assert sass_mix.main() == 0
    out = capsys.readouterr().out
    assert "1,000 instructions executed, 100 stall samples" in out and "void second(int)" in out
    assert "HGMMA.64x16x8" in out.split("hottest:")[1]  # the one hottest instruction of the first
    monkeypatch.setattr(sys, "argv", ["sass_mix.py", str(bad)])
    with pytest.raises(SystemExit):
        sass_mix.main()
    assert "expected ncu's SASS source page" in capsys.readouterr().err


def test_stall_reasons_by_opcode_leave_out_the_not_issued_columns():
    (_, rows), (_, other) = sass_mix.kernels(CSV)
    (first, share, ops), (second, share2, ops2) = sass_mix.reasons(rows)
    assert (first, second) == ("long_sb", "wait") and (share, share2) == pytest.approx((60 / 110, 50 / 110))
    assert ops == [("HGMMA", pytest.approx(50 / 110)), ("FADD", pytest.approx(10 / 110))]
    assert ops2 == [("FADD", pytest.approx(30 / 110)), ("HGMMA", pytest.approx(20 / 110))]
    assert [(r, s) for r, s, _ in sass_mix.reasons(other)] == [("wait", 0), ("long_sb", 0)]
