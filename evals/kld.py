"""KL divergence of an edited model against its base, in llama.cpp's perplexity-tool form.

Per row t, with p = softmax(base logits) and q = softmax(edited logits), d = l - l':
    KL(p || q) = E_p[d] + LSE' - LSE = E_p[d] + log1p(E_p[expm1(-d)])
The second form is what `kl_rows` accumulates (float64, one streaming pass over both heads, no
full logits kept): rows where nothing changed give exactly 0, and small KLs keep their digits
instead of cancelling two LSEs of size ~10. Statistics follow llama.cpp's report: mean (with
its standard error), median, percentiles (linear interpolation between order statistics), max,
min, top-1 agreement ("same top"), PPL of both over rows with a known next token, Delta p.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, NamedTuple

import numpy as np

from exactedit.solvers.head.forward import apply_softcap
from exactedit.solvers.head.forward_fast import Matmul, Sgemm
from exactedit.solvers.head.stream import RowSource, lse_finish, lse_init, lse_update, tile_size

Progress = Callable[[int, int], None]


class KlRows(NamedTuple):
    """Per-row results of one pass over base and edited heads (T rows)."""

    kl: np.ndarray            # float64 [T]  KL(base || edited)
    argmax_base: np.ndarray   # int64 [T]
    argmax_edited: np.ndarray
    lse_base: np.ndarray      # float64 [T]
    lse_edited: np.ndarray
    logp_next_base: np.ndarray    # float64 [T], nan where the next token is unknown
    logp_next_edited: np.ndarray


def _argmax_update(arg, best, tile, start):
    t_arg = tile.argmax(axis=1)
    t_max = tile[np.arange(tile.shape[0]), t_arg]
    better = t_max > best
    return np.where(better, t_arg + start, arg), np.where(better, t_max, best), t_max


def kl_rows(mix_base, head_base: RowSource, mix_edited, head_edited: RowSource, *,
            next_ids=None, softcap: float | None = None, tile_rows: int = 8192,
            matmul: Matmul | None = None, progress: Progress | None = None) -> KlRows:
    """KL(base || edited) and friends for activations mix_base / mix_edited [T, n] over two
    heads of the same shape. Tiles whose stored bytes and activations are identical in both
    models are computed once (their logits are then equal, so they add exactly 0)."""
    if (head_base.rows, head_base.cols) != (head_edited.rows, head_edited.cols):
        raise ValueError(f"heads differ in shape: {head_base.rows}x{head_base.cols} vs "
                         f"{head_edited.rows}x{head_edited.cols}")
    matmul = Sgemm() if matmul is None else matmul
    mb, me = np.asarray(mix_base), np.asarray(mix_edited)
    same_mix = mb.shape == me.shape and np.array_equal(mb, me)
    pb, pe = matmul.prepare(mb), (None if same_mix else matmul.prepare(me))
    T, V = mb.shape[0], head_base.rows
    nxt = np.full(T, -1, np.int64) if next_ids is None else np.asarray(next_ids, np.int64)
    sb, se = lse_init(T), lse_init(T)
    m = np.full(T, -np.inf)          # running max of base logits, scale of A and C
    A, C = np.zeros(T), np.zeros(T)  # sum e^(l - m) d,  sum e^(l - m) expm1(-d)
    arg_b = np.zeros(T, np.int64); best_b = np.full(T, -np.inf, np.float32)
    arg_e = np.zeros(T, np.int64); best_e = np.full(T, -np.inf, np.float32)
    sel_b, sel_e = np.full(T, np.nan, np.float32), np.full(T, np.nan, np.float32)
    step = tile_size(2 * T, tile_rows)  # two logits tiles and float64 temporaries per tile
    for start in range(0, V, step):
        stop = min(start + step, V)
        lb = apply_softcap(matmul.tile(pb, head_base, start, stop), softcap)
        same = same_mix and head_base.tile_key(start, stop) == head_edited.tile_key(start, stop)
        le = lb if same else apply_softcap(
            matmul.tile(pe if pe is not None else pb, head_edited, start, stop), softcap)
        arg_b, best_b, tb = _argmax_update(arg_b, best_b, lb, start)
        arg_e, best_e, te = _argmax_update(arg_e, best_e, le, start)
        sb = lse_update(sb, lb, tb)
        se = lse_update(se, le, te)
        tb64 = tb.astype(np.float64)
        m_new = np.maximum(m, tb64)
        safe = np.where(np.isfinite(m_new), m_new, 0.0)
        keep = np.where(np.isfinite(m), np.exp(m - safe), 0.0)
        A, C, m = A * keep, C * keep, m_new
        if not same:
            shift = np.where(np.isfinite(tb), tb, 0).astype(lb.dtype)
            w = np.exp(lb - shift[:, None]).astype(np.float64)
            le64 = le.astype(np.float64)
            d = lb.astype(np.float64) - le64
            big = -d > 1.0  # expm1 only where it cannot overflow; elsewhere e^(l'-t) - e^(l-t)
            up = np.where(big, le64 - shift[:, None], 0.0)
            cterm = np.where(big, np.exp(up) - w, w * np.expm1(-np.where(big, 0.0, d)))
            wd = np.where(w > 0, w * d, 0.0)
            scale = np.where(np.isfinite(tb64), np.exp(tb64 - safe), 0.0)
            A += scale * wd.sum(axis=1)
            C += scale * cterm.sum(axis=1)
        inside = (nxt >= start) & (nxt < stop)
        if inside.any():
            r = np.flatnonzero(inside)
            sel_b[r] = lb[r, nxt[r] - start]
            sel_e[r] = le[r, nxt[r] - start]
        if progress is not None:
            progress(stop, V)
    S = sb.s * np.exp(sb.m - np.where(np.isfinite(m), m, 0.0))  # base exp-sum on A's scale
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = A / S + np.log1p(C / S)
    lse_b, lse_e = lse_finish(sb), lse_finish(se)
    return KlRows(kl, arg_b, arg_e, lse_b, lse_e, sel_b - lse_b, sel_e - lse_e)


@dataclass(frozen=True)
class KldStats:
    """llama.cpp's KL-divergence report (its `perplexity --kl-divergence` statistics)."""

    rows: int
    kld_mean: float
    kld_mean_stderr: float
    kld_max: float
    kld_p999: float
    kld_p99: float
    kld_p95: float
    kld_p90: float
    kld_median: float
    kld_p10: float
    kld_min: float
    same_top: float           # fraction of rows whose argmax agrees
    same_top_stderr: float
    ppl_rows: int             # rows with a known next token
    ppl_base: float
    ppl_edited: float
    ln_ppl_ratio: float       # mean of ln p_base(next) - ln p_edited(next) = ln(PPL_e / PPL_b)
    ln_ppl_ratio_stderr: float
    dp_mean: float            # mean of p_edited(next) - p_base(next)
    dp_rms: float

    def to_dict(self) -> dict:
        return asdict(self)


