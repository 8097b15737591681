"""A Q8_0 / Q6_K / Q4_1 row as fixed block scales (and offsets) times free integer codes.

Any bytes with the right layout load in the engine; ggml's quantizer is one way to choose them,
not the only one (SPEC.md section 3). Split a row's bytes into its scale fields (kept) and its
codes (chosen freely in the format's range):

    Q8_0: value k = fp16(d_b) * qs_k                   codes [-127, 127]
    Q6_K: value k = float32(fp16(d) * sc_j) * (q_k - 32) codes [-32, 31]
    Q4_1: value k = fp16(d_b) * q_k + fp16(m_b)         codes [0, 15] (two float32 roundings)

Q8_0 and Q6_K are symmetric grids (code 0 is the value 0: GRID_TYPES, what feedback shipping
works on); Q4_1 is affine (`Grid.offsets`: m_b per value; 0 is a value only where m_b is a
multiple of d_b), accepted where a column is written code by code (COLUMN_TYPES: the gated
edit's ffn_down column, solvers/l47/gated/down.py).

`Grid.steps[r, k]` is the float32 factor ggml's dequantizer multiplies code k of row r by (for
Q6_K the product d * sc_j, rounded to float32 first, as `dequantize_row_q6_K` does), so
`dequantize(pack(grid, codes)) == values(grid, codes)` bit for bit. Q8_0 codes stop at -127:
-128 is a valid int8 and loads, but ggml's quantizer never writes it, so the grid stays in the
symmetric range every Q8_0 kernel has been exercised on.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from exactedit import quant
from exactedit.quant.kquants import q6_k
from exactedit.quant.formats import q4_1, q8_0
from exactedit.errors import QuantError

GRID_TYPES = ("Q8_0", "Q6_K")              # symmetric: value = step * code
AFFINE_TYPES = ("Q4_1",)                   # value = step * code + offset
COLUMN_TYPES = GRID_TYPES + AFFINE_TYPES
CODE_RANGE = {"Q8_0": (-127, 127), "Q6_K": (-q6_k.NMAX, q6_k.NMAX - 1), "Q4_1": (0, 15)}


class Grid(NamedTuple):
    """The scales of some rows' bytes, as the step each value's code is multiplied by."""

    qtype: str
    steps: np.ndarray      # float32 [rows, cols]
    lo: int                # smallest code
    hi: int                # largest code
    scale_raw: np.ndarray  # uint8 [rows, row_bytes]: the bytes whose scale fields `pack` keeps
    offsets: np.ndarray | None = None   # float32 [rows, cols] (AFFINE_TYPES); None: symmetric

    @property
    def cols(self) -> int:
        return int(self.steps.shape[1])


def _raw_rows(raw, qtype: str, cols: int) -> np.ndarray:
    if qtype not in COLUMN_TYPES:
        raise QuantError(f"qtype {qtype!r}: a grid of block scales exists for {COLUMN_TYPES} only")
    nbytes = quant.row_bytes(qtype, cols)
    raw = np.asarray(raw)
    if raw.ndim == 1:
        raw = raw[None, :]
    if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != nbytes:
        raise QuantError(f"raw: expected uint8 [rows, {nbytes}] ({qtype} rows of {cols} values), "
                         f"got {raw.dtype} {raw.shape}")
    return np.ascontiguousarray(raw)


def grid_of(raw, qtype: str, cols: int) -> Grid:
    """The block scales of `raw` (uint8 [rows, row_bytes] of type qtype) as a Grid."""
    raw = _raw_rows(raw, qtype, cols)
    rows = raw.shape[0]
    offsets = None
    if qtype == "Q8_0":
        d = raw.view(q8_0.BLOCK).reshape(rows, -1)["d"].astype(np.float32)
        steps = np.repeat(d, q8_0.QK, axis=1)
    elif qtype == "Q4_1":
        b = raw.view(q4_1.BLOCK).reshape(rows, -1)
        steps = np.repeat(b["d"].astype(np.float32), q4_1.QK, axis=1)
        offsets = np.ascontiguousarray(np.repeat(b["m"].astype(np.float32), q4_1.QK, axis=1))
    else:
        b = raw.view(q6_k.BLOCK).reshape(rows, -1)
        with np.errstate(invalid="ignore", over="ignore"):
            ds = b["d"].astype(np.float32)[:, :, None] * b["scales"].astype(np.float32)
        steps = np.repeat(ds.reshape(rows, -1), q6_k.SUB, axis=1)
    lo, hi = CODE_RANGE[qtype]
    return Grid(qtype, np.ascontiguousarray(steps, dtype=np.float32), lo, hi, raw.copy(), offsets)


def codes_of(raw, qtype: str, cols: int) -> np.ndarray:
    """The codes stored in `raw`: int16 [rows, cols] (Q6_K: q - 32; Q8_0: qs; Q4_1: the nibbles)."""
    raw = _raw_rows(raw, qtype, cols)
    rows = raw.shape[0]
    if qtype == "Q8_0":
        return raw.view(q8_0.BLOCK).reshape(rows, -1)["qs"].reshape(rows, cols).astype(np.int16)
    if qtype == "Q4_1":
        qs = raw.view(q4_1.BLOCK).reshape(-1)["qs"].astype(np.int16)
        return np.concatenate([qs & 0xF, qs >> 4], axis=1).reshape(rows, cols)
    b = raw.view(q6_k.BLOCK).reshape(-1)
    ql = b["ql"].reshape(-1, 2, 2, 32).astype(np.int16)
    qh = b["qh"].reshape(-1, 2, 32).astype(np.int16)
    lo = np.stack([ql[:, :, 0] & 0xF, ql[:, :, 1] & 0xF, ql[:, :, 0] >> 4, ql[:, :, 1] >> 4], 2)
    hi = np.stack([(qh >> s) & 3 for s in (0, 2, 4, 6)], 2)
    return ((lo | (hi << 4)) - q6_k.NMAX).reshape(rows, cols)


def pack(grid: Grid, codes) -> np.ndarray:
    """Bytes uint8 [rows, row_bytes]: the grid's scale fields with `codes` (int [rows, cols] in
    [lo, hi]) as the values' codes."""
    codes = np.asarray(codes)
    if codes.shape != grid.steps.shape or codes.dtype.kind not in "iu":
        raise QuantError(f"codes: expected integers of shape {grid.steps.shape}, got {codes.dtype} {codes.shape}")
    if codes.size and (codes.min() < grid.lo or codes.max() > grid.hi):
        raise QuantError(f"codes: {grid.qtype} codes must lie in [{grid.lo}, {grid.hi}], got "
                         f"[{codes.min()}, {codes.max()}]")
    rows = codes.shape[0]
    out = grid.scale_raw.copy()
    if grid.qtype == "Q8_0":
        out.view(q8_0.BLOCK).reshape(rows, -1)["qs"] = codes.reshape(rows, -1, q8_0.QK)
    elif grid.qtype == "Q4_1":
        c = codes.astype(np.uint8).reshape(-1, q4_1.QK)
        out.view(q4_1.BLOCK).reshape(-1)["qs"] = c[:, :q4_1.HALF] | (c[:, q4_1.HALF:] << 4)
    else:
        blocks = out.view(q6_k.BLOCK).reshape(-1)
        q6_k._pack_ref((codes.astype(np.int64) + q6_k.NMAX).reshape(-1, q6_k.QK_K), blocks)
    return out


def values(grid: Grid, codes) -> np.ndarray:
    """float32 [rows, cols]: step * code (+ offset, rounded after the product as ggml does), the
    dequantized values of `pack(grid, codes)`."""
    with np.errstate(invalid="ignore", over="ignore"):
        v = grid.steps * np.asarray(codes).astype(np.float32)
        return v if grid.offsets is None else v + grid.offsets


def nearest(grid: Grid, target) -> np.ndarray:
    """int16 codes: each value rounded on its own to the nearest code of its step (clamped to
    the range; a zero or non-finite step gets code 0)."""
    t = np.asarray(target, dtype=np.float64)
    if grid.offsets is not None:
        t = t - grid.offsets.astype(np.float64)
    s = grid.steps.astype(np.float64)
    ok = np.isfinite(s) & (s != 0)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        c = np.rint(np.where(ok, t / np.where(ok, s, 1.0), 0.0))
    return np.clip(np.nan_to_num(c), grid.lo, grid.hi).astype(np.int16)
