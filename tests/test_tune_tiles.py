"""scripts/tune_tiles.py's --tiles parsing (the timing itself runs on a device: BENCHMARKS.md)."""

import sys
from pathlib import Path

import pytest

pytest.importorskip("cupy")  # the script imports CuPy at the top; no GPU is needed to parse
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from tune_tiles import parse_tiles  # noqa: E402


def test_tiles_parse_as_block_m_block_n_warps():
    assert parse_tiles("16x128x8,32x64x4") == {(16, 128, 8), (32, 64, 4)}
    assert parse_tiles("32x128x8,") == {(32, 128, 8)}


def test_a_malformed_tile_names_the_option_and_what_it_got():
    with pytest.raises(SystemExit, match=r"--tiles: expected block_m x block_n x warps.*'16-128-8'"):
        parse_tiles("16-128-8")
    with pytest.raises(SystemExit, match="'16x128'"):
        parse_tiles("16x128")
