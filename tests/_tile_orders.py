"""The wgmma kernels' tile orders in NumPy (kernels/wgmma.cuh, wgmma_staging.cuh), for the
tests that model what a kernel writes."""

import numpy as np


def core_offset(R, r, k):
    """Word of element (row r, column k) of an R-row tile in core-matrix order (wgmma.cuh's
    core_offset): 8 x 4 core matrices, rows fastest, then columns."""
    return ((k // 4) * (R // 8) + r // 8) * 32 + (r % 8) * 4 + k % 4


def slot_row(slot):
    """The row a transposed tile holds at ``slot``: within 8, row 2i at slot i and row
    2i + 1 at slot i + 4 (the k order of a register A operand made from accumulators)."""
    s8 = slot % 8
    return slot - s8 + np.where(s8 < 4, 2 * s8, 2 * (s8 - 4) + 1)


def tile_orders(rows, d_pad):
    """Word of element (row r, column c) of a rows x d_pad tile, [r, c]: in the row tile
    (core-matrix order) and in the transposed one (rows d, the rows as slots:
    stage_operand's order)."""
    r, c = np.meshgrid(np.arange(rows), np.arange(d_pad), indexing="ij")
    slot = r // 8 * 8 + (r % 8) % 2 * 4 + (r % 8) // 2
    return core_offset(rows, r, c), core_offset(d_pad, c, slot)
