"""The log-probabilities along a line of edits: one head pass serves every point of a line.

On a plain RMSNorm tail (no post-FFN norm) the residual is affine in the edit of the last
ffn_down, and the final norm scales g * y by one number per row. For edits sum_p s_p dW_p (the
strength frontier's per-phrase parts, solvers/l47/frontier.py), along a line of strength vectors
s = a + t v, with y_a the residual at a and y_v = hh dW_v^T (dW_v = sum_p v_p dW_p):

    y(t) = y_a + t y_v,   l(t) = c((U_a + t U_v) / r(t)),   U = (g * y) H^T,
    r(t) = sqrt(mean(y(t)^2) + eps),

with H the head and c the softcap. So the logits at every point of the line come from two
products with the head, U_a and U_v, and U_a is kept from the line before whenever the new line
starts at one of its points (the coordinate search's next step starts at its chosen point):
one head pass per step instead of one per point. Each point's log-probabilities are then a
fold over the kept [T, V] products (`span_logp`: float64 sums, one read of them); the head,
dequantized, is kept for the search where it is small (`HeadTiles`). A batch off one line but
moving at most `MAX_SPAN` phrases (the full per-phrase grid of up to three) is a plane the same
way, U = U_a + sum_k c_k U_k, one product per phrase moved; any other batch goes as its longest
runs that are lines or planes, in order.

The values are the same mathematics as the frontier's direct path (`frontier.points`), rounded differently: the
residuals here are float64 (the direct path's are float32), U_a and U_v are float32 products,
and U_a of a later line is the previous line's U_a + t U_v, rounded once per step. Measured
against the direct path: agreeing within `LINE_TOL` nats of log-probability (tests/solvers/l47/
test_line.py), far below the strength search's tie (`frontier.CUT_TIE`, 0.01 in the cut). Every row
is scored (no `moved.RowMemo`: a dense edit moves every row). The products held at once are
at most `LINE_ELEMS` logits, the rows taken in chunks to fit; when U_a fits half of it, it is kept
between batches, else each batch recomputes it (two passes a line).
"""
from __future__ import annotations

import math
from typing import Sequence

import numba
import numpy as np
from numba import prange

__all__ = ["HEAD_KEEP_BYTES", "HeadTiles", "LINE_ELEMS", "LINE_TOL", "LineScorer", "MAX_SPAN", "head_products",
           "line_ready", "plan", "span_logp"]

#: float32 logits held at once for a batch's products (2 GiB); the anchor's is kept between
#: batches when it takes at most half of it
LINE_ELEMS = 1 << 29

#: the line path's log-probabilities against the direct path's, nats (float32 logits of ~|20|
#: rounded in a different order; measured differences ~1e-5)
LINE_TOL = 2e-4


def line_ready(tail) -> bool:
    """Whether the tail's logits are (g * y) H^T over one norm per row: a plain RMSNorm tail, no
    post-FFN norm (a post-norm or the hc4 mix make the residual or the mix nonlinear in t)."""
    return tail.kind == "rmsnorm" and tail.l47.w_post is None


#: a head at most this large (float32) is dequantized once per search and kept (Qwen2.5-1.5B's:
#: 0.93 GB, 0.8 s of dequantizing a pass); a larger one streams, a tile at a time, every pass
HEAD_KEEP_BYTES = 1 << 30


class HeadTiles:
    """The head's rows as float32 tiles of `tile_rows`, dequantized once and kept when the whole
    head takes at most `keep_bytes`, else read again on each pass (never held whole)."""

    def __init__(self, tail, tile_rows: int = 8192, keep_bytes: int = HEAD_KEEP_BYTES):
        self.src, self.step = tail.head, max(1, int(tile_rows))
        self.keep = self.src.rows * self.src.cols * 4 <= keep_bytes
        self._kept: list[np.ndarray] | None = None

    def __iter__(self):
        """(start, stop, float32 [stop - start, n]) over the head's rows."""
        if self._kept is not None:
            yield from self._kept
            return
        kept = [] if self.keep else None
        for start in range(0, self.src.rows, self.step):
            stop = min(start + self.step, self.src.rows)
            tile = (start, stop, self.src.read(start, stop))
            if kept is not None:
                kept.append(tile)
            yield tile
        if kept is not None:
            self._kept = kept


