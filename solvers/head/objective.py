"""The head solver's objective J (SPEC.md section 4): numpy float64 reference and analytic gradient.

Editing rows S of W_out changes only the logits of S, linearly: l'_{t,s} = l_{t,s} + dW_s . z_t
(z = mix). Everything here therefore works on `delta = Z dW^T` (rows x |S|) plus a handful of
per-row scalars taken from one full-vocab pass: the base logits of S, LSE_rest (the logsumexp of
all rows outside S), the base LSE, and the base logits of any token outside S that a term names.

    J = w_nll   mean_nll    [LSE' - l'_y]                                  voice SFT
      + w_m     mean_margin softplus(m - (l'_cho - l'_rej))                margin at step 0
      + w_ul    mean_opener -log(1 - sum_{o in O, o != y} p'_o)            opener unlikelihood
      + w_close mean_closer -log(1 - sum_{c in Cl} p'_c)                   closer unlikelihood
      + w_kl    mean_anchor [sum_{s in S} p_s (-delta_s) + LSE' - LSE]     KL(p || p'), exact
      + w_g     mean_guard  relu(LSE - LSE' - eps)^2                       specials rise <= e^eps
      + ridge   ||dW||^2

Each term is a mean over its own rows; a term with no rows contributes 0. The gradient of every
term with respect to the edited logits of S is closed-form (p' = softmax of the edited logits):

    nll     p'_s - [s = y]
    margin  sigmoid(m - gap) * ([s = rej] - [s = cho])
    set UL  (p'_s [s in set] - P p'_s) / (1 - P),     P = the set's edited probability
    KL      p'_s - p_s
    guard   -2 relu(LSE - LSE' - eps) p'_s

and dJ/d dW = G^T Z + 2 ridge dW. This module is the obviously-right version; objective_jax.py is the
fast float32 one, checked against it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np


class TargetTerm(NamedTuple):
    """Rows that score one token each (the reply target, or the chosen/rejected opener)."""

    rows: np.ndarray   # int [m]  index into the batch rows
    logit: np.ndarray  # [m]      base logit of the token
    slot: np.ndarray   # int [m]  its index in S, or -1 when the token is not edited


class MarginTerm(NamedTuple):
    """Step-0 rows with a chosen and a rejected opener sharing the whole prefix."""

    cho: TargetTerm
    rej: TargetTerm    # same rows as cho


class SetTerm(NamedTuple):
    """Rows that penalize the edited probability of a token set (openers O, closers Cl)."""

    rows: np.ndarray     # int [m]
    mask: np.ndarray     # bool [m, |S|]  members of the set inside S (the row's own target excluded)
    lse_out: np.ndarray  # [m]  base logsumexp of the members outside S (-inf when none)


class HeadBatch(NamedTuple):
    """Everything one objective evaluation reads; arrays only, so it is a JAX pytree as well."""

    z: np.ndarray         # [T, n] mix vectors of the rows
    base_s: np.ndarray    # [T, |S|] base logits of the edit set
    lse_rest: np.ndarray  # [T] logsumexp over V \\ S
    lse: np.ndarray       # [T] base logsumexp over V
    nll: TargetTerm
    margin: MarginTerm
    opener: SetTerm
    closer: SetTerm
    anchor: np.ndarray    # int [m] rows of the KL term
    guard: np.ndarray     # int [m] rows of the special-token guard


@dataclass(frozen=True)
class Weights:
    """The weights of J; any of them may be 0 (that term is then skipped)."""

    nll: float = 1.0
    margin: float = 0.0
    margin_m: float = 1.0
    ul: float = 0.0
    close: float = 0.0
    kl: float = 100.0
    guard: float = 1.0
    guard_eps: float = 0.05
    ridge: float = 0.0

    def __post_init__(self):
        for name in ("nll", "margin", "ul", "close", "kl", "guard", "guard_eps", "ridge"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value >= 0):
                raise ValueError(f"Weights.{name} must be finite and >= 0, got {value!r}")
        if not np.isfinite(self.margin_m):
            raise ValueError(f"Weights.margin_m must be finite, got {self.margin_m!r}")


class Terms(NamedTuple):
    """Each term's weighted value and the total J."""

    nll: float
    margin: float
    opener: float
    closer: float
    kl: float
    guard: float
    ridge: float
    total: float


TERM_NAMES = Terms._fields[:-1]


