"""The KL pass on a JAX device: KL(base || edited) per row of two activations over one head held on
the device as its raw ggml bytes (`device_pass.DeviceRows`), both logits tiles from the same
dequantized tile, the partials folded on the host in float64. Same fields as the numpy reference
`kl_pass.kl_rows`; compared with it in tests/solvers/tail/test_kl_pass.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from exactedit.solvers.tail.passes.device_pass import (MAX_TILE_ELEMS, DeviceRows, device_tile, fold_lse,
    logits_tile, lse_parts, pad_rows, padded_rows, platform_of, prepare, tiles)
from exactedit.solvers.tail.passes.kl_pass import KlRows

__all__ = ["PrecisionReport", "kl_pass_jax", "measure_precision"]

Progress = Callable[[int, int], None]


@partial(jax.jit, static_argnames=("qtype", "cols", "tile", "precision", "platform", "softcap"))
def _kl_tile(raw, mix_b, mix_e, start, lo, nxt, *, qtype, cols, tile, precision, platform, softcap):
    """Partials of KL(p_base || p_edit) on one tile. With w = exp(l_b - tile max) and d = l_b - l_e:
    a = sum w d; c = sum w (d + expm1(-d)) (terms >= 0; a short series below |d| = 0.1, so no
    cancellation); b = sum w expm1(-d). Terms with -d > 1 leave c and b to the host, which adds
    their exact sum exp(l_e - b max) - w from big_e (relative to the edit's max) and big_w, in float64."""
    kw = dict(qtype=qtype, cols=cols, tile=tile, platform=platform, softcap=softcap)
    lb = logits_tile(raw, mix_b, start, precision="exact", **kw)
    le = logits_tile(raw, mix_e, start, precision=precision, **kw)
    valid = (start + jnp.arange(tile) >= lo)[None, :]
    lb, le = jnp.where(valid, lb, -jnp.inf), jnp.where(valid, le, -jnp.inf)
    b_max, b_arg, b_sum = lse_parts(lb)
    e_max, e_arg, e_sum = lse_parts(le)
    shift = jnp.where(jnp.isfinite(b_max), b_max, 0.0)[:, None]
    w = jnp.exp(lb - shift)
    d = jnp.where(valid, lb - le, 0.0)
    big = -d > 1.0               # these terms' w expm1(-d) = exp(l_e - b max) - w is folded on the host
    wd = jnp.where(w > 0, w * d, 0.0)
    em1 = jnp.where(big, 0.0, w * jnp.expm1(-jnp.where(big, 0.0, d)))
    small = jnp.abs(d) < 0.1     # d + expm1(-d) = d^2 (1/2 - d/6 + d^2/24 - d^3/120 + ...): no cancellation
    series = d * d * (0.5 + d * (-1 / 6 + d * (1 / 24 - d / 120)))
    cterm = jnp.where(small, w * series, wd + em1)
    e_shift = jnp.where(jnp.isfinite(e_max), e_max, 0.0)[:, None]
    local = nxt - start
    inside = (nxt >= lo) & (local < tile)
    pick = jnp.clip(local, 0, tile - 1)[:, None]
    return {"b_max": b_max, "b_sum": b_sum, "e_max": e_max, "e_sum": e_sum,
            "b_arg": b_arg + start, "e_arg": e_arg + start, "a": jnp.sum(wd, axis=1),
            "c": jnp.sum(cterm, axis=1), "b": jnp.sum(em1, axis=1),
            "big_e": jnp.sum(jnp.where(big, jnp.exp(le - e_shift), 0.0), axis=1),
            "big_w": jnp.sum(jnp.where(big, w, 0.0), axis=1),
            "nb": jnp.where(inside, jnp.take_along_axis(lb, pick, axis=1)[:, 0], jnp.nan),
            "ne": jnp.where(inside, jnp.take_along_axis(le, pick, axis=1)[:, 0], jnp.nan)}


def kl_pass_jax(mix_base, mix_edit, rows: DeviceRows, *, next_ids=None, precision: str = "exact",
                softcap: float | None = None, tile_rows: int = 8192, max_tile_elems: int = MAX_TILE_ELEMS,
                progress: Progress | None = None):
    """The KL pass (`kl_pass.kl_rows`) for one head on rows' device: KL(base || edited) per row of the two
    activations [T, n] (base in exact mode, edited at `precision`), their argmax, LSE and log p of
    `next_ids`, in one pass that computes both logits from the same dequantized tile. Folded in
    float64 from the tile partials A, B, C (see `_kl_tile`) over the base's
    total mass; with x = E[expm1(-d)], KL = E[d] + log1p(x), taken as C + log1p(x) - x when |x| < 0.5
    (no cancellation for small d) and as A + log1p(x) otherwise (none for large d)."""
    mb, me = (np.asarray(m, dtype=np.float32) for m in (mix_base, mix_edit))
    if mb.ndim != 2 or mb.shape != me.shape or mb.shape[1] != rows.cols:
        raise ValueError(f"mix_base and mix_edit must both be [T, {rows.cols}], got {mb.shape}, {me.shape}")
    T, V = mb.shape[0], rows.rows
    Tp = padded_rows(T)
    nxt = pad_rows(np.full(T, -1, np.int64) if next_ids is None else np.asarray(next_ids, np.int64), Tp, -1)
    dev = rows.device
    tile = device_tile(2 * Tp, V, tile_rows, max_tile_elems)
    mix_b = prepare(jax.device_put(mb, dev), "exact", Tp)
    mix_e = prepare(jax.device_put(me, dev), precision, Tp)
    nxt_d = jax.device_put(np.clip(nxt, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    static = dict(qtype=rows.qtype, cols=rows.cols, tile=tile, precision=precision, platform=platform_of(dev),
                  softcap=None if softcap is None else float(softcap))
    parts = []
    for lo, start in tiles(V, tile):
        parts.append(_kl_tile(rows.raw, mix_b, mix_e, jnp.int32(start), jnp.int32(lo), nxt_d, **static))
        if progress is not None:
            jax.block_until_ready(parts[-1]["c"])
            progress(min(lo + tile, V), V)
    h = {key: np.asarray(jnp.stack([p[key] for p in parts]))[:, :T].astype(np.float64) for key in parts[0]}
    lse_b, lse_e = fold_lse(h["b_max"], h["b_sum"]), fold_lse(h["e_max"], h["e_sum"])
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        finite = np.isfinite(h["b_max"]) & np.isfinite(h["e_max"])
        big = np.where(finite, h["big_e"] * np.exp(np.where(finite, h["e_max"] - h["b_max"], 0.0)) - h["big_w"], 0.0)
        scale = np.where(np.isfinite(h["b_max"]), np.exp(h["b_max"] - lse_b[None, :]), 0.0)
        a = np.sum(h["a"] * scale, axis=0)
        c = np.sum((h["c"] + big) * scale, axis=0)
        x = np.sum((h["b"] + big) * scale, axis=0)      # E_base[expm1(-d)] = exp(LSE_e - LSE_b) - 1
        kl = np.where(np.abs(x) < 0.5, c + (np.log1p(x) - x), a + np.log1p(x))
    cols_ = np.arange(T)

    def first(arg, mx):  # the first tile holding the row's max: the lowest id, as in the pass
        return h[arg].astype(np.int64)[np.argmax(h[mx], axis=0), cols_]

    return KlRows(kl, first("b_arg", "b_max"), first("e_arg", "e_max"), lse_b, lse_e,
                  _next_logp(h["nb"], lse_b), _next_logp(h["ne"], lse_e))


def _next_logp(tiles: np.ndarray, lse: np.ndarray) -> np.ndarray:
    """log p of the next token from per-tile picks (nan outside its tile; nan where unknown)."""
    seen = ~np.isnan(tiles)
    val = np.where(seen, tiles, 0.0).sum(axis=0)
    return np.where(seen.any(axis=0), val - lse, np.nan)


@dataclass(frozen=True)
class PrecisionReport:
    """KL(p_exact || p_mode) per row over the full vocabulary, on the same rows and head."""

    precision: str
    rows: int
    mean_kl: float
    median_kl: float
    p99_kl: float
    max_kl: float
    top1_agree: float          # share of rows whose argmax is the same in both modes
    max_abs_dlse: float        # max |LSE_mode - LSE_exact|
    kl: np.ndarray             # float64 [rows]

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k != "kl"}


def measure_precision(mix, rows: DeviceRows, precision: str, *, tile_rows: int = 8192,
                      softcap: float | None = None, max_tile_elems: int = MAX_TILE_ELEMS,
                      progress: Progress | None = None) -> PrecisionReport:
    """KL(p_exact || p_precision) of each row of mix over the whole head (`kl_pass_jax` with the same
    activations on both sides, the second side at `precision`)."""
    r = kl_pass_jax(mix, mix, rows, precision=precision, softcap=softcap, tile_rows=tile_rows,
                    max_tile_elems=max_tile_elems, progress=progress)
    kl = np.maximum(r.kl, 0.0)
    T = len(kl)
    return PrecisionReport(precision, T, float(np.mean(kl)), float(np.median(kl)), float(np.quantile(kl, 0.99)),
                           float(np.max(kl)), float(np.mean(r.argmax_base == r.argmax_edited)),
                           float(np.max(np.abs(r.lse_edited - r.lse_base))), kl)
