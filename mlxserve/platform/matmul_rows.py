"""Row counts for a forward pass's matmuls on MLX's CPU backend, whose float32 matmul is
OpenBLAS's `sgemm`.

Its kernels work on blocks of rows, so a pass of 12 rows costs more than one of 16: the last,
partial block takes a slower path (measured at 11cc27f: docs/benchmarks.md, past experiments).
Our own forward passes (mixed batches) pad their rows with zeros up to the next multiple of the
block, unless only a few rows spill over it, and drop the padding at the end; everything but
attention works row by row, and attention reads only the real rows.
"""

from __future__ import annotations

ROW_BLOCK = 16
# A count at most this far past a multiple of ROW_BLOCK runs as it is: a whole block more costs
# about as much there.
SPILL_ROWS = 7


def padded_rows(rows: int) -> int:
    """The row count a pass of `rows` rows runs its matmuls with."""
    spill = rows % ROW_BLOCK
    return rows if spill <= SPILL_ROWS else rows + ROW_BLOCK - spill
