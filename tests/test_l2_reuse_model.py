"""The L2 reuse model of a causal dK/dV launch (scripts/l2_reuse_model.py): its counting,
and the figures BENCHMARKS.md quotes. CPU only."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import l2_reuse_model as model  # noqa: E402


def test_every_block_once_and_every_read_counted():
    heads, tiles, q_per_k = 3, 8, 4
    blocks = model.grid_blocks(heads, tiles, 2)
    assert sorted(blocks) == [(h, r) for h in range(heads) for r in range(tiles)]
    assert blocks[:2] == [(0, 0), (1, 0)]  # heaviest rank first, heads fastest within the group
    misses, reads, _ = model.simulate(heads, tiles, q_per_k, slots=5, group=1, l2_tiles=10**6)
    assert reads == heads * sum(q_per_k * tiles - q_per_k * r for r in range(tiles))
    assert misses == heads * q_per_k * tiles  # an L2 that holds everything misses each tile once


def test_a_larger_l2_never_misses_more():  # LRU's inclusion property
    for descending in (False, True):
        misses = [model.simulate(4, 8, 4, slots=6, group=2, descending=descending, l2_tiles=n)[0]
                  for n in (1, 8, 32, 10**6)]
        assert misses == sorted(misses, reverse=True) and misses[0] > misses[-1]


def test_the_quoted_figures():
    # 64 heads of 64 key tiles, 4 query tiles a key tile, 132 SMs, 400 staged tiles in L2.
    asc, reads, _ = model.simulate(group=4, descending=False, l2_tiles=400)
    desc, _, _ = model.simulate(group=4, descending=True, l2_tiles=400)
    assert asc / reads == pytest.approx(0.557, abs=0.005) and desc / reads == pytest.approx(0.156, abs=0.005)
