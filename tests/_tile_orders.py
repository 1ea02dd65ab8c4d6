"""The wgmma kernels' tile orders in NumPy (kernels/wgmma.cuh, wgmma_staging.cuh), and the
staging launches' output, for the tests that model what a kernel writes."""

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


def staged_tiles(tiles, precision, d_pad, rows, rowwise=(), parts_as_rows=False):
    """NumPy model of the staging kernels' output (kernels/wgmma_staging.cuh). ``tiles``:
    (array, transposed) pairs of (B, S, H, D) float32 arrays, in the order a staged tile
    holds them; per (batch, head, tile of ``rows``): each one's TF32 parts, the row tile
    in wgmma.cuh's core-matrix order, the transposed one as rows d and slots (within 8
    rows, row 2i at slot i and row 2i + 1 at slot i + 4; _tile_orders.tile_orders); then
    ``rowwise`` (B, H, S) arrays, ``rows`` values each; zeros past the sequence and the
    head dim. ``parts_as_rows``: a row tile's parts as the rows of one 2 ``rows``-row tile,
    the big part's first (StagingConfig.parts_as_rows)."""
    from cupyattn.reference import round_to

    B, S, H, D = tiles[0][0].shape
    n_tiles = -(-S // rows)
    parts = 2 if precision == "fp32" else 1
    row_at, transposed_at = tile_orders(rows, d_pad)
    words = len(tiles) * parts * rows * d_pad + len(rowwise) * rows
    out = np.zeros((B, H, n_tiles, words), np.float32)
    for i, (x, transposed) in enumerate(tiles):
        padded = np.zeros((B, H, n_tiles * rows, d_pad), np.float32)
        padded[:, :, :S, :D] = x.transpose(0, 2, 1, 3)
        big = round_to(padded, "tf32")
        for p, part in enumerate([big, padded - big][:parts]):
            if parts_as_rows and not transposed:  # rows p * rows.. of one 2 rows-row tile
                r, c = np.meshgrid(np.arange(rows), np.arange(d_pad), indexing="ij")
                at = i * parts * rows * d_pad + core_offset(2 * rows, r + p * rows, c)
            else:
                at = (i * parts + p) * rows * d_pad + (transposed_at if transposed else row_at)
            for t in range(n_tiles):
                out[:, :, t][..., at] = part[:, :, t * rows : (t + 1) * rows]
    for i, x in enumerate(rowwise):
        padded = np.zeros((B, H, n_tiles * rows), np.float32)
        padded[:, :, :S] = x
        start = len(tiles) * parts * rows * d_pad + i * rows
        out[..., start : start + rows] = padded.reshape(B, H, n_tiles, rows)
    return out.reshape(-1)


def staged_operands(operands, a, b):
    """The (array, transposed) pairs a staged tile of ``operands`` (plan.StagingConfig)
    holds, in order, from its two operands ``a`` and ``b`` (K and V, or Q and dO)."""
    return {
        "forward keys": [(a, False), (b, True)],
        "dq keys": [(a, False), (b, False), (a, True)],
        "dkdv queries": [(a, False), (b, False), (a, True), (b, True)],
    }[operands]
