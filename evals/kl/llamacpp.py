"""KL statistics with llama.cpp's `llama-perplexity --kl-divergence` conventions, reproduced to
the printed digit (tools/perplexity/perplexity.cpp, llama.cpp as in llama-cpp-python 0.3.36).

The tool differs from the exact KL (`evals.kl.stats`) in two conventions, both in how it keeps the base:
1. base log-probs are stored per row as 16-bit codes over a window of at most 16 nats below the
   top logit: with M = max logit, m = max(min logit, M - 16), lse = log sum exp(l - M),
   scale = f32(M - m) / 65535, min_log_prob = (m - M) - lse, code_v = round(l_v - m) / scale) for
   l_v > m, else 0 (round half to even, modulo 2^16). The decoded base log-prob is
   scale * code + min_log_prob: a step of up to 16 / 65535 = 2.4e-4 nats, so a KL can be negative;
2. the KL sum skips every token whose decoded base log-prob is <= -16 nats:
   KL = sum_{v: lb_v > -16} e^{lb_v} (lb_v - (l'_v - (M' + lse'))).
The base argmax for "same top" is the first maximal code; the base NLL is decoded from the codes.
All of it in float32 as the C code does (glibc's expf, log in double; sums of exps in double; no
FMA: the tool is built without -mfma), so the per-row numbers are the tool's own, not a model of them.

`encode_base` / `encode_base_ref` (what the tool writes with `--kl-divergence-base`) and
`score_rows` / `score_rows_ref` (what it computes per row with `--kl-divergence`) are fast path
(numba; float32 `math.exp` is libm's expf) and reference (numpy, expf called through ctypes),
equal bit for bit (tests/evals/kl/test_llamacpp.py). `evals.kld_lp_stats` turns the rows into the
tool's report.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
from typing import NamedTuple, Sequence

import numba
import numpy as np
from numba import prange

CUTOFF = np.float32(-16.0)       # base log-probs at or below this are skipped in the KL sum
WINDOW = np.float32(16.0)        # nats below the top logit that the 16-bit codes cover
CODE_STEPS = np.float32(65535.0)
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23: adding it rounds a float32 to an integer (nearest_int)


class BaseRows(NamedTuple):
    """A base model's rows as the tool stores them (what a `--kl-divergence-base` file holds)."""

    scale: np.ndarray         # float32 [T]
    min_log_prob: np.ndarray  # float32 [T]
    codes: np.ndarray         # uint16 [T, V]

    def decoded(self) -> np.ndarray:
        """float32 [T, V]: the base log-probs the tool reads back (scale * code + min_log_prob)."""
        return (self.scale[:, None] * self.codes.astype(np.float32) + self.min_log_prob[:, None]).astype(np.float32)


class LpRows(NamedTuple):
    """Per-row values of the tool's KL pass (T rows)."""

    kld: np.ndarray           # float64 [T]: the row's KL as summed (its float32 copy is what is sorted)
    nll: np.ndarray           # float32 [T]: -log q(next), edited model
    nll_base: np.ndarray      # float32 [T]: -log p(next), decoded from the base codes
    p_diff: np.ndarray        # float32 [T]: q(next) - p(next)
    argmax: np.ndarray        # int64 [T]: edited argmax (first maximum)
    argmax_base: np.ndarray   # int64 [T]: first maximal base code


def concat_rows(parts: Sequence[LpRows]) -> LpRows:
    return LpRows(*(np.concatenate([getattr(p, f) for p in parts]) for f in LpRows._fields))