def _stderr(x: np.ndarray) -> float:
    return float(np.std(x, ddof=1) / np.sqrt(x.size)) if x.size > 1 else float("nan")


def kld_stats(r: KlRows) -> KldStats:
    """Statistics over all rows (KLD, top-1) and over rows with a known next token (PPL, Delta p)."""
    kl = np.asarray(r.kl, dtype=np.float64)
    if kl.size == 0:
        raise ValueError("no rows to summarize")
    pct = lambda q: float(np.percentile(kl, q))  # noqa: E731 - linear, as llama.cpp
    same = (np.asarray(r.argmax_base) == np.asarray(r.argmax_edited)).astype(np.float64)
    known = np.isfinite(r.logp_next_base) & np.isfinite(r.logp_next_edited)
    lb, le = np.asarray(r.logp_next_base)[known], np.asarray(r.logp_next_edited)[known]
    nan = float("nan")
    ratio = lb - le
    dp = np.exp(le) - np.exp(lb)
    return KldStats(
        rows=int(kl.size), kld_mean=float(kl.mean()), kld_mean_stderr=_stderr(kl),
        kld_max=float(kl.max()), kld_p999=pct(99.9), kld_p99=pct(99), kld_p95=pct(95),
        kld_p90=pct(90), kld_median=pct(50), kld_p10=pct(10), kld_min=float(kl.min()),
        same_top=float(same.mean()),
        same_top_stderr=float(np.sqrt(same.mean() * (1 - same.mean()) / max(kl.size - 1, 1))),
        ppl_rows=int(known.sum()),
        ppl_base=float(np.exp(-lb.mean())) if lb.size else nan,
        ppl_edited=float(np.exp(-le.mean())) if le.size else nan,
        ln_ppl_ratio=float(ratio.mean()) if ratio.size else nan,
        ln_ppl_ratio_stderr=_stderr(ratio),
        dp_mean=float(dp.mean()) if dp.size else nan,
        dp_rms=float(np.sqrt(np.mean(dp * dp))) if dp.size else nan)


