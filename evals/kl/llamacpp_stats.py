"""The report of llama.cpp's `llama-perplexity --kl-divergence`, from its per-row values
(`evals.kl.llamacpp.LpRows`), with the tool's formulas and float types, and printed with its
format strings, so that the text can be compared with the tool's line by line.

Formulas (tools/perplexity/perplexity.cpp): sums in float64 of the per-row float32 values (squares
taken in float32 first, as the C code does); mean_and_uncertainty(s, s2, n) = (s/n,
sqrt((s2/n - (s/n)^2) / (n-1))), the uncertainty 0 unless positive and n > 10; covariance of the
two NLLs (sum_ab/n - (sum_a/n)(sum_b/n)) / (n-1), 0 below 10 rows; PPL = exp(mean NLL), its
uncertainty PPL * that of the mean. Order statistics over the float32 per-row values: median =
f32(0.5 * (v[n/2] + v[n/2-1])) (n even) else v[n/2]; percentile(f) with p = f32(f) * f32(n-1),
ip = floor(p), result (1 - frac) v[ip] + frac v[ip+1], all float32. Δp = q(next) - p(next);
RMS Δp = sqrt(mean(Δp²)), uncertainty 0.5 / RMS * that of mean(Δp²) (from the sum of Δp⁴).
"Same top p" compares the edited argmax with the first maximal base code. The running table per
chunk uses the same formulas on the rows so far. The tool prints the summary only for >= 100 rows.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass

import numpy as np

from exactedit.evals.kl.llamacpp import LpRows

MIN_ROWS_PRINTED = 100   # the tool prints no summary below this many rows
KLD_LEVELS = (("Maximum", None), ("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900),
              ("Median", "median"), ("10.0%", 0.100), (" 5.0%", 0.050), (" 1.0%", 0.010), (" 0.1%", 0.001),
              ("Minimum", None))
DP_LEVELS = (("Maximum", None), ("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900),
             ("75.0%", 0.750), ("Median", "median"), ("25.0%", 0.250), ("10.0%", 0.100), (" 5.0%", 0.050),
             (" 1.0%", 0.010), (" 0.1%", 0.001), ("Minimum", None))


_NAN = -float("nan")   # x86's default NaN (sign bit set), what sqrt(-x) and 0/0 give in the C code


def _sqrt(x: float) -> float:
    return math.sqrt(x) if x >= 0 else _NAN


def _div(a: float, b: float) -> float:
    if b == 0:
        return _NAN if a == 0 or math.isnan(a) else math.copysign(float("inf"), a) * math.copysign(1.0, b)
    return a / b


def mean_and_uncertainty(s: float, s2: float, n: int) -> tuple[float, float]:
    if n < 1:
        return 0.0, 0.0
    f = s / n
    df = s2 / n - f * f
    return f, (math.sqrt(df / (n - 1)) if df > 0 and n > 10 else 0.0)


def base_ppl(nll) -> tuple[float, float]:
    """The base pass's "Final estimate: PPL = x +/- u" from its per-row float32 NLLs (float64 sums)."""
    v = np.asarray(nll, np.float64)
    n = v.size
    m = float(v.sum()) / n
    m2 = float((v * v).sum()) / n - m * m
    unc = math.sqrt(m2 / (n - 1)) if m2 > 0 and n > 1 else float("nan")
    return math.exp(m), math.exp(m) * unc


