"""How far a reply-end style (a sign-off, a kaomoji) can go within the KL bar off its decision rows.

A reply ends where the model gives its turn end: with probability q_t at every row t (the base
model's p(turn end)), not only at the rows where a sampled reply happened to stop. A style that
takes the reply's end is shown on a share f_t of those endings: at row t an edit moves f_t q_t of
probability from the turn end to the style's first token. The style's rate in free generation is
its share of the stopping mass, estimated on documents (every row: wherever a reply may stop) as

    rate = sum_t q_t f_t / sum_t q_t

and the least KL such a move costs at a row, with s_t the base probability of the style's tokens
there, is that of the pure transfer (the turn end lowered by the factor 1 - f_t, the style raised by
what it lost; anything else an edit moves only adds to it):

    kl_t = q_t log(1 / (1 - f_t)) + s_t log(s_t / (s_t + f_t q_t))

The persona protocol's bar is the mean KL over the rows off the decision rows (SPEC.md 7). Two
ideal edits, each measured against that bar on the documents' own q and s:
- `uniform`: the same share f at every row (an edit that cannot tell one row where the reply may
  stop from another): the largest f within the bar;
- `proportional`: f_t = 1 - lam (1 - q_t), the share growing with the model's own p(turn end) (the
  optimum of sum q f - mu sum (1 - q) kl, the rate against the KL expected at rows the reply goes
  on from: 1 - f = lam (1 - q)): the largest rate within the bar.
Neither is an edit that ships; they say what any edit can reach on these documents, beside what
the shipped one reaches on dev (docs/solve-head.md).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

#: the largest share a bound reports (f = 1 would take all of a row's turn end: infinite KL)
MAX_SHARE = 1.0 - 1e-9
_STEPS = 100      # bisection steps (each halves the interval: far below float64's resolution)


def transfer_kl(q, s, f) -> np.ndarray:
    """float64 [T]: KL(p || p') of the pure transfer of a share `f` (a number, or one per row) of
    p(turn end) `q` to the style's tokens, whose base probability is `s`."""
    q, s = np.asarray(q, np.float64), np.asarray(s, np.float64)
    f = np.broadcast_to(np.asarray(f, np.float64), q.shape)
    moved = f * q
    with np.errstate(divide="ignore", invalid="ignore"):
        style = np.where(s > 0, s * (np.log(s) - np.log(s + moved)), 0.0)
    return q * -np.log1p(-f) + style


def proportional_shares(q, lam: float) -> np.ndarray:
    """f_t = 1 - lam (1 - q_t), within [0, MAX_SHARE]."""
    return np.clip(1.0 - float(lam) * (1.0 - np.asarray(q, np.float64)), 0.0, MAX_SHARE)


@dataclass(frozen=True)
class Reach:
    rows: int
    decision_rows: int
    stop_mass_decision: float       # sum of q over the decision rows (the endings the documents show)
    stop_mass_off: float            # ... over the other rows (where a reply could have stopped)
    mean_q_off: float
    bar: float
    uniform_share: float            # the largest f at every row within the bar
    uniform_kl: dict                # the uniform transfer's mean KL off the decision rows at some shares
    proportional_rate: float        # the largest rate of f_t = 1 - lam (1 - q_t) within the bar
    proportional_lam: float
    proportional_kl: float

    def to_dict(self) -> dict:
        return {**asdict(self), "uniform_kl": {f"{k:g}": v for k, v in self.uniform_kl.items()}}


def reach(q, s, decision, bar: float, shares: Sequence[float] = (0.3, 0.5, 0.6, 0.8)) -> Reach:
    """The module doc's two bounds on documents whose rows have p(turn end) `q`, p(style tokens)
    `s` and the protocol's decision rows `decision` (bool), against the mean-KL bar `bar`."""
    q, s = np.asarray(q, np.float64), np.asarray(s, np.float64)
    dec = np.asarray(decision, bool)
    if not (q.shape == s.shape == dec.shape and q.ndim == 1):
        raise ValueError(f"q, s and decision must be 1-D of one length, got {q.shape}, {s.shape}, {dec.shape}")
    if not q.size or dec.all():
        raise ValueError("no row off the decision rows to hold the bar on")
    if not (np.all((q >= 0) & (q <= 1)) and np.all((s >= 0) & (s <= 1))):
        raise ValueError("q and s must be probabilities")
    if not bar > 0:
        raise ValueError(f"the bar must be positive, got {bar}")
    off = ~dec
    kl_off = lambda f: float(transfer_kl(q[off], s[off], f[off] if np.ndim(f) else f).mean())  # noqa: E731
    lo, hi = 0.0, MAX_SHARE                 # the uniform share: kl_off grows with f
    if kl_off(hi) <= bar:
        lo = hi
    for _ in range(_STEPS):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if kl_off(mid) <= bar else (lo, mid)
    # the proportional family: f (so the rate and the KL) falls as lam grows; lam searched in log space
    llo, lhi = np.log(1e-12), np.log(1e12)
    for _ in range(_STEPS):
        mid = 0.5 * (llo + lhi)
        llo, lhi = (llo, mid) if kl_off(proportional_shares(q, np.exp(mid))) <= bar else (mid, lhi)
    lam = float(np.exp(lhi))
    f = proportional_shares(q, lam)
    total = float(q.sum())
    return Reach(int(q.size), int(dec.sum()), float(q[dec].sum()), float(q[off].sum()), float(q[off].mean()),
                 float(bar), float(lo), {float(x): kl_off(float(x)) for x in shares},
                 float((q * f).sum() / total) if total > 0 else 0.0, lam, kl_off(f))
