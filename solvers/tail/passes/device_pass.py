"""The streaming full-vocabulary pass on a JAX device (a GPU when there is one), from the head's
raw ggml bytes held on that device.

Same contract and result type as `solvers.tail.passes.vocab_pass.vocab_pass` (`VocabPass`): per row the LSE,
argmax and max logit, an optional top-k, the logits of requested ids, and LSE_rest over the ids not
in `exclude`. The head is uploaded once as its stored bytes (`to_device`: 521 MB of Q6_K at
production size, not 2.5 GB of float32); each tile of head rows is dequantized on the device
(`quant.jax_dequant`, bit-identical to `quant.dequantize`), multiplied at the chosen precision
(`solvers.tail.forward.device`), and reduced on the device to per-tile partials: max, first argmax, the
float32 sum of exp(l - tile max) (every term <= 1), its masked twin for LSE_rest, the tile's top-k
and the selected logits. The host folds the partials in float64, in tile order, exactly as the
numpy pass folds its tiles; so in exact mode the two agree to float32 rounding of the logits.

Every tile has the same shape (one compile): the last one is slid back to end at row V and the
rows it shares with the previous tile are masked out. Top-k keeps numpy's order (larger logit
first, ties to the lower id) on every backend: it takes the k best groups of `TOPK_GROUP` rows by
their maxima, then the k best of those groups' members, each by k rounds of first-index argmax.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from exactedit import quant
from exactedit.quant import jax_dequant
from exactedit.solvers.tail.forward.device import dot_nt, round_operand, select
from exactedit.solvers.tail.passes.vocab_pass import VocabPass, token_ids

Progress = Callable[[int, int], None]

#: the logits tile [T, tile] on the device is kept at or below this many floats (1 GiB)
MAX_TILE_ELEMS = 1 << 28
#: head rows per group in the two-stage top-k
TOPK_GROUP = 32
#: head rows per upload chunk in `to_device`
UPLOAD_ROWS = 16384


@dataclass(frozen=True, eq=False)
class DeviceRows:
    """A head [rows, cols] resident on a JAX device as raw ggml bytes (uint8 [rows, row_bytes])."""

    raw: jax.Array
    qtype: str
    rows: int
    cols: int
    device: object

    @property
    def nbytes(self) -> int:
        return int(self.raw.size)


def _raw_chunk(source, a: int, b: int) -> tuple[np.ndarray, str]:
    """Rows [a, b) of a RowSource as (bytes, qtype): stored bytes for a QuantRows (the BF16 runtime
    view as its Q8_0 copy's bytes), float32 bytes for any other source."""
    if hasattr(source, "read_raw") and hasattr(source, "qtype"):
        raw = np.ascontiguousarray(source.read_raw(a, b), dtype=np.uint8)
        if getattr(source, "runtime", False) and source.qtype == "BF16":
            return quant.quantize(quant.dequantize(raw, "BF16", source.cols), "Q8_0"), "Q8_0"
        return raw, source.qtype
    x = np.ascontiguousarray(source.read(a, b), dtype="<f4")
    return x.view(np.uint8).reshape(b - a, 4 * source.cols), "F32"


def to_device(source, device="auto", *, progress: Progress | None = None) -> DeviceRows:
    """Upload a RowSource's rows (`solvers.tail.passes.vocab_pass.QuantRows`, `ArrayRows`, ...) to `device`
    (a jax.Device or "cpu" / "gpu" / "auto") as raw bytes, in chunks of UPLOAD_ROWS rows."""
    dev = select(device) if isinstance(device, str) else device
    parts, qtype = [], None
    for a in range(0, source.rows, UPLOAD_ROWS):
        b = min(a + UPLOAD_ROWS, source.rows)
        chunk, qtype = _raw_chunk(source, a, b)
        parts.append(jax.device_put(chunk, dev))
        if progress is not None:
            progress(b, source.rows)
    raw = parts[0] if len(parts) == 1 else jnp.concatenate(parts, axis=0)
    jax_dequant.check_shape(raw.shape, qtype, source.cols)
    return DeviceRows(raw, qtype, int(source.rows), int(source.cols), dev)


def device_tile(rows: int, vocab: int, tile_rows: int, max_elems: int = MAX_TILE_ELEMS) -> int:
    """Head rows per device tile: at most `tile_rows` and V, fewer when T rows would make the logits
    tile larger than `max_elems` floats (at least 64)."""
    return max(1, min(tile_rows, vocab, max(64, max_elems // max(rows, 1))))


# ---- device kernels (traceable) ---------------------------------------------------------------

def _first_topk(x, k: int):
    """The k largest entries per row (values, column indices), larger first, equal values in
    column order: k rounds of first-index argmax, each masking the entry it took."""
    T = x.shape[0]
    rows = jnp.arange(T)

    def body(i, carry):
        cur, vals, idx = carry
        j = jnp.argmax(cur, axis=1)
        vals = vals.at[:, i].set(cur[rows, j])
        idx = idx.at[:, i].set(j.astype(jnp.int32))
        return cur.at[rows, j].set(-jnp.inf), vals, idx

    init = (x, jnp.full((T, k), -jnp.inf, x.dtype), jnp.zeros((T, k), jnp.int32))
    _, vals, idx = jax.lax.fori_loop(0, k, body, init)
    return vals, idx


def topk_rows(x, k: int, group: int = TOPK_GROUP):
    """Top-k of each row of x [T, L] in numpy's order (ties: lower column first). With L a multiple
    of `group` and k groups fewer than L / group, only the k groups with the largest maxima can hold
    the top k (each other group's max is beaten by k earlier entries), so only they are searched."""
    T, L = x.shape
    if L % group or k * group >= L:
        return _first_topk(x, k)
    grouped = x.reshape(T, L // group, group)
    _, gi = _first_topk(grouped.max(axis=2), k)
    gi = jnp.sort(gi, axis=1)                       # candidates in column order
    cand = jnp.take_along_axis(grouped, gi[:, :, None], axis=1).reshape(T, k * group)
    vals, j = _first_topk(cand, k)
    return vals, jnp.take_along_axis(gi, j // group, axis=1) * group + j % group


def lse_parts(x):
    """(max, first argmax, float32 sum of exp(x - max)) per row; a row of -inf gives (-inf, 0, 0)."""
    t_max = jnp.max(x, axis=1)
    shift = jnp.where(jnp.isfinite(t_max), t_max, 0.0)
    return t_max, jnp.argmax(x, axis=1), jnp.sum(jnp.exp(x - shift[:, None]), axis=1)


def logits_tile(raw, mix_r, start, *, qtype, cols, tile, precision, platform, softcap):
    w = jax_dequant.dequantize(jax.lax.dynamic_slice_in_dim(raw, start, tile, axis=0), qtype, cols)
    logits = dot_nt(mix_r, round_operand(w, precision), precision, platform)
    if softcap is not None:
        logits = jnp.float32(softcap) * jnp.tanh(logits / jnp.float32(softcap))
    return logits


@partial(jax.jit, static_argnames=("qtype", "cols", "tile", "precision", "platform", "softcap", "k",
                                   "has_exclude", "want_logits"))
def _pass_tile(raw, mix_r, start, lo, excl, ids, selected, *, qtype, cols, tile, precision, platform,
               softcap, k, has_exclude, want_logits):
    """One tile of head rows [start, start + tile), of which rows < lo were an earlier tile's."""
    logits = logits_tile(raw, mix_r, start, qtype=qtype, cols=cols, tile=tile, precision=precision,
                          platform=platform, softcap=softcap)
    col = start + jnp.arange(tile, dtype=jnp.int32)
    masked = jnp.where((col >= lo)[None, :], logits, -jnp.inf)
    t_max, t_arg, t_sum = lse_parts(masked)
    out = {"max": t_max, "arg": t_arg.astype(jnp.int32) + start, "sum": t_sum}
    if has_exclude:
        local = jnp.where((excl >= start) & (excl < start + tile), excl - start, tile)
        hit = jnp.zeros(tile, bool).at[local].set(True, mode="drop")
        out["rest_max"], _, out["rest_sum"] = lse_parts(jnp.where(hit[None, :], -jnp.inf, masked))
    if k:
        vals, idx = topk_rows(masked, k)
        out["top_vals"], out["top_ids"] = vals, idx + start
    local = ids - start
    inside = (ids >= lo) & (local < tile)
    got = jnp.take_along_axis(logits, jnp.clip(local, 0, tile - 1), axis=1)
    selected = jnp.where(inside, got, selected)
    if want_logits:
        out["logits"] = logits
    return out, selected


# ---- host side ----------------------------------------------------------------------------------

def fold_lse(t_max: np.ndarray, t_sum: np.ndarray) -> np.ndarray:
    """LSE float64 [T] from per-tile partials [tiles, T] (max, sum of exp(l - max)), folded in
    float64 as `stream.lse_update` folds tiles."""
    t_max = t_max.astype(np.float64)
    finite = np.isfinite(t_max)
    m = np.max(np.where(finite, t_max, -np.inf), axis=0)
    safe = np.where(np.isfinite(m), m, 0.0)
    s = np.sum(np.where(finite, t_sum.astype(np.float64) * np.exp(np.where(finite, t_max, 0.0) - safe), 0.0),
               axis=0)
    with np.errstate(divide="ignore"):
        return m + np.log(s)


@partial(jax.jit, static_argnames="k")
def _merge_topk(vals, ids, k: int):
    """Per-tile top-k candidates side by side [T, tiles * k'] (tiles in id order, each tile's in
    numpy's order) -> the k best per row. Equal values sit in id order, so first-index selection
    gives numpy's order: larger first, ties to the lower id."""
    v, j = _first_topk(vals, k)
    return v, jnp.take_along_axis(ids, j, axis=1)


def padded_rows(T: int) -> int:
    """Rows the device kernels are compiled for: T rounded up (to a power of two up to 1024, then
    to a multiple of 1024), so passes over slightly different row counts share one compile."""
    if T <= 1024:
        return max(8, 1 << max(T - 1, 0).bit_length())
    return -(-T // 1024) * 1024


def pad_rows(x: np.ndarray, rows: int, fill) -> np.ndarray:
    """x with rows appended (filled with `fill`) up to `rows` rows; padded rows are never read back."""
    if x.shape[0] == rows:
        return np.ascontiguousarray(x)
    out = np.full((rows,) + x.shape[1:], fill, dtype=x.dtype)
    out[:x.shape[0]] = x
    return out


def platform_of(dev) -> str:
    return "gpu" if dev.platform in ("gpu", "cuda") else dev.platform


def tiles(V: int, tile: int):
    """(nominal start, device start) of each tile; the last one slid back to end at V."""
    return [(a, min(a, V - tile)) for a in range(0, V, tile)]


def vocab_pass_jax(mix, rows: DeviceRows, *, token_sets=None, topk: int = 0, tile_rows: int = 8192,
                   softcap: float | None = None, exclude=None, precision: str = "exact",
                   max_tile_elems: int = MAX_TILE_ELEMS,
                   sink: Callable[[int, int, np.ndarray], None] | None = None,
                   progress: Progress | None = None) -> VocabPass:
    """`stream.vocab_pass` on rows' device: mix [T, n] against every head row, one tile at a time.

    `precision` is "exact" (default), "tf32" or "bf16" (`solvers.tail.forward.device`). `sink(start, stop, tile)`
    gets each float32 logits tile on the host (a copy off the device: slow, for writing logits)."""
    mix = mix if isinstance(mix, jax.Array) else np.asarray(mix)
    if mix.ndim != 2 or mix.shape[1] != rows.cols:
        raise ValueError(f"mix must be [T, {rows.cols}], got shape {mix.shape}")
    if tile_rows < 1 or topk < 0:
        raise ValueError(f"tile_rows must be >= 1 and topk >= 0, got {tile_rows}, {topk}")
    T, V = mix.shape[0], rows.rows
    Tp = padded_rows(T)
    ids = pad_rows(token_ids(token_sets, T), Tp, -1)
    dev = rows.device
    tile = device_tile(Tp, V, tile_rows, max_tile_elems)
    k = min(topk, V)
    excl = None if exclude is None else np.unique(np.asarray(exclude, dtype=np.int64))
    has_exclude = excl is not None
    excl_d = jax.device_put(np.zeros(1, np.int32) if excl is None or excl.size == 0 else
                            np.clip(excl, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    ids_d = jax.device_put(np.clip(ids, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    selected = jax.device_put(np.full(ids.shape, np.nan, np.float32), dev)
    mix_r = prepare(jax.device_put(mix, dev), precision, Tp)
    static = dict(qtype=rows.qtype, cols=rows.cols, tile=tile, precision=precision, platform=platform_of(dev),
                  softcap=None if softcap is None else float(softcap), k=min(k, tile),
                  has_exclude=has_exclude, want_logits=sink is not None)
    parts = []
    plan = tiles(V, tile)
    for i, (lo, start) in enumerate(plan):
        out, selected = _pass_tile(rows.raw, mix_r, jnp.int32(start), jnp.int32(lo), excl_d, ids_d, selected,
                                   **static)
        parts.append(out)
        if sink is not None:
            sink(lo, min(lo + tile, V), np.asarray(out.pop("logits"))[:T, lo - start:])
        if i and progress is not None:  # report a tile once it is done, while the next one runs
            jax.block_until_ready(parts[i - 1]["max"])
            progress(min(plan[i - 1][0] + tile, V), V)
    host = {key: np.asarray(jnp.stack([p[key] for p in parts]))[:, :T] for key in parts[0] if "top" not in key}
    if progress is not None:
        progress(V, V)
    best_tile = np.argmax(host["max"], axis=0)  # first tile holding the row's max: the lowest id
    cols_ = np.arange(T)
    if k:
        vals, ids_ = (jnp.concatenate([p[key] for p in parts], axis=1) for key in ("top_vals", "top_ids"))
        top_vals, top_ids = (np.asarray(a)[:T] for a in _merge_topk(vals, ids_, k))
        top_ids = top_ids.astype(np.int64)
    else:
        top_ids, top_vals = np.zeros((T, 0), np.int64), np.zeros((T, 0), np.float32)
    return VocabPass(
        lse=fold_lse(host["max"], host["sum"]), argmax=host["arg"][best_tile, cols_].astype(np.int64),
        max_logit=host["max"][best_tile, cols_].astype(np.float32), topk_ids=top_ids,
        topk_logits=top_vals.astype(np.float32), selected=np.asarray(selected)[:T],
        lse_rest=fold_lse(host["rest_max"], host["rest_sum"]) if has_exclude else None)


@partial(jax.jit, static_argnames=("precision", "rows"))
def prepare(mix, precision: str, rows: int):
    """The activations on the device as the mode multiplies them, zero rows appended up to `rows`."""
    return round_operand(jnp.pad(mix.astype(jnp.float32), ((0, rows - mix.shape[0]), (0, 0))), precision)
