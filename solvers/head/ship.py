"""The edit as shipped: the Q6_K (or any stored type's) round trip of the edited head rows.

SPEC.md section 3 (`quant.rounding.roundtrip.requantize_rows`, applied to the rows of S only): rows with no
edit keep their original bytes (re-quantizing a dequantized Q6_K row does not give its bytes
back); only rows whose dW is nonzero are re-quantized, and every number the solver reports is
computed from `dw_shipped` = (view of the new bytes) - (view of the original bytes), where "view"
is what the engine multiplies with (the tail's head view).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactedit import quant
from exactedit.quant.rounding.roundtrip import requantize_rows


@dataclass(frozen=True, eq=False)
class HeadRows:
    """The original rows of the edit set: raw bytes and their view (float64)."""

    tensor: str
    type_name: str
    shape: tuple[int, int]       # the whole tensor (rows, cols)
    ids: np.ndarray              # int64 [k]
    raw: np.ndarray              # uint8 [k, row_bytes]
    view: np.ndarray             # float64 [k, cols]
    runtime: bool                # view = quant.runtime_view (else plain dequantize)

    def to_view(self, raw: np.ndarray) -> np.ndarray:
        convert = quant.runtime_view if self.runtime else quant.dequantize
        return np.asarray(convert(raw, self.type_name, self.shape[1]), dtype=np.float64).reshape(len(raw), -1)


def load_head_rows(g, tensor: str, ids, *, runtime: bool) -> HeadRows:
    """Rows `ids` of `tensor` from an open GGUF (copied: the bundle must not alias the map)."""
    info = g.tensor(tensor)
    ids = np.asarray(ids, dtype=np.int64)
    raw = np.stack([np.array(g.read_raw(tensor, int(i), int(i) + 1)[0]) for i in ids])
    rows = HeadRows(tensor, info.type_name, (int(info.rows), int(info.cols)), ids, raw,
                    np.zeros((len(ids), info.cols)), runtime)
    return HeadRows(**{**rows.__dict__, "view": rows.to_view(raw)})


@dataclass(frozen=True, eq=False)
class Shipped:
    """New bytes of every row of S (original bytes where unchanged) and the shipped edit."""

    raw: np.ndarray       # uint8 [k, row_bytes]
    changed: np.ndarray   # bool [k]: rows whose bytes differ from the original
    dw: np.ndarray        # float64 [k, cols]: shipped view - original view
    rel_error: float      # ||dw_shipped - dw|| / ||dw|| (0 for no edit)

    @property
    def row_ids_changed(self) -> np.ndarray:
        return np.flatnonzero(self.changed)


def _round_trip(rows: HeadRows, dw: np.ndarray):
    """(RoundTrip of the edited rows, shipped dW float64 [k, cols], changed bool [k])."""
    if dw.shape != rows.view.shape:
        raise ValueError(f"dW must be {list(rows.view.shape)}, got {list(dw.shape)}")
    edited = np.flatnonzero(np.any(dw != 0, axis=1))
    rt = requantize_rows(rows.raw, rows.type_name, rows.shape[1], edited,
                         (rows.view[edited] + dw[edited]).astype(np.float32))
    shipped = np.zeros_like(dw)
    if edited.size:
        # rt.dequantized is quant.dequantize of exactly these bytes: the plain view without a second call
        view = rows.to_view(rt.raw[edited]) if rows.runtime else rt.dequantized.astype(np.float64)
        shipped[edited] = view - rows.view[edited]
    changed = np.zeros(len(rows.raw), dtype=bool)
    changed[rt.changed_rows] = True
    return rt, shipped, changed


def ship(rows: HeadRows, dw: np.ndarray) -> Shipped:
    """Round-trip the edited rows through the tensor's type."""
    dw = np.asarray(dw, dtype=np.float64)
    rt, shipped, changed = _round_trip(rows, dw)
    norm = float(np.linalg.norm(dw))
    rel = float(np.linalg.norm(shipped - dw)) / norm if norm > 0 else 0.0
    return Shipped(np.array(rt.raw), changed, shipped, rel)


def shipped_edit(rows: HeadRows, dw: np.ndarray) -> tuple[np.ndarray, int]:
    """`ship(rows, dw)`'s (dw, number of changed rows) alone, as every checkpoint needs them. The
    quantizer runs on one numba thread: for |S| rows, starting a parallel region costs 4 to 10 ms
    on a busy machine, the work itself about 1 ms (each row is quantized alone: same bytes)."""
    import numba

    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        _, shipped, changed = _round_trip(rows, np.asarray(dw, dtype=np.float64))
    finally:
        numba.set_num_threads(threads)
    return shipped, int(changed.sum())
