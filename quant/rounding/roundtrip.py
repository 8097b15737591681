"""The round-trip rule (SPEC.md section 3): only edited rows are re-quantized.

Q6_K is not idempotent (re-quantizing dequantized rows changes some blocks), so a tensor edit
keeps the original bytes of every row it does not edit and re-quantizes only the edited rows.
Every score is then computed on the rows as shipped: `RoundTrip.dequantized`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from exactedit import quant
from exactedit.errors import QuantError


class RowError(NamedTuple):
    """Error the quantization added to each edited row: dequant(quant(edited)) - edited."""

    max_abs: np.ndarray  # float64 [k]
    rms: np.ndarray      # float64 [k]


@dataclass(frozen=True)
class RoundTrip:
    """A tensor after re-quantizing its edited rows. Arrays are read-only."""

    raw: np.ndarray           # uint8 [rows, row_bytes]: the new tensor; other rows byte-identical
    row_ids: np.ndarray       # int64 [k]: the edited rows, in the order given
    changed_rows: np.ndarray  # int64, sorted: edited rows whose bytes differ from the original
    quant_error: RowError     # per edited row, in row_ids order
    dequantized: np.ndarray   # float32 [k, cols]: the edited rows as shipped, in row_ids order


def _readonly(a: np.ndarray) -> np.ndarray:
    a.setflags(write=False)
    return a


def _check(orig_raw, qtype: str, cols: int, row_ids, edited_rows):
    nbytes = quant.row_bytes(qtype, cols)
    orig = np.asarray(orig_raw)
    if orig.dtype != np.uint8 or orig.ndim != 2 or orig.shape[1] != nbytes:
        raise QuantError(f"orig_raw: expected uint8 [rows, {nbytes}] ({qtype} rows of {cols} "
                         f"values), got {orig.dtype} {orig.shape}")
    ids = np.asarray(row_ids)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise QuantError(f"row_ids: expected a 1-D array of integer row ids, got {ids.dtype} "
                         f"{ids.shape}")
    ids = ids.astype(np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= orig.shape[0]):
        bad = ids[(ids < 0) | (ids >= orig.shape[0])][0]
        raise QuantError(f"row_ids: row {bad} is outside the tensor's {orig.shape[0]} rows")
    if np.unique(ids).size != ids.size:
        raise QuantError("row_ids: each row may be edited once; found a repeated row id")
    edited = np.asarray(edited_rows)
    if edited.ndim == 1 and ids.size == 1:
        edited = edited[None, :]
    if edited.shape != (ids.size, cols):
        raise QuantError(f"edited_rows: expected shape [{ids.size}, {cols}] (one row per row id), "
                         f"got {edited.shape}")
    return orig, ids, edited


def requantize_rows(orig_raw, qtype: str, cols: int, row_ids, edited_rows,
                    progress=None) -> RoundTrip:
    """Re-quantize the edited rows of a stored tensor and keep every other row's bytes.

    orig_raw: uint8 [rows, row_bytes] (an array or a read-only memmap; never written);
    row_ids: [k] distinct row indices; edited_rows: float32 [k, cols], the new values of those
    rows. Returns the new full tensor bytes, which edited rows actually changed bytes, the error
    the quantization added to each edited row, and the edited rows as they will be shipped."""
    cols = operator.index(cols)
    orig, ids, edited = _check(orig_raw, qtype, cols, row_ids, edited_rows)
    new_rows = quant.quantize(edited, qtype, progress=progress)
    shipped = quant.dequantize(new_rows, qtype, cols)
    raw = np.array(orig, dtype=np.uint8, copy=True)
    raw[ids] = new_rows
    changed = np.sort(ids[(orig[ids] != new_rows).any(axis=1)]) if ids.size else ids
    diff = shipped.astype(np.float64) - edited.astype(np.float64)  # vs the values asked for
    error = RowError(_readonly(np.abs(diff).max(axis=1, initial=0.0)),
                     _readonly(np.sqrt(np.mean(diff * diff, axis=1))))
    return RoundTrip(_readonly(raw), _readonly(ids.copy()), _readonly(changed), error,
                     _readonly(shipped))
