"""The streaming full-vocabulary pass on a JAX device (a GPU when there is one), from the head's
raw ggml bytes held on that device.

Same contract and result type as `solvers.head.stream.vocab_pass` (`VocabPass`): per row the LSE,
argmax and max logit, an optional top-k, the logits of requested ids, and LSE_rest over the ids not
in `exclude`. The head is uploaded once as its stored bytes (`to_device`: 521 MB of Q6_K at
production size, not 2.5 GB of float32); each tile of head rows is dequantized on the device
(`quant.jax_dequant`, bit-identical to `quant.dequantize`), multiplied at the chosen precision
(`solvers.device`), and reduced on the device to per-tile partials: max, first argmax, the
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
from exactedit.solvers.device import dot_nt, round_operand, select
from exactedit.solvers.head.stream import VocabPass

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
    """Upload a RowSource's rows (`solvers.head.stream.QuantRows`, `ArrayRows`, ...) to `device`
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


def _lse_parts(x):
    """(max, first argmax, float32 sum of exp(x - max)) per row; a row of -inf gives (-inf, 0, 0)."""
    t_max = jnp.max(x, axis=1)
    shift = jnp.where(jnp.isfinite(t_max), t_max, 0.0)
    return t_max, jnp.argmax(x, axis=1), jnp.sum(jnp.exp(x - shift[:, None]), axis=1)


def _logits_tile(raw, mix_r, start, *, qtype, cols, tile, precision, platform, softcap):
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
    logits = _logits_tile(raw, mix_r, start, qtype=qtype, cols=cols, tile=tile, precision=precision,
                          platform=platform, softcap=softcap)
    col = start + jnp.arange(tile, dtype=jnp.int32)
    masked = jnp.where((col >= lo)[None, :], logits, -jnp.inf)
    t_max, t_arg, t_sum = _lse_parts(masked)
    out = {"max": t_max, "arg": t_arg.astype(jnp.int32) + start, "sum": t_sum}
    if has_exclude:
        local = jnp.where((excl >= start) & (excl < start + tile), excl - start, tile)
        hit = jnp.zeros(tile, bool).at[local].set(True, mode="drop")
        out["rest_max"], _, out["rest_sum"] = _lse_parts(jnp.where(hit[None, :], -jnp.inf, masked))
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


def _token_ids(token_sets, rows: int) -> np.ndarray:
    """Requested ids as [T, m] int64 (a shared list [m] is broadcast), as `vocab_pass` takes them."""
    if token_sets is None:
        return np.zeros((rows, 0), dtype=np.int64)
    ids = np.asarray(token_sets, dtype=np.int64)
    if ids.ndim == 1:
        return np.broadcast_to(ids, (rows, ids.size))
    if ids.ndim != 2 or ids.shape[0] != rows:
        raise ValueError(f"token_sets must be [m] or [{rows}, m], got shape {ids.shape}")
    return ids