def _check(logits: np.ndarray, next_ids, V: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    lg = np.ascontiguousarray(logits, dtype=np.float32)
    if lg.ndim != 2 or lg.shape[1] < 1:
        raise ValueError(f"expected logits [T, V], got {lg.shape}")
    if V is not None and lg.shape[1] != V:
        raise ValueError(f"logits have {lg.shape[1]} columns, the base rows {V}")
    nxt = np.ascontiguousarray(next_ids, dtype=np.int64)
    if nxt.shape != (lg.shape[0],) or (nxt.size and (nxt.min() < 0 or nxt.max() >= lg.shape[1])):
        raise ValueError(f"next ids must be [{lg.shape[0]}] in [0, {lg.shape[1]}): the tool scores only "
                         f"rows with a known next token")
    return lg, nxt


# ---- the base side: log-probs -> 16-bit codes (`--kl-divergence-base`) -----------------------------
_libm = None


def _expf(x: np.ndarray) -> np.ndarray:
    """libm's expf element by element (numpy's float32 exp is a different approximation)."""
    global _libm
    if _libm is None:
        _libm = ctypes.CDLL(ctypes.util.find_library("m"))
        _libm.expf.restype, _libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    flat = np.asarray(x, np.float32).reshape(-1)
    return np.array([_libm.expf(float(v)) for v in flat], np.float32).reshape(np.shape(x))


def _seq_sum(x: np.ndarray) -> float:
    """float64 sum in index order (the C loop's order)."""
    return float(np.cumsum(np.asarray(x, np.float64))[-1])


def encode_base_ref(logits, next_ids) -> tuple[BaseRows, np.ndarray]:
    """Reference: (BaseRows, float32 nll [T] of the next token) as the tool's base pass computes them."""
    lg, nxt = _check(logits, next_ids)
    T, V = lg.shape
    scale, mlp = np.zeros(T, np.float32), np.zeros(T, np.float32)
    codes, nll = np.zeros((T, V), np.uint16), np.zeros(T, np.float32)
    f32 = np.float32
    for t in range(T):
        row = lg[t]
        mx, mn = row.max(), row.min()
        mn = max(mn, f32(mx - WINDOW))
        lse = f32(math.log(_seq_sum(_expf(row - mx))))
        mlp[t] = f32(f32(mn - mx) - lse)
        scale[t] = f32(f32(mx - mn) / CODE_STEPS)
        if scale[t] != 0:
            inv = f32(f32(1) / scale[t])
            val = (inv * (row - mn)).astype(np.float32) + _MAGIC
            c = ((val.astype(np.int64) - int(_MAGIC)) & 0xFFFF).astype(np.uint16)
            codes[t] = np.where(row > mn, c, 0)
        nll[t] = f32(f32(mx + lse) - row[nxt[t]])
    return BaseRows(scale, mlp, codes), nll


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _encode_kernel(lg, nxt, scale, mlp, codes, nll):
    T, V = lg.shape
    for t in prange(T):
        mx = lg[t, 0]
        mn = lg[t, 0]
        for i in range(1, V):
            v = lg[t, i]
            if mx < v:
                mx = v
            if v < mn:
                mn = v
        lo = mx - np.float32(16.0)
        if mn < lo:
            mn = lo
        s = 0.0
        for i in range(V):
            s += math.exp(lg[t, i] - mx)
        lse = np.float32(math.log(s))
        mlp[t] = (mn - mx) - lse
        sc = (mx - mn) / np.float32(65535.0)
        scale[t] = sc
        if sc != 0:
            inv = np.float32(1.0) / sc
            for i in range(V):
                if lg[t, i] > mn:
                    val = inv * (lg[t, i] - mn) + np.float32(12582912.0)
                    codes[t, i] = np.uint16((np.int64(val) - 12582912) & 0xFFFF)
                else:
                    codes[t, i] = 0
        else:
            for i in range(V):
                codes[t, i] = 0
        nll[t] = (mx + lse) - lg[t, nxt[t]]


def encode_base(logits, next_ids) -> tuple[BaseRows, np.ndarray]:
    """Fast path of `encode_base_ref` (numba, rows in parallel); identical results."""
    lg, nxt = _check(logits, next_ids)
    T, V = lg.shape
    scale, mlp = np.empty(T, np.float32), np.empty(T, np.float32)
    codes, nll = np.empty((T, V), np.uint16), np.empty(T, np.float32)
    _encode_kernel(lg, nxt, scale, mlp, codes, nll)
    return BaseRows(scale, mlp, codes), nll


# ---- the edited side: one row of the KL pass (`--kl-divergence`) ---------------------------------
def score_rows_ref(logits, base: BaseRows, next_ids) -> LpRows:
    """Reference: the tool's per-row KL pass of edited `logits` [T, V] against the base codes."""
    lg, nxt = _check(logits, next_ids, base.codes.shape[1])
    T = lg.shape[0]
    f32 = np.float32
    out = {k: np.zeros(T, d) for k, d in (("kld", np.float64), ("nll", np.float32), ("nll_base", np.float32),
                                          ("p_diff", np.float32), ("argmax", np.int64), ("argmax_base", np.int64))}
    for t in range(T):
        row, sc, mlp, code = lg[t], base.scale[t], base.min_log_prob[t], base.codes[t]
        mx = row.max()
        lse = f32(math.log(_seq_sum(_expf(row - mx))))
        nll = f32(f32(mx + lse) - row[nxt[t]])
        nll_b = f32(-f32(f32(sc * f32(code[nxt[t]])) + mlp))
        top = f32(mx + lse)
        plb = (f32(sc) * code.astype(np.float32) + f32(mlp)).astype(np.float32)
        keep = plb > CUTOFF
        terms = (_expf(plb[keep]) * ((plb[keep] - row[keep]).astype(np.float32) + top)).astype(np.float32)
        out["kld"][t] = _seq_sum(terms) if terms.size else 0.0
        out["nll"][t], out["nll_base"][t] = nll, nll_b
        out["p_diff"][t] = f32(_expf(np.float32(-nll)) - _expf(np.float32(-nll_b)))
        out["argmax"][t], out["argmax_base"][t] = int(np.argmax(row)), int(np.argmax(plb))
    return LpRows(**out)


@numba.njit(parallel=True, error_model="numpy", cache=True)
def _score_kernel(lg, nxt, scale, mlp, codes, kld, nll, nll_b, p_diff, arg, arg_b):
    T, V = lg.shape
    for t in prange(T):
        mx = lg[t, 0]
        im = 0
        for i in range(1, V):
            if lg[t, i] > mx:
                mx = lg[t, i]
                im = i
        s = 0.0
        for i in range(V):
            s += math.exp(lg[t, i] - mx)
        lse = np.float32(math.log(s))
        sc, lo, tok = scale[t], mlp[t], nxt[t]
        row_nll = (mx + lse) - lg[t, tok]
        row_nll_b = -(sc * np.float32(codes[t, tok]) + lo)
        top = mx + lse
        acc = 0.0
        ib = 0
        best = np.float32(0.0)
        for i in range(V):
            plb = sc * np.float32(codes[t, i]) + lo
            if i == 0 or plb > best:
                best = plb
                ib = i
            if plb > np.float32(-16.0):
                acc += math.exp(plb) * ((plb - lg[t, i]) + top)
        kld[t] = acc
        nll[t] = row_nll
        nll_b[t] = row_nll_b
        p_diff[t] = math.exp(-row_nll) - math.exp(-row_nll_b)
        arg[t] = im
        arg_b[t] = ib


def score_rows(logits, base: BaseRows, next_ids) -> LpRows:
    """Fast path of `score_rows_ref` (numba, rows in parallel); identical results."""
    lg, nxt = _check(logits, next_ids, base.codes.shape[1])
    T = lg.shape[0]
    if base.codes.shape[0] != T:
        raise ValueError(f"{T} logits rows, {base.codes.shape[0]} base rows")
    out = [np.empty(T, d) for d in (np.float64, np.float32, np.float32, np.float32, np.int64, np.int64)]
    _score_kernel(lg, nxt, np.ascontiguousarray(base.scale, np.float32),
                  np.ascontiguousarray(base.min_log_prob, np.float32),
                  np.ascontiguousarray(base.codes, np.uint16), *out)
    return LpRows(*out)
