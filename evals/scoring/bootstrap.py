"""Bootstrap confidence intervals over documents (never over rows: rows of one document are not
independent). A statistic is written as a function of per-document weights: resample b gives each
document the number of times it was drawn, so a mean over rows becomes (w @ sums) / (w @ counts).
Strata (e.g. train documents and test documents of a gain ratio) are resampled separately."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np


def per_doc(values: np.ndarray, mask: np.ndarray, doc: np.ndarray, n_docs: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-document sum of `values` over rows in `mask`, and the row count."""
    m = np.asarray(mask, dtype=bool)
    sums = np.bincount(doc[m], weights=np.asarray(values, dtype=np.float64)[m], minlength=n_docs)
    counts = np.bincount(doc[m], minlength=n_docs).astype(np.float64)
    return sums, counts


def resample_weights(strata: Sequence[np.ndarray], n_docs: int, n_boot: int, seed: int) -> np.ndarray:
    """[n_boot, n_docs] draw counts: within each stratum (an array of document indices), as many
    documents drawn with replacement as the stratum holds; documents outside every stratum get 0."""
    rng = np.random.default_rng(seed)
    w = np.zeros((n_boot, n_docs))
    for s in strata:
        s = np.asarray(s, dtype=np.int64)
        if len(s):
            w[:, s] += rng.multinomial(len(s), np.full(len(s), 1.0 / len(s)), size=n_boot)
    return w


def interval(stat: Callable[[np.ndarray], np.ndarray], strata: Sequence[np.ndarray], n_docs: int,
             n_boot: int, level: float, seed: int) -> tuple[float, float]:
    """Percentile interval of `stat(weights)` (weights [B, n_docs] -> [B]); NaN resamples (an empty
    denominator) are dropped. (nan, nan) when n_boot is 0 or fewer than two documents carry data."""
    if n_boot <= 0 or sum(len(s) for s in strata) < 2:
        return (float("nan"), float("nan"))
    vals = np.asarray(stat(resample_weights(strata, n_docs, n_boot, seed)), dtype=np.float64)
    vals = vals[np.isfinite(vals)]
    if not len(vals):
        return (float("nan"), float("nan"))
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(vals, [a, 1.0 - a])
    return (float(lo), float(hi))


def ratio(num: np.ndarray, den: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """stat(w) = (w @ num) / (w @ den): a mean over rows when num are sums and den counts."""
    def stat(w):
        with np.errstate(divide="ignore", invalid="ignore"):
            return (w @ num) / (w @ den)
    return stat
