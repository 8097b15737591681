"""KL divergence of an edited model against its base, in llama.cpp's perplexity-tool form.

The per-row KL comes from the tail's KL pass (`solvers.tail.passes.kl_pass.kl_rows`: one streaming pass
over both heads, float64 folds, no full logits kept). Statistics follow llama.cpp's report: mean (with
its standard error), median, percentiles (linear interpolation between order statistics), max,
min, top-1 agreement ("same top"), PPL of both over rows with a known next token, Delta p. These are
the exact statistics; llama-perplexity's own conventions (16-bit base codes, a -16-nat cutoff) are
in `evals.kl.llamacpp`, and `evals.kl.compare` chooses between them (docs/kld.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
import numpy as np

from exactedit.solvers.tail.passes.kl_pass import KlRows


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


def render_kld_stats(s: KldStats) -> list[str]:
    """The statistics lines of the exact report (llama.cpp's order and labels)."""
    pct = lambda x: f"{100 * x:8.3f} %"  # noqa: E731
    return ["====== Perplexity statistics ======",
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