def covariance(a: float, b: float, ab: float, n: int) -> float:
    if n < 10:
        return 0.0
    return (ab / n - (a / n) * (b / n)) / (n - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> np.float32:
    """The tool's percentile over sorted float32 values, in float32."""
    v, f = sorted_values, np.float32(fraction)
    if f <= 0:
        return v[0]
    if f >= 1:
        return v[-1]
    p = np.float32(f * np.float32(v.size - 1))
    ip = int(p)
    p = np.float32(p - np.float32(ip))
    return np.float32(np.float32(np.float32(1) - p) * v[ip] + np.float32(p * v[min(ip + 1, v.size - 1)]))


def median(sorted_values: np.ndarray) -> np.float32:
    v, n = sorted_values, sorted_values.size
    return np.float32(np.float32(0.5) * np.float32(v[n // 2] + v[n // 2 - 1])) if n % 2 == 0 else v[n // 2]


@dataclass(frozen=True)
class _Sums:
    count: int
    nll: float
    nll2: float
    nll_base: float
    nll_base2: float
    nll_nll_base: float
    kld: float
    kld2: float
    p_diff: float
    p_diff2: float
    p_diff4: float
    same_top: int

    @classmethod
    def of(cls, r: LpRows, stop: int | None = None) -> _Sums:
        sl = slice(0, stop)
        f64 = lambda x: np.asarray(x[sl], np.float64)  # noqa: E731
        nll, nllb, pd, kl = f64(r.nll), f64(r.nll_base), r.p_diff[sl], f64(r.kld)
        pd2 = (pd * pd).astype(np.float32).astype(np.float64)
        return cls(int(kl.size), float(nll.sum()), float(f64((r.nll * r.nll).astype(np.float32)).sum()),
                   float(nllb.sum()), float(f64((r.nll_base * r.nll_base).astype(np.float32)).sum()),
                   float(f64((r.nll * r.nll_base).astype(np.float32)).sum()), float(kl.sum()),
                   float((kl * kl).sum()), float(pd.astype(np.float64).sum()), float(pd2.sum()),
                   float((pd2 * pd2).sum()), int(np.count_nonzero(r.argmax[sl] == r.argmax_base[sl])))


@dataclass(frozen=True)
class ChunkLine:
    """One line of the tool's running table (statistics over the rows up to this chunk)."""

    chunk: int
    ppl: float
    ppl_unc: float
    ln_ratio: float
    ln_ratio_unc: float
    kld: float
    kld_unc: float
    rms_dp: float
    rms_dp_unc: float
    same_top: float
    same_top_unc: float


@dataclass(frozen=True)
class LlamacppStats:
    """Every number of the tool's report (its `====== ... ======` sections and the chunk table)."""

    rows: int
    ppl: float
    ppl_unc: float
    ppl_base: float
    ppl_base_unc: float
    cor: float                     # correlation of ln PPL(Q) and ln PPL(base), a fraction
    ln_ratio: float
    ln_ratio_unc: float
    ppl_ratio: float
    ppl_ratio_unc: float
    ppl_diff: float
    ppl_diff_unc: float
    kld_mean: float
    kld_unc: float
    kld: dict                      # label -> float32 order statistic (as printed, in the tool's order)
    dp_mean: float
    dp_unc: float
    dp: dict
    rms_dp: float
    rms_dp_unc: float
    same_top: float
    same_top_unc: float
    chunks: tuple[ChunkLine, ...]

    def to_dict(self) -> dict:
        return asdict(self)


def _running(s: _Sums) -> tuple:
    lp = mean_and_uncertainty(s.nll, s.nll2, s.count)
    lb = mean_and_uncertainty(s.nll_base, s.nll_base2, s.count)
    cov = covariance(s.nll, s.nll_base, s.nll_nll_base, s.count)
    ratio = (lp[0] - lb[0], _sqrt(lp[1] ** 2 + lb[1] ** 2 - 2 * cov))
    mse = mean_and_uncertainty(s.p_diff2, s.p_diff4, s.count)
    rms = math.sqrt(mse[0])
    top = s.same_top / s.count
    top_unc = _sqrt(_div(top * (1 - top), s.count - 1))
    return lp, lb, cov, ratio, (rms, _div(0.5, rms) * mse[1]), (top, top_unc)


def _levels(sorted_values: np.ndarray, levels) -> dict:
    out = {}
    for label, f in levels:
        if label == "Maximum":
            out[label] = float(sorted_values[-1])
        elif label == "Minimum":
            out[label] = float(sorted_values[0])
        elif f == "median":
            out[label] = float(median(sorted_values))
        else:
            out[label] = float(percentile(sorted_values, f))
    return out


def lp_stats(r: LpRows, chunk_rows: tuple[int, ...] = ()) -> LlamacppStats:
    """The report over all rows of `r`; `chunk_rows` (rows per chunk, in order) gives the table."""
    n = int(r.kld.size)
    if n == 0:
        raise ValueError("no rows to summarize")
    if chunk_rows and sum(chunk_rows) != n:
        raise ValueError(f"chunk rows {chunk_rows} do not sum to the {n} rows")
    s = _Sums.of(r)
    lp, lb, cov, ratio, rms, top = _running(s)
    ppl, ppl_b = math.exp(lp[0]), math.exp(lb[0])
    ppl_unc, ppl_b_unc = ppl * lp[1], ppl_b * lb[1]
    kl = mean_and_uncertainty(s.kld, s.kld2, n)
    dp = mean_and_uncertainty(s.p_diff, s.p_diff2, n)
    lines, stop = [], 0
    for i, c in enumerate(chunk_rows):
        stop += c
        cs = _Sums.of(r, stop)
        clp, _, _, crat, crms, ctop = _running(cs)
        ckl = mean_and_uncertainty(cs.kld, cs.kld2, cs.count)
        lines.append(ChunkLine(i + 1, math.exp(clp[0]), math.exp(clp[0]) * clp[1], *crat, *ckl, *crms, *ctop))
    kld_sorted = np.sort(r.kld.astype(np.float32))
    dp_sorted = np.sort(np.asarray(r.p_diff, np.float32))
    return LlamacppStats(
        rows=n, ppl=ppl, ppl_unc=ppl_unc, ppl_base=ppl_b, ppl_base_unc=ppl_b_unc,
        cor=_div(cov, lp[1] * lb[1]), ln_ratio=ratio[0], ln_ratio_unc=ratio[1],
        ppl_ratio=math.exp(ratio[0]), ppl_ratio_unc=math.exp(ratio[0]) * ratio[1],
        ppl_diff=ppl - ppl_b, ppl_diff_unc=_sqrt(ppl_unc ** 2 + ppl_b_unc ** 2 - 2 * ppl * ppl_b * cov),
        kld_mean=kl[0], kld_unc=kl[1], kld=_levels(kld_sorted, KLD_LEVELS),
        dp_mean=dp[0], dp_unc=dp[1], dp=_levels(dp_sorted, DP_LEVELS),
        rms_dp=rms[0], rms_dp_unc=rms[1], same_top=top[0], same_top_unc=top[1], chunks=tuple(lines))


_SPEC = re.compile(r"%%|%(\d*)(\.\d+)?([fd])")


def _c(fmt: str, *values) -> str:
    """C printf formatting: Python's % rounds the binary value exactly as glibc does; a NaN is
    printed as glibc prints it ("-nan" with the sign bit set), right-aligned in its field."""
    out, i, k = [], 0, 0
    for m in _SPEC.finditer(fmt):
        out.append(fmt[i:m.start()])
        i = m.end()
        if m.group(0) == "%%":
            out.append("%")
            continue
        v, k = values[k], k + 1
        if isinstance(v, float) and math.isnan(v):
            out.append(("-nan" if math.copysign(1.0, v) < 0 else "nan").rjust(int(m.group(1) or 0)))
        else:
            out.append(m.group(0) % v)
    return "".join(out) + fmt[i:]


def render_chunk_table(s: LlamacppStats) -> list[str]:
    """The tool's running table, its header and one line per chunk."""
    out = ["chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence              "
           "Δp RMS            Same top p"]
    for c in s.chunks:
        out.append(_c("%4d", c.chunk) + _c("    %9.4f ± %9.4f", c.ppl, c.ppl_unc)
                   + _c("    %10.5f ± %10.5f", c.ln_ratio, c.ln_ratio_unc)
                   + _c("    %10.5f ± %10.5f", c.kld, c.kld_unc)
                   + _c("    %6.3f ± %6.3f %%", 100 * c.rms_dp, 100 * c.rms_dp_unc)
                   + _c("    %6.3f ± %6.3f %%", 100 * c.same_top, 100 * c.same_top_unc))
    return out


def render_lp_report(s: LlamacppStats) -> list[str]:
    """The tool's summary sections, line for line as it prints them."""
    out = ["====== Perplexity statistics ======",
           _c("Mean PPL(Q)                   : %10.6f ± %10.6f", s.ppl, s.ppl_unc),
           _c("Mean PPL(base)                : %10.6f ± %10.6f", s.ppl_base, s.ppl_base_unc),
           _c("Cor(ln(PPL(Q)), ln(PPL(base))): %6.2f%%", 100 * s.cor),
           _c("Mean ln(PPL(Q)/PPL(base))     : %10.6f ± %10.6f", s.ln_ratio, s.ln_ratio_unc),
           _c("Mean PPL(Q)/PPL(base)         : %10.6f ± %10.6f", s.ppl_ratio, s.ppl_ratio_unc),
           _c("Mean PPL(Q)-PPL(base)         : %10.6f ± %10.6f", s.ppl_diff, s.ppl_diff_unc),
           "",
           "====== KL divergence statistics ======",
           _c("Mean    KLD: %10.6f ± %10.6f", s.kld_mean, s.kld_unc)]
    out += [_c(f"{label:<7s}".replace("%", "%%") + " KLD: %10.6f", v) for label, v in s.kld.items()]
    out += ["", "====== Token probability statistics ======",
            _c("Mean    Δp: %6.3f ± %5.3f %%", 100 * s.dp_mean, 100 * s.dp_unc)]
    out += [_c(f"{label:<7s}".replace("%", "%%") + " Δp: %6.3f%%", 100 * v) for label, v in s.dp.items()]
    out += [_c("RMS Δp    : %6.3f ± %5.3f %%", 100 * s.rms_dp, 100 * s.rms_dp_unc),
            _c("Same top p: %6.3f ± %5.3f %%", 100 * s.same_top, 100 * s.same_top_unc)]
    return out