def padded_rows(T: int) -> int:
    """Rows the device kernels are compiled for: T rounded up (to a power of two up to 1024, then
    to a multiple of 1024), so passes over slightly different row counts share one compile."""
    if T <= 1024:
        return max(8, 1 << max(T - 1, 0).bit_length())
    return -(-T // 1024) * 1024


def _pad(x: np.ndarray, rows: int, fill) -> np.ndarray:
    """x with rows appended (filled with `fill`) up to `rows` rows; padded rows are never read back."""
    if x.shape[0] == rows:
        return np.ascontiguousarray(x)
    out = np.full((rows,) + x.shape[1:], fill, dtype=x.dtype)
    out[:x.shape[0]] = x
    return out


def _platform(dev) -> str:
    return "gpu" if dev.platform in ("gpu", "cuda") else dev.platform


def _tiles(V: int, tile: int):
    """(nominal start, device start) of each tile; the last one slid back to end at V."""
    return [(a, min(a, V - tile)) for a in range(0, V, tile)]


def vocab_pass_jax(mix, rows: DeviceRows, *, token_sets=None, topk: int = 0, tile_rows: int = 8192,
                   softcap: float | None = None, exclude=None, precision: str = "exact",
                   max_tile_elems: int = MAX_TILE_ELEMS,
                   sink: Callable[[int, int, np.ndarray], None] | None = None,
                   progress: Progress | None = None) -> VocabPass:
    """`stream.vocab_pass` on rows' device: mix [T, n] against every head row, one tile at a time.

    `precision` is "exact" (default), "tf32" or "bf16" (`solvers.device`). `sink(start, stop, tile)`
    gets each float32 logits tile on the host (a copy off the device: slow, for writing logits)."""
    mix = mix if isinstance(mix, jax.Array) else np.asarray(mix)
    if mix.ndim != 2 or mix.shape[1] != rows.cols:
        raise ValueError(f"mix must be [T, {rows.cols}], got shape {mix.shape}")
    if tile_rows < 1 or topk < 0:
        raise ValueError(f"tile_rows must be >= 1 and topk >= 0, got {tile_rows}, {topk}")
    T, V = mix.shape[0], rows.rows
    Tp = padded_rows(T)
    ids = _pad(_token_ids(token_sets, T), Tp, -1)
    dev = rows.device
    tile = device_tile(Tp, V, tile_rows, max_tile_elems)
    k = min(topk, V)
    excl = None if exclude is None else np.unique(np.asarray(exclude, dtype=np.int64))
    has_exclude = excl is not None
    excl_d = jax.device_put(np.zeros(1, np.int32) if excl is None or excl.size == 0 else
                            np.clip(excl, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    ids_d = jax.device_put(np.clip(ids, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    selected = jax.device_put(np.full(ids.shape, np.nan, np.float32), dev)
    mix_r = _prepare(jax.device_put(mix, dev), precision, Tp)
    static = dict(qtype=rows.qtype, cols=rows.cols, tile=tile, precision=precision, platform=_platform(dev),
                  softcap=None if softcap is None else float(softcap), k=min(k, tile),
                  has_exclude=has_exclude, want_logits=sink is not None)
    parts = []
    plan = _tiles(V, tile)
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
def _prepare(mix, precision: str, rows: int):
    """The activations on the device as the mode multiplies them, zero rows appended up to `rows`."""
    return round_operand(jnp.pad(mix.astype(jnp.float32), ((0, rows - mix.shape[0]), (0, 0))), precision)


# ---- KL between two activations (or two precisions) over the same head ------------------------------

@partial(jax.jit, static_argnames=("qtype", "cols", "tile", "precision", "platform", "softcap"))
def _kl_tile(raw, mix_b, mix_e, start, lo, nxt, *, qtype, cols, tile, precision, platform, softcap):
    """Partials of KL(p_base || p_edit) on one tile. With w = exp(l_b - tile max) and d = l_b - l_e:
    a = sum w d; c = sum w (d + expm1(-d)) (terms >= 0; a short series below |d| = 0.1, so no
    cancellation); b = sum w expm1(-d). Terms with -d > 1 leave c and b to the host, which adds
    their exact sum exp(l_e - b max) - w from big_e (relative to the edit's max) and big_w, in float64."""
    kw = dict(qtype=qtype, cols=cols, tile=tile, platform=platform, softcap=softcap)
    lb = _logits_tile(raw, mix_b, start, precision="exact", **kw)
    le = _logits_tile(raw, mix_e, start, precision=precision, **kw)
    valid = (start + jnp.arange(tile) >= lo)[None, :]
    lb, le = jnp.where(valid, lb, -jnp.inf), jnp.where(valid, le, -jnp.inf)
    b_max, b_arg, b_sum = _lse_parts(lb)
    e_max, e_arg, e_sum = _lse_parts(le)
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
    small = jnp.abs(d) < 0.1  # d + expm1(-d) = d^2 (1/2 - d/6 + d^2/24 - d^3/120 + ...), no cancellation
    series = d * d * (0.5 + d * (-1 / 6 + d * (1 / 24 - d / 120)))
    cterm = jnp.where(small, w * series, wd + em1)
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
    """`evals.kld.kl_rows` for one head on rows' device: KL(base || edited) per row of the two
    activations [T, n] (base in exact mode, edited at `precision`), their argmax, LSE and log p of
    `next_ids`, in one pass that computes both logits from the same dequantized tile. Folded in
    float64 from the tile partials A, B, C (see `_kl_tile`) over the base's
    total mass; with x = E[expm1(-d)], KL = E[d] + log1p(x), taken as C + log1p(x) - x when |x| < 0.5
    (no cancellation for small d) and as A + log1p(x) otherwise (none for large d)."""
    from exactedit.evals.kld import KlRows

    mb, me = (np.asarray(m, dtype=np.float32) for m in (mix_base, mix_edit))
    if mb.ndim != 2 or mb.shape != me.shape or mb.shape[1] != rows.cols:
        raise ValueError(f"mix_base and mix_edit must both be [T, {rows.cols}], got {mb.shape}, {me.shape}")
    T, V = mb.shape[0], rows.rows
    Tp = padded_rows(T)
    nxt = _pad(np.full(T, -1, np.int64) if next_ids is None else np.asarray(next_ids, np.int64), Tp, -1)
    dev = rows.device
    tile = device_tile(2 * Tp, V, tile_rows, max_tile_elems)
    mix_b = _prepare(jax.device_put(mb, dev), "exact", Tp)
    mix_e = _prepare(jax.device_put(me, dev), precision, Tp)
    nxt_d = jax.device_put(np.clip(nxt, -1, np.iinfo(np.int32).max).astype(np.int32), dev)
    static = dict(qtype=rows.qtype, cols=rows.cols, tile=tile, precision=precision, platform=_platform(dev),
                  softcap=None if softcap is None else float(softcap))
    parts = []
    for lo, start in _tiles(V, tile):
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
