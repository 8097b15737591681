"""How far an edit of the last FFN's down projection can move a row's logits, bounded without the
vocabulary pass: the rows an edit cannot move are scored at their base values, exactly within a
stated tolerance, and only the others go through the full head.

For an rmsnorm tail the residual is y = R + W hh (W the down projection [n, h], hh the FFN's hidden
state); the edit dW moves it by delta = dW hh. The final norm f(y) = y / sqrt(|y|^2 / n + eps) has a
Jacobian of spectral norm at most 1 / sqrt(|y|^2 / n + eps) <= sqrt(n) / |y|, so along the segment
from y to y + delta (where every point has norm >= |y| - |delta|)
    |f(y + delta) - f(y)| <= sqrt(n) |delta| / (|y| - |delta|)      (|delta| < |y|).
The logits are z_v = (H_v * w) . f(y) (w the norm's weight, H_v the head's row v), so
    max_v |dz_v| <= max_v |H_v * w| . |df| =: B,
and a softcap c tanh(z / c) is 1-Lipschitz, so B holds after it. Every token's log-prob then moves
by at most 2B (its logit and the log-sum-exp each by at most B), and KL(p || p') <= B^2 / 2: with
d = z' - z in [-B, B], KL(p || p') = -E_p[d] + log E_p[e^d] <= (2B)^2 / 8 by Hoeffding's lemma.
With a post-FFN norm (Gemma 3: y = R + w_post * g(F), F = W hh, g the same norm) the FFN's output
moves by |dF| = |dW hh| and the residual by at most max|w_post| sqrt(n) |dF| / (|F| - |dF|), which
then goes through the final norm as above.

`logit_bound` returns B per row (inf where the segment argument does not hold, or for the hc4 tail,
whose mix is not bounded here); `head_norm(tail)` is max_v |H_v * w|, one streamed pass over the
head, kept per head.
"""
from __future__ import annotations

import numpy as np

__all__ = ["MAX_COLUMNS", "MOVE_TOL", "RowMemo", "head_norm", "logit_bound"]

#: a row whose log-probs the edit provably moves by at most this many nats is taken at its base
#: values: a float32 logit of magnitude 8 to 16 is itself rounded to 1e-6 to 2e-6, so the full
#: pass cannot resolve a smaller change either
MOVE_TOL = 1e-6

#: an edit of more down columns than this is not bounded (every row taken as moved): a dense edit
#: moves every row, and its bound would cost another residual product per point for nothing
MAX_COLUMNS = 256

_HEAD_NORMS: dict = {}


def head_norm(tail, tile_rows: int = 8192) -> float:
    """max over the head's rows v of |H_v * w| (w: the final norm's weight), float64, one streamed
    pass over the head (kept per head and weight)."""
    w = np.asarray(tail.mix_params.w_norm, np.float64).reshape(-1)
    key = (id(tail.head), id(tail.mix_params.w_norm))
    hit = _HEAD_NORMS.get(key)
    if hit is not None and hit[0] is tail.head:
        return hit[1]
    best = 0.0
    V = int(tail.head.rows)
    for start in range(0, V, tile_rows):
        t = np.asarray(tail.head.read(start, min(V, start + tile_rows)), np.float64) * w
        best = max(best, float(np.sqrt(np.max(np.einsum("vn,vn->v", t, t)))))
    _HEAD_NORMS[key] = (tail.head, best)
    return best


def _through_norm(base_norm, shift, n: int) -> np.ndarray:
    """The bound on |g(x + dx) - g(x)| from |x| and |dx| (module doc): inf where |dx| >= |x|."""
    base_norm, shift = np.asarray(base_norm, np.float64), np.asarray(shift, np.float64)
    room = base_norm - shift
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(room > 0, np.sqrt(n) * shift / np.where(room > 0, room, 1.0), np.inf)
    return np.where(shift == 0, 0.0, out)


