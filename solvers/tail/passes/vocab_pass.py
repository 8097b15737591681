"""Streaming full-vocabulary pass over the output head, one row tile at a time.

`vocab_pass(mix, source)` computes, per activation row, the log-partition function (LSE), the
argmax and max logit, an optional top-k, and the logits of requested token ids, without ever
holding the whole dequantized head: memory is one float32 weight tile [tile_rows, n] plus one
logits tile [T, tile_rows]. The LSE is an online logsumexp: each tile's exp-sum is taken in
float32 relative to the tile's own row max (so every term is <= 1) and accumulated in float64.

A RowSource hands out dequantized float32 row tiles: `ArrayRows` wraps an in-memory matrix
(tests), `QuantRows` dequantizes raw ggml blocks tile by tile (a GGUF tensor or bytes in memory).
"""
from __future__ import annotations

import hashlib
from typing import Callable, NamedTuple, Protocol

import numpy as np

from exactedit.solvers.tail.forward.head_ref import apply_softcap
from exactedit.solvers.tail.forward.head_fast import Matmul, Sgemm

Progress = Callable[[int, int], None]

#: the logits tile [T, tile] is kept at or below this many floats (tiles shrink for large T)
MAX_TILE_ELEMS = 1 << 24


def tile_size(rows: int, tile_rows: int) -> int:
    """Head rows per tile: at most `tile_rows`, fewer when T rows would make the logits tile
    larger than MAX_TILE_ELEMS floats (at least 64)."""
    return max(1, min(tile_rows, max(64, MAX_TILE_ELEMS // max(rows, 1))))


class RowSource(Protocol):
    """Rows of a [rows, cols] matrix, read as float32 tiles."""

    rows: int
    cols: int

    def read(self, start: int, stop: int) -> np.ndarray:
        """float32 [stop - start, cols]."""

    def tile_key(self, start: int, stop: int) -> bytes | None:
        """A digest of rows [start, stop) as stored (equal keys mean equal rows), or None."""


class ArrayRows:
    """An in-memory float matrix [rows, cols] as a RowSource (tests, small heads)."""

    def __init__(self, w: np.ndarray):
        if np.ndim(w) != 2:
            raise ValueError(f"ArrayRows expects a 2-D matrix, got shape {np.shape(w)}")
        self.w = w
        self.rows, self.cols = (int(s) for s in np.shape(w))

    def read(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self.w[start:stop], dtype=np.float32)

    def tile_key(self, start: int, stop: int) -> bytes:
        return hashlib.sha256(np.ascontiguousarray(self.w[start:stop]).tobytes()).digest()


class QuantRows:
    """Rows stored as raw ggml blocks, dequantized tile by tile.

    `read_raw(start, stop)` returns the raw bytes of rows [start, stop) (uint8, rows x row bytes);
    `runtime=True` reads the engine's runtime view (`quant.runtime_view`, e.g. BF16 through its
    Q8_0 copy) instead of the plain dequantization.
    """

    def __init__(self, read_raw: Callable[[int, int], np.ndarray], qtype: str, rows: int,
                 cols: int, *, runtime: bool = False):
        self.read_raw, self.qtype, self.runtime = read_raw, qtype, runtime
        self.rows, self.cols = int(rows), int(cols)

    def read(self, start: int, stop: int) -> np.ndarray:
        from exactedit import quant

        convert = quant.runtime_view if self.runtime else quant.dequantize
        out = convert(self.read_raw(start, stop), self.qtype, self.cols)
        return np.asarray(out, dtype=np.float32).reshape(stop - start, self.cols)

    def tile_key(self, start: int, stop: int) -> bytes:
        raw = np.ascontiguousarray(self.read_raw(start, stop))
        return hashlib.sha256(raw.tobytes()).digest()


def gguf_rows(g, name: str, *, runtime: bool = False) -> QuantRows:
    """The GGUF tensor `name` of an open `quant.gguf.GGUFFile` as a RowSource."""
    info = g.tensors[name]
    rows, cols = info.shape
    return QuantRows(lambda a, b: g.read_raw(name, a, b), info.type_name, rows, cols,
                     runtime=runtime)


class VocabPass(NamedTuple):
    """Per-row results of one full-vocabulary pass (T rows)."""

    lse: np.ndarray          # float64 [T]  log sum_v exp(l_v)
    argmax: np.ndarray       # int64 [T]    first index of the max logit
    max_logit: np.ndarray    # float32 [T]
    topk_ids: np.ndarray     # int64 [T, k] by decreasing logit (ties: lower id first)
    topk_logits: np.ndarray  # float32 [T, k]
    selected: np.ndarray     # float32 [T, m] logits of the requested ids (nan where id < 0)
    lse_rest: np.ndarray | None = None  # float64 [T] LSE over ids not in `exclude` (if given)


class LseState(NamedTuple):
    """Online logsumexp accumulator: LSE = m + log(s), s relative to the running max m."""

    m: np.ndarray  # float64 [T]
    s: np.ndarray  # float64 [T]


def lse_init(rows: int) -> LseState:
    return LseState(np.full(rows, -np.inf), np.zeros(rows))


def lse_update(state: LseState, tile: np.ndarray, tile_max: np.ndarray | None = None) -> LseState:
    """Fold a logits tile [T, k] (float32) into the accumulator."""
    if tile_max is None:
        tile_max = tile.max(axis=1)
    finite = np.isfinite(tile_max)
    shift = np.where(finite, tile_max, 0).astype(tile.dtype)
    part = np.exp(tile - shift[:, None]).sum(axis=1, dtype=np.float64)
    tmax = tile_max.astype(np.float64)
    m_new = np.maximum(state.m, tmax)
    safe = np.where(np.isfinite(m_new), m_new, 0.0)
    old = np.where(state.s > 0, state.s * np.exp(state.m - safe), 0.0)
    new = np.where(finite, part * np.exp(tmax - safe), 0.0)
    return LseState(m_new, old + new)


def lse_finish(state: LseState) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return state.m + np.log(state.s)


def _merge_topk(ids, vals, tile, start, k):
    """Keep the k largest logits per row across the running set and this tile."""
    kk = min(k, tile.shape[1])
    cand = np.argpartition(-tile, kk - 1, axis=1)[:, :kk] if kk < tile.shape[1] else \
        np.broadcast_to(np.arange(tile.shape[1]), tile.shape)
    all_ids = np.concatenate([ids, cand + start], axis=1)
    all_vals = np.concatenate([vals, np.take_along_axis(tile, cand, axis=1)], axis=1)
    order = np.lexsort((all_ids, -all_vals.astype(np.float64)), axis=1)[:, :k]
    return np.take_along_axis(all_ids, order, axis=1), np.take_along_axis(all_vals, order, axis=1)


def token_ids(token_sets, rows: int) -> np.ndarray:
    """Requested ids as [T, m] int64: a shared list [m] is broadcast, per-row [T, m] kept."""
    if token_sets is None:
        return np.zeros((rows, 0), dtype=np.int64)
    ids = np.asarray(token_sets, dtype=np.int64)
    if ids.ndim == 1:
        return np.broadcast_to(ids, (rows, ids.size))
    if ids.ndim != 2 or ids.shape[0] != rows:
        raise ValueError(f"token_sets must be [m] or [{rows}, m], got shape {ids.shape}")
    return ids


def vocab_pass(mix, source: RowSource, *, token_sets=None, topk: int = 0,
               tile_rows: int = 8192, softcap: float | None = None, exclude=None,
               matmul: Matmul | None = None,
               sink: Callable[[int, int, np.ndarray], None] | None = None,
               progress: Progress | None = None) -> VocabPass:
    """One pass over all `source.rows` head rows for the activations `mix` [T, n].

    `token_sets`: ids whose logits are returned in `selected`, shared [m] or per row [T, m]
    (ids < 0 give nan). `sink(start, stop, logits_tile)` sees every float32 logits tile (after
    the softcap), e.g. to write full logits to disk. `matmul` defaults to float32 `Sgemm`.
    `tile_rows` is an upper bound: see `tile_size`.
    `exclude` (ids [m]) adds `lse_rest`, the LSE over all other ids, accumulated directly: exact
    even when the excluded set holds nearly all the mass (compare `partition.lse_rest`).
    """
    mix = np.asarray(mix)
    if mix.ndim != 2 or mix.shape[1] != source.cols:
        raise ValueError(f"mix must be [T, {source.cols}], got shape {mix.shape}")
    if tile_rows < 1 or topk < 0:
        raise ValueError(f"tile_rows must be >= 1 and topk >= 0, got {tile_rows}, {topk}")
    matmul = Sgemm() if matmul is None else matmul
    T, V = mix.shape[0], source.rows
    ids = token_ids(token_sets, T)
    prepared = matmul.prepare(mix)
    state = lse_init(T)
    best = np.full(T, -np.inf, dtype=np.float32)
    arg = np.zeros(T, dtype=np.int64)
    k = min(topk, V)
    top_ids = np.zeros((T, 0), dtype=np.int64)
    top_vals = np.zeros((T, 0), dtype=np.float32)
    selected = np.full(ids.shape, np.nan, dtype=np.float32)
    excl = None if exclude is None else np.unique(np.asarray(exclude, dtype=np.int64))
    rest = lse_init(T) if excl is not None else None
    step = tile_size(T, tile_rows)
    for start in range(0, V, step):
        stop = min(start + step, V)
        tile = apply_softcap(matmul.tile(prepared, source, start, stop), softcap)
        if sink is not None:
            sink(start, stop, tile)
        t_arg = tile.argmax(axis=1)
        t_max = tile[np.arange(T), t_arg]
        better = t_max > best
        arg = np.where(better, t_arg + start, arg)
        best = np.where(better, t_max, best)
        state = lse_update(state, tile, t_max)
        if excl is not None:
            cols = excl[(excl >= start) & (excl < stop)] - start
            if cols.size:
                masked = tile.copy()
                masked[:, cols] = -np.inf
                rest = lse_update(rest, masked)
            else:
                rest = lse_update(rest, tile, t_max)
        if k:
            top_ids, top_vals = _merge_topk(top_ids, top_vals, tile, start, k)
        inside = (ids >= start) & (ids < stop)
        if inside.any():
            r, c = np.nonzero(inside)
            selected[r, c] = tile[r, ids[r, c] - start]
        if progress is not None:
            progress(stop, V)
    return VocabPass(lse_finish(state), arg, best, top_ids, top_vals, selected,
                     None if rest is None else lse_finish(rest))
