"""Row buckets of the jitted tail functions: one compile per bucket, not one per row count.

XLA compiles a jitted function once per input shape. The tail's forwards (`head_fast`,
`last_layer_fast`) and the head's VJP (`solvers.l47.jacobian`) are row-independent (row t of the
output reads only row t of the inputs), so their callers cut any number of rows into chunks of at
most MAX_ROWS and pad each chunk with zero rows up to its bucket: the next power of two, at least
MIN_ROWS (64, 128, ..., 4096: seven shapes per function and process, whatever the row counts).
The padded rows' outputs are sliced off; no reduction runs over rows, so they change nothing
(tests/solvers/tail/test_buckets.py checks the results bit for bit against the unpadded calls).
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

MIN_ROWS = 64
MAX_ROWS = 4096


def bucket_rows(rows: int, lo: int = MIN_ROWS, hi: int = MAX_ROWS) -> int:
    """The rows a chunk of `rows` (<= hi) is padded to: the next power of two, at least `lo`."""
    if not 0 <= rows <= hi:
        raise ValueError(f"a chunk has 0 to {hi} rows, got {rows}")
    return max(lo, 1 << max(rows - 1, 0).bit_length())


def row_chunks(rows: int, lo: int = MIN_ROWS, hi: int = MAX_ROWS) -> list[tuple[int, int, int]]:
    """(start, stop, padded rows) of each chunk of `rows` rows: full chunks of `hi`, then the rest in
    its bucket; zero rows give one empty chunk (so an empty call still has a shape)."""
    if rows == 0:
        return [(0, 0, lo)]
    return [(a, min(a + hi, rows), bucket_rows(min(a + hi, rows) - a, lo, hi)) for a in range(0, rows, hi)]


def pad_rows(x: np.ndarray, rows: int, fill=0) -> np.ndarray:
    """x with rows appended (filled with `fill`) up to `rows` rows; padded rows are never read back."""
    x = np.asarray(x)
    if x.shape[0] == rows:
        return np.ascontiguousarray(x)
    out = np.full((rows,) + x.shape[1:], fill, dtype=x.dtype)
    out[:x.shape[0]] = x
    return out


def pad_axis(x: np.ndarray, axis: int, size: int) -> np.ndarray:
    """x zero-padded along `axis` up to `size`."""
    x = np.asarray(x)
    if x.shape[axis] == size:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, size - x.shape[axis])
    return np.pad(x, widths)


def map_rows(fn: Callable, row_args: Sequence[np.ndarray], *args, lo: int = MIN_ROWS,
             hi: int = MAX_ROWS) -> np.ndarray:
    """fn(*row_chunks, *args) over bucketed chunks of the row arguments (all with the same rows on
    axis 0, zero-padded), the per-row outputs sliced back and concatenated on the host."""
    rows = int(np.shape(row_args[0])[0])
    outs = []
    for a, b, padded in row_chunks(rows, lo, hi):
        out = fn(*(pad_rows(np.asarray(x)[a:b], padded) for x in row_args), *args)
        outs.append(np.asarray(out)[:b - a])
    return outs[0] if len(outs) == 1 else np.concatenate(outs, axis=0)