def logsumexp(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """logsumexp along `axis`; -inf for an empty or all -inf slice."""
    if x.shape[axis] == 0:
        return np.full(np.delete(x.shape, axis), -np.inf)
    top = np.max(x, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        return np.log(np.sum(np.exp(x - top), axis=axis)) + np.squeeze(top, axis=axis)


def edited(batch: HeadBatch, delta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The edited logits of S and the edited LSE' = logaddexp(LSE_rest, logsumexp_S(l'))."""
    ls = batch.base_s + delta
    return ls, np.logaddexp(batch.lse_rest, logsumexp(ls))


def _target_logit(term: TargetTerm, ls: np.ndarray) -> np.ndarray:
    inside = term.slot >= 0
    picked = ls[term.rows, np.where(inside, term.slot, 0)]
    return np.where(inside, picked, term.logit)


def _scatter_target(g: np.ndarray, term: TargetTerm, coef: np.ndarray) -> None:
    inside = term.slot >= 0
    np.add.at(g, (term.rows[inside], term.slot[inside]), coef[inside])


def _mean_scale(rows: np.ndarray) -> float:
    return 1.0 / max(len(rows), 1)


def _set_term(term: SetTerm, ls: np.ndarray, lse2: np.ndarray, g: np.ndarray, weight: float) -> float:
    """-log(1 - P) over the set's rows; adds its gradient into g."""
    if weight == 0 or len(term.rows) == 0:
        return 0.0
    rows_ls = ls[term.rows]
    inside = logsumexp(np.where(term.mask, rows_ls, -np.inf))
    log_p = np.logaddexp(term.lse_out, inside) - lse2[term.rows]
    one_minus = -np.expm1(log_p)
    scale = weight * _mean_scale(term.rows)
    ps = np.exp(rows_ls - lse2[term.rows][:, None])
    p_set = np.exp(log_p)[:, None]
    grad = (np.where(term.mask, ps, 0.0) - p_set * ps) / one_minus[:, None]
    np.add.at(g, term.rows, scale * grad)
    return float(scale * np.sum(-np.log(one_minus)))


def terms_and_grad(batch: HeadBatch, delta: np.ndarray, w: Weights) -> tuple[Terms, np.ndarray]:
    """J without its ridge term, as a function of delta = Z dW^T, and dJ/d delta."""
    ls, lse2 = edited(batch, delta)
    p2 = np.exp(ls - lse2[:, None])
    g = np.zeros_like(delta)
    values = dict.fromkeys(TERM_NAMES, 0.0)

    if w.nll and len(batch.nll.rows):
        t = batch.nll
        scale = w.nll * _mean_scale(t.rows)
        values["nll"] = scale * float(np.sum(lse2[t.rows] - _target_logit(t, ls)))
        np.add.at(g, t.rows, scale * p2[t.rows])
        _scatter_target(g, t, -scale * np.ones(len(t.rows)))

    if w.margin and len(batch.margin.cho.rows):
        cho, rej = batch.margin
        scale = w.margin * _mean_scale(cho.rows)
        x = w.margin_m - (_target_logit(cho, ls) - _target_logit(rej, ls))
        values["margin"] = scale * float(np.sum(np.logaddexp(0.0, x)))
        sig = 0.5 * (1.0 + np.tanh(0.5 * x))
        _scatter_target(g, cho, -scale * sig)
        _scatter_target(g, rej, scale * sig)

    values["opener"] = _set_term(batch.opener, ls, lse2, g, w.ul)
    values["closer"] = _set_term(batch.closer, ls, lse2, g, w.close)

    if w.kl and len(batch.anchor):
        rows = batch.anchor
        scale = w.kl * _mean_scale(rows)
        p = np.exp(batch.base_s[rows] - batch.lse[rows][:, None])
        kl = np.sum(-p * delta[rows], axis=1) + lse2[rows] - batch.lse[rows]
        values["kl"] = scale * float(np.sum(kl))
        np.add.at(g, rows, scale * (p2[rows] - p))

    if w.guard and len(batch.guard):
        rows = batch.guard
        scale = w.guard * _mean_scale(rows)
        h = np.maximum(batch.lse[rows] - lse2[rows] - w.guard_eps, 0.0)
        values["guard"] = scale * float(np.sum(h * h))
        np.add.at(g, rows, scale * (-2.0 * h[:, None] * p2[rows]))

    values["total"] = float(sum(values[name] for name in TERM_NAMES))
    return Terms(**values), g


def objective(batch: HeadBatch, dw: np.ndarray, w: Weights) -> Terms:
    """J at the edit dW (|S| x n)."""
    return objective_grad(batch, dw, w)[0]


def objective_grad(batch: HeadBatch, dw: np.ndarray, w: Weights) -> tuple[Terms, np.ndarray]:
    """J at dW and its analytic gradient dJ/d dW = G^T Z + 2 ridge dW."""
    delta = batch.z @ dw.T
    terms, g = terms_and_grad(batch, delta, w)
    ridge = w.ridge * float(np.sum(dw * dw))
    terms = terms._replace(ridge=ridge, total=terms.total + ridge)
    return terms, g.T @ batch.z + 2.0 * w.ridge * dw