def head_products(head: HeadTiles, X: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """float32 [T, V]: X [T, n] times every head row (`HeadTiles`), into `out` when given."""
    X = np.ascontiguousarray(X, dtype=np.float32)
    out = np.empty((X.shape[0], head.src.rows), np.float32) if out is None else out
    for start, stop, w in head:
        out[:, start:stop] = X @ w.T
    return out


@numba.njit(inline="always")
def _logit(Ua, Us, c, i, j, s, cap):
    """cap((Ua + sum_k c_k Us[k]) [i, j] * s), in float64."""
    x = np.float64(Ua[i, j])
    for k in range(c.size):
        x += c[k] * np.float64(Us[k, i, j])
    x *= s
    if cap > 0.0:
        x = cap * math.tanh(x / cap)
    return x


@numba.njit(parallel=True, cache=True)
def _fold(Ua, Us, c, inv_r, cap, token, lse, sel):
    T, V = Ua.shape
    for i in prange(T):
        s = inv_r[i]
        m, acc = -np.inf, 0.0          # an online logsumexp: one read of the products
        for j in range(V):
            x = _logit(Ua, Us, c, i, j, s, cap)
            if x > m:
                acc = acc * math.exp(m - x) + 1.0
                m = x
            else:
                acc += math.exp(x - m)
        lse[i] = m + math.log(acc)
        sel[i] = _logit(Ua, Us, c, i, token[i], s, cap)


def span_logp(Ua: np.ndarray, Us: np.ndarray, c: np.ndarray, y: np.ndarray, eps: float, softcap: float | None,
              token: np.ndarray) -> np.ndarray:
    """float64 [T]: log p(token) of each row at l = cap((Ua + sum_k c_k Us[k]) / r), r the RMS of
    that row's residual `y` [T, n] (float64, at the same point) with `eps`."""
    inv_r = 1.0 / np.sqrt(np.mean(y * y, axis=1) + eps)
    lse, sel = np.empty(len(token)), np.empty(len(token))
    _fold(Ua, Us, np.asarray(c, np.float64), inv_r, float(softcap or 0.0), np.asarray(token, np.int64), lse, sel)
    return sel - lse


#: at most this many directions in one batch's span (a per-phrase grid of up to 3 phrases)
MAX_SPAN = 3


def plan(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """(directions [k, P], coefficients [B, k]) with diffs == coefficients @ directions: one shared
    direction when the rows lie on a line through the origin, else the strength axes they move
    along when they are at most MAX_SPAN, else None."""
    diffs = np.asarray(diffs, np.float64)
    P = diffs.shape[1]
    if len(diffs) and np.abs(diffs).max() > 0:
        v = diffs[int(np.argmax(np.abs(diffs).max(axis=1)))]
        t = diffs @ v / (v @ v)
        if np.allclose(np.outer(t, v), diffs, rtol=0, atol=1e-12):
            axis = np.flatnonzero(v)
            if axis.size == 1:                  # along one axis: the unit direction
                return np.eye(P)[axis], diffs[:, axis]
            return v[None, :], t[:, None]
    axes = np.flatnonzero(np.abs(diffs).max(axis=0) > 0) if len(diffs) else np.zeros(0, np.int64)
    if len(axes) <= MAX_SPAN:
        return np.eye(P)[axes], diffs[:, axes]
    return None


class LineScorer:
    """The log-probabilities of a frontier's followed tokens `token` [T] on the rows `rows` (R and
    hh: a RowSet) at strength vectors of P edits (see the module doc), a batch at a time:
    `logp(combos)` -> float64 [B, T]. `change(s)` -> float64 [T, n] is the rows' residual change
    hh (sum_p s_p dW_p)^T at strengths s [P] (solvers/l47/frontier.py `line_scorer` makes it from the
    parts, formed or not); the unedited values are `base` (computed on construction); `passes`
    counts the products with the head."""

    def __init__(self, tail, change, P: int, rows, token: np.ndarray, *, tile_rows: int = 8192,
                 max_elems: int = LINE_ELEMS, head: HeadTiles | None = None):
        if not line_ready(tail):
            raise ValueError(f"a line of strengths needs a plain RMSNorm tail, not {tail.kind}"
                             f"{' with a post-FFN norm' if tail.kind == 'rmsnorm' else ''}")
        self.tail, self.change, self.P = tail, change, int(P)
        self.head = HeadTiles(tail, tile_rows) if head is None else head
        self.token = np.asarray(token, np.int64)
        self.hh = np.asarray(rows.hh, np.float64)
        self.y0 = np.asarray(rows.R, np.float64) + self.hh @ np.asarray(tail.l47.w_down, np.float64).T
        self.g = np.asarray(tail.mix_params.w_norm, np.float64)
        self.eps, self.cap = float(tail.mix_params.eps), tail.softcap
        self.V, self.max_elems, self.passes = int(tail.head.rows), int(max_elems), 0
        T = len(self.token)
        self.keep = T * self.V <= self.max_elems // 2     # the anchor's product kept between batches
        self.anchor = np.zeros(self.P)
        self._ya: tuple | None = None
        self.Ua = self._products(self.y0) if self.keep else None
        self.last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None   # (directions, coefficients, U)
        self.base = self.logp([tuple(self.anchor)])[0]

    def _products(self, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        self.passes += 1
        return head_products(self.head, y * self.g, out)

    def _residual(self, s: np.ndarray) -> np.ndarray:
        """y at the strengths `s` (float64 [T, n]), the anchor's kept until the anchor moves."""
        key = tuple(s)
        if self._ya is None or self._ya[0] != key:
            self._ya = (key, self.y0 + self.change(s) if s.any() else self.y0)
        return self._ya[1]

    def _find(self, combos: np.ndarray):
        """(plan, the point of the last batch to move the anchor to or None): the plan from the anchor
        or from the point of the last batch that needs the fewest directions (the anchor on a tie);
        None when neither has one."""
        best, to = plan(combos - self.anchor), None
        if self.last is not None:
            dirs, coef, _ = self.last
            for c in coef:
                found = plan(combos - (self.anchor + c @ dirs))
                if found is not None and (best is None or len(found[0]) < len(best[0])):
                    best, to = found, c
        return None if best is None else (best, to)

    def logp(self, combos: Sequence[Sequence[float]]) -> np.ndarray:
        """float64 [B, T]: the followed tokens' log-probs at each strength vector of `combos`,
        taken in order as the longest runs that have a plan (one combo always has one: a line from
        the anchor), each from the anchor or a point of the run before."""
        combos = np.asarray(combos, np.float64).reshape(-1, self.P)
        out, i = [], 0
        while i < len(combos):
            j = len(combos)
            while j > i + 1 and self._find(combos[i:j]) is None:
                j -= 1
            out.append(self._run(combos[i:j]))
            i = j
        return np.concatenate(out) if out else np.zeros((0, len(self.token)))

    def _run(self, combos: np.ndarray) -> np.ndarray:
        (dirs, coef), to = self._find(combos)
        if to is not None:                 # the anchor moves to a point of the last run: U_a + sum_k c_k U_k
            ldirs, _, U = self.last
            self.anchor = self.anchor + to @ ldirs
            if self.keep:
                for k, ck in enumerate(to):
                    if ck:
                        self.Ua += np.float32(ck) * U[k]
        self.last = None
        ya = self._residual(self.anchor)
        yd = [self.change(d) for d in dirs]
        T, k = len(self.token), len(dirs)
        free = self.max_elems - (T * self.V if self.keep else 0)
        step = max(1, free // (self.V * max(1, k + (0 if self.keep else 1))))
        out = np.empty((len(combos), T))
        U = None
        for r0 in range(0, T, step):
            rows = slice(r0, min(r0 + step, T))
            Ua = self.Ua[rows] if self.keep else self._products(ya[rows])
            U = np.empty((k,) + Ua.shape, np.float32)
            for kk, y in enumerate(yd):
                self._products(y[rows], U[kk])
            for b, c in enumerate(coef):
                y = ya[rows] + sum((ck * yk[rows] for ck, yk in zip(c, yd)), np.zeros_like(ya[rows]))
                out[b, rows] = span_logp(Ua, U, c, y, self.eps, self.cap, self.token[rows])
        if self.keep and step >= T and k:
            self.last = (dirs, coef, U)
        return out