def logit_bound(tail, rows, dW, *, y=None, tile_rows: int = 8192) -> np.ndarray:
    """float64 [T]: per row of `rows` (R and hh, a dump or a RowSet), a bound on how far the edit
    dW [n, h] of the down projection moves any of its logits (module doc). `y`: the rows' base
    residual [T, n] when the caller has it (else computed). inf for an hc4 tail and for an edit of
    more than `MAX_COLUMNS` columns."""
    T = int(np.asarray(rows.hh).shape[0])
    if getattr(tail, "kind", None) != "rmsnorm":
        return np.full(T, np.inf)
    dW = np.asarray(dW)
    cols = np.flatnonzero(np.any(dW != 0, axis=0))
    if cols.size == 0:
        return np.zeros(T)
    if cols.size > MAX_COLUMNS:
        return np.full(T, np.inf)
    dW = dW.astype(np.float64)
    hh = np.asarray(rows.hh, np.float64)[:, cols]
    shift = np.linalg.norm(hh @ dW[:, cols].T, axis=1)
    n = dW.shape[0]
    if y is None:
        y = tail.residual(rows)
    y_norm = np.linalg.norm(np.asarray(y, np.float64), axis=1)
    w_post = getattr(tail.l47, "w_post", None)
    if w_post is not None:
        F = np.asarray(rows.hh, np.float64) @ np.asarray(tail.l47.w_down, np.float64).T
        shift = float(np.max(np.abs(np.asarray(w_post, np.float64)))) * _through_norm(
            np.linalg.norm(F, axis=1), shift, n)
    return head_norm(tail, tile_rows) * _through_norm(y_norm, shift, n)


class RowMemo:
    """Per-row values of scored edits (log-probs, KLs) on fixed rows, reused for a new edit: from
    the scored edit whose columns differ from it least (the unedited model counts as one, its
    values given), a row keeps that edit's value when the difference provably moves it by less
    than what `tol` leaves (`logit_bound` around that edit's residual), and is computed otherwise.
    Each row carries the bound on how far its value may be from the exact one (0 where computed,
    the sum of the bounds it was carried over), never above `tol`: a strength search that changes
    one phrase's column at a time recomputes only the rows that phrase's unit moves. Values are
    log-probs or KLs: each moves by at most 2B for a logit move of B, and a KL from the base
    (`kl`: the values are KL(base || edited), 0 at the base) is at most B^2 / 2 (module doc): rows an
    edit moves by up to sqrt(2 tol) nats are not scored for the KL bars."""

    def __init__(self, tail, rows, y, base_values, *, keep: int = 4, tol: float = MOVE_TOL,
                 tile_rows: int = 8192, kl: bool = False):
        self.tail, self.rows, self.tol, self.keep, self.tile_rows = tail, rows, float(tol), int(keep), tile_rows
        self.kl = bool(kl)              # values are KL(base || edited): from the base a row moves by B^2 / 2
        self.y = np.asarray(y, np.float64)
        base = np.asarray(base_values, np.float64)
        self.base = (None, base, np.zeros(base.shape[0]))
        self.recent: list = []

    @staticmethod
    def _differ(a: dict, b: dict) -> list[int]:
        """The columns where two sparse edits differ."""
        out = []
        for c in sorted(set(a) | set(b)):
            x, y = a.get(c), b.get(c)
            if x is None or y is None or not np.array_equal(x, y):
                out.append(c)
        return out

    def score(self, dW, compute) -> tuple[np.ndarray, int]:
        """(the values under dW [n, h], the rows computed): `compute(mask)` gives the values of the
        rows in `mask` under dW exactly."""
        dW = np.asarray(dW)
        cols = np.flatnonzero(np.any(dW != 0, axis=0))   # an edit of a few units: a few columns, kept sparse
        new = {int(c): np.asarray(dW[:, c], np.float64) for c in cols} if cols.size <= MAX_COLUMNS else None
        ref, vals, err = self.base
        if new is not None and getattr(self.tail.l47, "w_post", None) is None:
            cost = len(new)
            for entry in self.recent:     # the bound around an edited point reads the base FFN output: no post norm
                c = len(self._differ(new, entry[0]))
                if c < cost:
                    (ref, vals, err), cost = entry, c
        y = self.y
        if ref is None:
            diff = dW
        else:
            diff = np.zeros(dW.shape)
            for c in self._differ(new, ref):
                diff[:, c] = new.get(c, 0.0) - ref.get(c, 0.0)
            if ref:
                cols = sorted(ref)
                y = y + np.asarray(self.rows.hh, np.float64)[:, cols] @ np.stack([ref[c] for c in cols], axis=1).T
        B = logit_bound(self.tail, self.rows, diff, y=y, tile_rows=self.tile_rows)
        err = err + (0.5 * B * B if (self.kl and ref is None) else 2.0 * B)
        move = ~(err <= self.tol)
        vals = vals.copy()
        if move.any():
            vals[move] = compute(move)
            err = np.where(move, 0.0, err)
        if new is not None:
            self.recent = (self.recent + [(new, vals, err)])[-self.keep:]
        return vals, int(move.sum())
