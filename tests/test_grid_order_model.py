"""The list-scheduling model behind causal grids' order (scripts/grid_order_model.py,
kernels/simt_tiles.cuh grid_slot): the figures the kernel's comment quotes. CPU only."""

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "grid_order_model", Path(__file__).resolve().parents[1] / "scripts" / "grid_order_model.py")
model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(model)


def _overshoot(tiles, heads, slots):
    """Finish time of each order over an even split of the work, minus 1."""
    results = model.orders(tiles, heads)
    even = sum(next(iter(results.values()))) / slots
    return [model.finish_time(works, slots) / even - 1 for works in results.values()]


def test_both_orders_hold_every_block_once():
    for tiles, heads in [(1, 1), (5, 3), (32, 64), (300, 7)]:
        by_head, grouped = model.orders(tiles, heads).values()
        assert sorted(by_head) == sorted(grouped) == sorted(list(range(1, tiles + 1)) * heads)


def test_the_last_heads_heaviest_tile_no_longer_runs_alone():
    by_head, grouped = _overshoot(32, 64, 132)  # the H200's 132 SMs, a block each
    assert by_head == pytest.approx(0.070, abs=0.005)
    assert grouped < 0.01


@pytest.mark.parametrize("tiles", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("slots", [132, 264])
def test_grouped_order_is_never_worse(tiles, slots):
    by_head, grouped = _overshoot(tiles, 64, slots)
    assert grouped <= by_head + 1e-9
    assert grouped < 0.035