@dataclass(frozen=True)
class KldResult:
    """`exactedit kld`: the statistics, the per-row values, and what was compared."""

    stats: KldStats
    per_row: KlRows
    model: str
    edited: str
    dump: str
    rows: tuple[int, int]
    model_sha256: str
    edited_sha256: str
    dump_sha256: str

    def to_dict(self) -> dict:
        return {"model": self.model, "edited": self.edited, "dump": self.dump,
                "row_range": list(self.rows), "model_sha256": self.model_sha256,
                "edited_sha256": self.edited_sha256, "dump_sha256": self.dump_sha256,
                **self.stats.to_dict()}


def kld(model, dump, edited, *, rows: str | tuple[int, int] | None = None, tile_rows: int = 8192,
        matmul: Matmul | None = None, progress: Progress | None = None) -> KldResult:
    """KL(base || edited) over the dump's rows, both models recomputed from the same dump."""
    from exactedit.quant import gguf
    from exactedit.quant.errors import ExacteditError
    from exactedit.solvers.logits import open_pair, parse_rows, tail_mix
    from exactedit.solvers.model import load_tail

    g, tail, d = open_pair(model, dump)
    g2 = gguf.open(edited)
    tail2 = load_tail(g2)
    for key in ("kind", "n", "vocab", "h", "streams", "layer"):
        a, b = getattr(tail.spec, key), getattr(tail2.spec, key)
        if a != b:
            raise ExacteditError(f"{edited}: tail {key} is {b!r}, the base model's is {a!r}")
    if tail.softcap != tail2.softcap:
        raise ExacteditError(f"{edited}: logit softcap {tail2.softcap} differs from the base's {tail.softcap}")
    span = rows if isinstance(rows, tuple) else parse_rows(rows, d.rows)
    mix_b, mix_e = tail_mix(tail, d, span), tail_mix(tail2, d, span)
    r = kl_rows(mix_b, tail.head, mix_e, tail2.head, next_ids=np.asarray(d.next[span[0]:span[1]]),
                softcap=tail.softcap, tile_rows=tile_rows, matmul=matmul, progress=progress)
    return KldResult(kld_stats(r), r, str(model), str(edited), str(dump), span,
                     g.sha256(), g2.sha256(), d.sha256())


def render_kld(r: KldResult) -> str:
    """The text table `exactedit kld` prints (llama.cpp's order and labels)."""
    s = r.stats
    pct = lambda x: f"{100 * x:8.3f} %"  # noqa: E731
    lines = [f"base    {r.model}  ({r.model_sha256[:12]})",
             f"edited  {r.edited}  ({r.edited_sha256[:12]})",
             f"dump    {r.dump}  rows {r.rows[0]}:{r.rows[1]}  ({r.dump_sha256[:12]})",
             "====== Perplexity statistics ======",
             f"rows with a next token: {s.ppl_rows}",
             f"Mean PPL(Q)          : {s.ppl_edited:12.6f}",
             f"Mean PPL(base)       : {s.ppl_base:12.6f}",
             f"Mean ln(PPL(Q)/PPL(base)): {s.ln_ppl_ratio:10.6f} ± {s.ln_ppl_ratio_stderr:.6f}",
             "====== KL divergence statistics ======",
             f"Mean    KLD: {s.kld_mean:12.6f} ± {s.kld_mean_stderr:.6f}",
             f"Maximum KLD: {s.kld_max:12.6f}",
             f"99.9%   KLD: {s.kld_p999:12.6f}",
             f"99.0%   KLD: {s.kld_p99:12.6f}",
             f"95.0%   KLD: {s.kld_p95:12.6f}",
             f"90.0%   KLD: {s.kld_p90:12.6f}",
             f"Median  KLD: {s.kld_median:12.6f}",
             f"10.0%   KLD: {s.kld_p10:12.6f}",
             f"Minimum KLD: {s.kld_min:12.6f}",
             "====== Token probability statistics ======",
             f"Mean    Δp: {pct(s.dp_mean)}",
             f"RMS     Δp: {pct(s.dp_rms)}",
             f"Same top p: {pct(s.same_top)} ± {100 * s.same_top_stderr:.3f} %  ({s.rows} rows)"]
    return "\n".join(lines)
