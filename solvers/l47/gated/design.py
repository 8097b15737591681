"""The rewritten unit, from a gate through the origin: its gate row and its up row, and the
detector's numbers (`activation_ratio`: how small the unit stays off the phrase against how large
it is on it).

With d = g/|g| and a row's score s = d.x (the gate's score over |g|):
- gate row alpha * d, alpha = kappa / s_min (s_min the positives' least score): the weakest
  positive sits at silu(kappa) ~ kappa, the negatives below 0 at silu(alpha s) -> 0;
- up row (config.up):
  "gate" (default): beta * d, so a = beta s silu(alpha s) = (beta / alpha) z^2 sigma(z), z = alpha s.
      Why: a >= 0 on every row, so the down column acts with one sign everywhere (it never raises w
      where it leaks); a grows as s^2 past the threshold and vanishes quadratically at it; and on
      ANY row with s <= 0 (seen or not) |a| <= (beta / alpha) SILU_NEG_BOUND, i.e. at most
      leak_bound = SILU_NEG_BOUND / (kappa^2 sigma(kappa)) of the weakest positive (0.0075 at
      kappa = 8, 0.0019 at 16), whatever the row's norm along other directions.
  With Gemma's GEGLU (config.act "gelu") the same with gelu for silu: a = (beta / alpha) z gelu(z),
      |a| <= (beta / alpha) NEG_BOUND["gelu"] below the threshold (0.166, at z = -1.19), and the
      engine's geglu is exactly 0 wherever z <= -10.
  "mean_positive": beta * (the positives' mean row, normalized). On positives u.x is about
      constant, but the FFN input has a large component common to every row (which is what lets a
      gate through the origin act as if it had a bias), so u.x is large on negatives too and only
      silu holds them down, with either sign and no bound: kept as the comparison.
- beta so the positives' median activation is config.target (the down column then carries the
  edit's strength per unit of activation).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactedit.solvers.l47.gated.config import DesignConfig, GatedError, as_labels, as_rows
from exactedit.solvers.l47.gated.gate import Gate
from exactedit.solvers.l47.gated.unit import NEG_BOUND, act_fn, unit_ref

__all__ = ["ActivationRatio", "GatedUnit", "activation_ratio", "design_unit", "leak_bound"]


@dataclass(frozen=True)
class ActivationRatio:
    """A unit's activations a split by label: the positives' least, 10th percentile and median a,
    the negatives' largest and 99th-percentile |a|, `ratio` = neg_max_abs / pos_min (the detector's
    worst case; < 1 iff every negative stays below every positive), `ratio_p10` = neg_max_abs /
    pos_p10, the share of negatives with |a| >= pos_p10, and the negatives' least a (< 0: leaks with
    the opposite sign)."""

    pos_min: float
    pos_p10: float
    pos_median: float
    neg_max_abs: float
    neg_p99_abs: float
    neg_min: float
    ratio: float
    ratio_p10: float
    neg_above_pos_p10: float
    n_pos: int
    n_neg: int

    def summary(self) -> dict:
        return dict(self.__dict__)


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else float("inf")


def activation_ratio(a, y) -> ActivationRatio:
    """The detector's numbers of activations a [T] labelled y [T] (True on the positives)."""
    a = np.asarray(a, dtype=np.float64)
    if a.ndim != 1 or a.size == 0 or not np.all(np.isfinite(a)):
        raise GatedError("a", "values", f"expected finite activations [T], got shape {a.shape}")
    pos = as_labels(y, a.size)
    ap, an = a[pos], a[~pos]
    p10, neg_abs = float(np.percentile(ap, 10)), np.abs(an)
    mx = float(neg_abs.max())
    return ActivationRatio(float(ap.min()), p10, float(np.median(ap)), mx, float(np.percentile(neg_abs, 99)),
                           float(an.min()), _ratio(mx, float(ap.min())), _ratio(mx, p10),
                           float(np.mean(neg_abs >= p10)), int(ap.size), int(an.size))


def leak_bound(kappa: float, act: str = "silu") -> float:
    """With up = "gate": the most |a| on any row with score <= 0, over the weakest positive's a
    (a = (beta / alpha) z act(z): NEG_BOUND[act] against kappa act(kappa))."""
    return NEG_BOUND[act] / (kappa * float(act_fn(act)(kappa)))


@dataclass(frozen=True, eq=False)
class GatedUnit:
    """The rewritten unit's rows (gate row `g_row`, up row `u_row`, float64 [n]), how they were
    chosen, and the detector's numbers on the rows it was designed on (`train`); `leak_bound` the
    bound on any row below the gate's threshold relative to the weakest positive ("gate" only)."""

    g_row: np.ndarray
    u_row: np.ndarray
    alpha: float
    beta: float
    score_pos_min: float         # the positives' least score along g/|g|
    config: DesignConfig
    train: ActivationRatio
    leak_bound: float | None

    def activation(self, x) -> np.ndarray:
        return unit_ref(x, self.g_row, self.u_row, self.config.act)

    def summary(self) -> dict:
        return {"config": self.config.summary(), "alpha": self.alpha, "beta": self.beta,
                "score_pos_min": self.score_pos_min, "leak_bound": self.leak_bound, "train": self.train.summary()}


def design_unit(gate: Gate, x, y, config: DesignConfig = DesignConfig()) -> GatedUnit:
    """The unit of `gate` (through the origin), scaled on rows x [T, n] labelled y (normally the
    rows the gate was fitted on; held-out rows go to `activation_ratio(unit.activation(x), y)`)."""
    if gate.affine:
        raise GatedError("gate", "affine", "an affine gate needs a bias the FFN does not have: fit it through "
                         "the origin (affine=False)")
    x = as_rows(x)
    pos = as_labels(y, x.shape[0])
    if x.shape[1] != gate.g.size:
        raise GatedError("x", "shape", f"expected rows of {gate.g.size} values (the gate's), got {x.shape[1]}")
    norm = gate.norm
    if not norm > 0:
        raise GatedError("gate", "g", "the gate row is zero")
    d = gate.g / norm
    s = x @ d
    s_min = float(s[pos].min())
    if not s_min > 0:
        raise GatedError("gate", "margin_pos_min", f"a positive row scores {s_min:.4g} <= 0 along the gate: the "
                         "unit would not fire there (the prefix does not separate through the origin here)")
    alpha = config.kappa / s_min
    if config.up == "gate":
        u_dir = d
    else:
        m = x[pos].mean(axis=0)
        mn = float(np.linalg.norm(m))
        if not mn > 0:
            raise GatedError("x", "positives", "the positives' mean row is zero")
        u_dir = m / mn
    base = act_fn(config.act)(alpha * s) * (x @ u_dir)
    med = float(np.median(base[pos]))
    if not med > 0:
        raise GatedError("design", "up", f"the positives' median activation is {med:.4g} <= 0 with up={config.up!r}")
    beta = config.target / med
    unit = GatedUnit(alpha * d, beta * u_dir, float(alpha), float(beta), s_min, config,
                     activation_ratio(beta * base, pos),
                     leak_bound(config.kappa, config.act) if config.up == "gate" else None)
    return unit
