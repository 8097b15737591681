"""The gate: a hyperplane of the FFN input x that puts the phrase's prefix positions (positives:
the slop context rows of the train split) on one side and every other row (corpus, plausible,
held, anchors) on the other.

`fit_gate` minimizes, over w = g (through the origin) or (g, b) (affine, x given a constant column),

    L(w) = mean_pos max(0, m - s_t)^2 + mean_neg max(0, m + s_t)^2 + lam * q * |g|^2,
    s_t = g.x_t (+ b),  q = mean_{t,i} x_ti^2 (the mean square entry),

a class-balanced squared hinge: scores >= +m on positives and <= -m on negatives, and of the g that
reach them the shortest (an SVM's hard margin as lam -> 0). L is strictly convex and piecewise
quadratic (one quadratic per set of rows inside their margin), so its minimizer is unique and a
finite Newton method reaches it (Keerthi & DeCoste's L2-SVM-MFN, `_newton`): from w = 0, the Newton
step of the current piece (only the rows inside their margin enter the Hessian), then the exact
minimum of L along it (L restricted to a line is piecewise quadratic: its derivative's root among
the rows' breakpoints, `_line_min`), until the gradient is zero to `gtol`; deterministic. On Qwen's
21-phrase run L-BFGS needed up to its 5,000 iterations per phrase (about 2.5 min each on 13,600 to
17,000 rows of 1,536); Newton ends in tens of steps. `gate_loss` is L and its analytic gradient (the
tests' reference). q makes lam scale-free (x scaled by c gives g / c and the same scores) and, on
isotropic rows, the ridge lam * m^2 whatever the width n (a direction of std sigma needs
|g| ~ m / sigma); the bias is not penalized. Only a gate through
the origin can be built into a unit (the FFN has no bias); the affine fit is the yardstick: how much
separation the missing bias costs. Scores are in margin units (m = config.margin): compare gates
fitted with the same config.

`oof_margins` scores every row with a gate fitted without its document (group k-fold, the groups
holding positives dealt round-robin first, so every training split has positives): the
out-of-fold least positive score against the largest negative one, the gap, and the AUC.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import rankdata

from exactedit.solvers.l47.gated.config import GateConfig, GatedError, as_labels, as_rows

__all__ = ["Gate", "OofMargins", "Separation", "auc", "fit_gate", "gate_loss", "group_folds", "oof_margins",
           "separation"]


def gate_loss(w, x, y, *, margin: float, ridge: float, bias: bool = False) -> tuple[float, np.ndarray]:
    """(L(w), dL/dw) as above on rows x [T, k] (with `bias`, x's last column is the constant one and
    w's last entry goes unpenalized); ridge = lam * q."""
    w = np.asarray(w, dtype=np.float64)
    s = x @ w
    pos = np.asarray(y, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    hinge = np.where(pos, np.maximum(0.0, margin - s), np.maximum(0.0, margin + s))
    weight = np.where(pos, 1.0 / n_pos, 1.0 / n_neg)
    wp = w[:-1] if bias else w
    loss = float(np.sum(weight * hinge**2) + ridge * wp @ wp)
    ds = 2.0 * weight * hinge * np.where(pos, -1.0, 1.0)
    grad = x.T @ ds
    grad[: wp.size] += 2.0 * ridge * wp
    return loss, grad


def auc(scores, y) -> float:
    """P(score of a positive > score of a negative), ties counting half (Mann-Whitney)."""
    s, pos = np.asarray(scores, dtype=np.float64), np.asarray(y, dtype=bool)
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    r = rankdata(s)
    return float((r[pos].sum() - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


@dataclass(frozen=True)
class Separation:
    """How scores split the rows: the positives' least score and 10th percentile, the negatives'
    largest and 99th percentile, the gap (least positive - largest negative: > 0 iff the scores
    separate), the AUC, the share of negatives scoring above 0 and above the positives' 10th
    percentile."""

    pos_min: float
    pos_p10: float
    neg_max: float
    neg_p99: float
    gap: float
    auc: float
    neg_above_zero: float
    neg_above_pos_p10: float
    n_pos: int
    n_neg: int

    @property
    def separated(self) -> bool:
        """Positives above 0 > negatives: what a unit through the origin needs."""
        return self.pos_min > 0.0 > self.neg_max

    def summary(self) -> dict:
        return {**self.__dict__, "separated": self.separated}


def separation(scores, y) -> Separation:
    s, pos = np.asarray(scores, dtype=np.float64), np.asarray(y, dtype=bool)
    sp, sn = s[pos], s[~pos]
    p10 = float(np.percentile(sp, 10))
    return Separation(float(sp.min()), p10, float(sn.max()), float(np.percentile(sn, 99)), float(sp.min() - sn.max()),
                      auc(s, pos), float(np.mean(sn > 0)), float(np.mean(sn >= p10)), int(sp.size), int(sn.size))


@dataclass(frozen=True, eq=False)
class Gate:
    """A fitted gate: scores x @ g + bias (bias 0.0 through the origin), its separation on the rows
    it was fitted on (`fit`), and the solve's record."""

    g: np.ndarray                # float64 [n]
    bias: float
    affine: bool
    config: GateConfig
    fit: Separation
    loss: float
    n_iter: int
    converged: bool
    message: str

    @property
    def margin_pos_min(self) -> float:
        return self.fit.pos_min

    @property
    def margin_neg_max(self) -> float:
        return self.fit.neg_max

    @property
    def auc(self) -> float:
        return self.fit.auc

    @property
    def norm(self) -> float:
        return float(np.linalg.norm(self.g))

    def scores(self, x) -> np.ndarray:
        x = as_rows(x)
        if x.shape[1] != self.g.size:
            raise GatedError("x", "shape", f"expected rows of {self.g.size} values, got {x.shape[1]}")
        return x @ self.g + self.bias

    def summary(self) -> dict:
        return {"affine": self.affine, "bias": self.bias, "norm": self.norm, "loss": self.loss, "n_iter": self.n_iter,
                "converged": self.converged, "message": self.message, "config": self.config.summary(),
                "fit": self.fit.summary()}


def fit_gate(x, y, config: GateConfig = GateConfig(), *, affine: bool = False) -> Gate:
    """The gate of rows x [T, n] (float) labelled y (bool [T], True on the positives)."""
    x = as_rows(x)
    pos = as_labels(y, x.shape[0])
    q = float(np.mean(np.einsum("tn,tn->t", x, x))) / x.shape[1]
    if not q > 0:
        raise GatedError("x", "values", "every row is zero: no gate through the origin can separate them")
    c = np.sqrt(q * x.shape[1])             # the constant column: the rows' RMS norm
    xa = np.hstack([x, np.full((x.shape[0], 1), c)]) if affine else x
    ridge = np.full(xa.shape[1], config.lam * q)
    if affine:
        ridge[-1] = 0.0                       # the bias goes unpenalized
    w, loss, n_iter, converged, message = _newton(xa, pos, config.margin, ridge, config.maxiter, config.gtol)
    g, b = (w[:-1].copy(), float(w[-1] * c)) if affine else (w, 0.0)
    return Gate(g, b, affine, config, separation(x @ g + b, pos), loss, n_iter, converged, message)


def _newton(x, pos, margin: float, ridge: np.ndarray, maxiter: int, gtol: float):
    """(w, L(w), iterations, converged, message): L of the module doc (ridge per entry of w) minimized
    by the finite Newton method from w = 0. Each step solves the Hessian of the current piece,
    2 (X_A^T diag(weight_A) X_A + diag(ridge)), X_A the rows inside their margin, and moves to the
    exact minimum of L along the step. X_A^T W X_A is updated by the rows that entered or left the
    margin since the last step when they are fewer than half the active ones (the gradient is always
    computed afresh, so the update's rounding only changes a step, not where it stops)."""
    import scipy.linalg as sla

    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    weight = np.where(pos, 1.0 / n_pos, 1.0 / n_neg)
    sign = np.where(pos, -1.0, 1.0)               # d(hinge argument)/d(score)
    w = np.zeros(x.shape[1])
    s = np.zeros(x.shape[0])
    loss = grad_max = np.inf
    prev, base = None, None                       # the last step's active rows and their X^T W X
    for it in range(1, maxiter + 1):
        r = margin + sign * s                     # the hinge argument: > 0 inside the margin
        act = r > 0
        xa, wr = x[act], weight[act] * r[act] * sign[act]
        grad = 2.0 * (xa.T @ wr + ridge * w)
        loss = float(np.sum(weight[act] * r[act] ** 2) + ridge @ (w * w))
        grad_max = float(np.max(np.abs(grad)))
        if grad_max <= gtol:
            return w, loss, it - 1, True, f"Newton: |gradient| {grad_max:.3g} <= gtol"
        changed = act != prev if prev is not None else None
        if changed is None or 2 * int(changed.sum()) >= int(act.sum()):
            base = (xa.T * weight[act]) @ xa          # X_A^T diag(weight) X_A afresh
        else:                                     # the rows that entered or left the margin only
            xc = x[changed]
            base = base + (xc.T * (weight[changed] * np.where(act[changed], 1.0, -1.0))) @ xc
        prev = act
        hess = base.copy()
        hess[np.diag_indices_from(hess)] += ridge
        try:
            d = -sla.cho_solve(sla.cho_factor(hess), grad / 2.0)
        except np.linalg.LinAlgError:
            d = -np.linalg.lstsq(hess, grad / 2.0, rcond=None)[0]
        xd = x @ d
        t = _line_min(r, sign * xd, weight, float(ridge @ (w * d)), float(ridge @ (d * d)))
        if not t > 0:
            return w, loss, it - 1, False, f"Newton: no descent along the step (|gradient| {grad_max:.3g})"
        w_new, s_new = w + t * d, s + t * xd
        if np.array_equal(w_new, w):              # the step is below float64's resolution of w: at the minimum
            return w, loss, it, True, f"Newton: the step vanished at |gradient| {grad_max:.3g}"
        w, s = w_new, s_new
    r = margin + sign * s
    act = r > 0
    loss = float(np.sum(weight[act] * r[act] ** 2) + ridge @ (w * w))
    return w, loss, maxiter, False, f"Newton: {maxiter} iterations"


def _line_min(r, c, weight, wd: float, dd: float) -> float:
    """The t > 0 minimizing phi(t) = sum_i weight_i max(0, r_i + t c_i)^2 + (ridge-weighted) |w + t d|^2,
    given r (the hinge arguments at t = 0), c (their rate along the step), wd = w.diag(ridge).d and
    dd = d.diag(ridge).d. phi' / 2 = A + t B on each interval between the rows' breakpoints
    -r_i / c_i (A = sum over the active rows of weight r c, plus wd; B = their weight c^2, plus dd), so
    the root is found by walking the sorted breakpoints with running sums (phi' increases)."""
    on = (r > 0) | ((r == 0) & (c > 0))         # active just after t = 0
    A0 = float(np.sum(weight[on] * r[on] * c[on])) + wd
    B0 = float(np.sum(weight[on] * c[on] ** 2)) + dd
    nz = c != 0
    bp = np.full(r.shape, -np.inf)
    bp[nz] = -r[nz] / c[nz]
    ev = nz & (bp > 0)                            # rows switching on (c > 0) or off (c < 0) at t > 0
    order = np.argsort(bp[ev], kind="stable")
    tb, re, ce, we = bp[ev][order], r[ev][order], c[ev][order], weight[ev][order]
    sgn = np.where(ce > 0, 1.0, -1.0)             # a row with c > 0 joins at its breakpoint, c < 0 leaves
    A = np.concatenate([[A0], A0 + np.cumsum(sgn * we * re * ce)])
    B = np.concatenate([[B0], B0 + np.cumsum(sgn * we * ce * ce)])
    lo = np.concatenate([[0.0], tb])
    hi = np.concatenate([tb, [np.inf]])
    # the minimizer is the first t >= 0 where phi' >= 0: an interval's lower end where phi' already is,
    # else the root inside the interval
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        at_lo = A + lo * B >= 0
        root = np.where(B > 0, -A / B, np.inf)
    cand = np.where(at_lo, lo, np.where(np.isfinite(root) & (root <= hi), root, np.nan))
    found = np.flatnonzero(~np.isnan(cand))
    if found.size == 0:                           # phi' < 0 everywhere: no finite minimum (no ridge along d)
        return 0.0
    return float(cand[found[0]])


def group_folds(groups, y, folds: int) -> np.ndarray:
    """Fold index [T] per row, whole groups per fold: the groups holding positives dealt round-robin
    in sorted order, then the others; deterministic."""
    gr, pos = np.asarray(groups), np.asarray(y, dtype=bool)
    uniq, inv = np.unique(gr, return_inverse=True)
    has_pos = np.zeros(uniq.size, dtype=bool)
    has_pos[inv[pos]] = True
    order = np.concatenate([np.flatnonzero(has_pos), np.flatnonzero(~has_pos)])
    fold_of_group = np.empty(uniq.size, dtype=np.int64)
    fold_of_group[order] = np.arange(order.size) % folds
    return fold_of_group[inv]


@dataclass(frozen=True, eq=False)
class OofMargins:
    """Out-of-fold scores [T] (each row scored by the gate fitted on the other folds) and their
    separation; `fold` [T] the rows' folds."""

    affine: bool
    folds: int
    fold: np.ndarray
    scores: np.ndarray
    oof: Separation
    config: GateConfig

    def summary(self) -> dict:
        return {"affine": self.affine, "folds": self.folds, "config": self.config.summary(), **self.oof.summary()}


def oof_margins(x, y, groups, folds: int = 5, affine: bool = False, config: GateConfig = GateConfig()) -> OofMargins:
    """The gate's out-of-fold margins by group (document): through the origin, or with a bias.
    Needs at least two groups holding positives and `folds` <= the number of groups."""
    x = as_rows(x)
    pos = as_labels(y, x.shape[0])
    gr = np.asarray(groups)
    if gr.shape != (x.shape[0],):
        raise GatedError("groups", "shape", f"expected one group per row ({x.shape[0]}), got shape {gr.shape}")
    n_groups, n_pos_groups = np.unique(gr).size, np.unique(gr[pos]).size
    if isinstance(folds, bool) or not isinstance(folds, (int, np.integer)) or not 2 <= folds <= n_groups:
        raise GatedError("oof", "folds", f"expected an integer in [2, {n_groups}] (the groups), got {folds!r}")
    if n_pos_groups < 2:
        raise GatedError("groups", "positives", f"positives lie in {n_pos_groups} group(s): out of fold needs >= 2")
    fold = group_folds(gr, pos, int(folds))
    scores = np.empty(x.shape[0])
    for k in range(int(folds)):
        test = fold == k
        if not test.any():
            continue
        train = ~test
        if not (pos[train].any() and (~pos[train]).any()):
            raise GatedError("oof", "folds", f"fold {k}'s training rows lack a class")
        gate = fit_gate(x[train], pos[train], config, affine=affine)
        scores[test] = x[test] @ gate.g + gate.bias
    return OofMargins(bool(affine), int(folds), fold, scores, separation(scores, pos), config)
