"""The gated edit's error and configs: `GatedError` (names the input and the field), `GateConfig`
(the gate's fit, solvers.l47.gated.gate) and `DesignConfig` (the rewritten unit's rows,
solvers.l47.gated.design), frozen and validated on construction."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from exactedit.errors import FieldError
from exactedit.solvers.l47.config import ANTISLOP_RIDGES

__all__ = ["ANTISLOP_RIDGES", "DesignConfig", "GateConfig", "GatedError", "RIDGES", "UP_ROWS", "as_rows", "as_labels"]

UP_ROWS = ("gate", "mean_positive")       # solvers.l47.gated.design: the up row's direction


class GatedError(FieldError):
    """A gated-unit edit cannot be built from these inputs (names the input, the field and what was
    expected)."""


def _positive(owner: str, name: str, value, *, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value >= 0 if allow_zero else value > 0)
    if not ok:
        raise GatedError(owner, name, f"expected a finite number {'>= 0' if allow_zero else '> 0'}, got {value!r}")


# the gate's ridges tried, one chosen per detector on dev (ridge.choose_ridge); the first is
# GateConfig's lam, kept where dev has no positive. The persona's unit tries them all; the
# anti-slop edit only the first by default (chosen on dev: docs/solve-wfld.md)
RIDGES = ANTISLOP_RIDGES + (1e-2, 1e-1, 1.0)


@dataclass(frozen=True)
class GateConfig:
    """The gate's fit: scores s = g.x (+ b when affine) with s >= +margin on positives and
    s <= -margin on negatives, as a class-balanced squared hinge, plus lam * mean(x^2) * |g|^2
    (mean(x^2) the mean square entry: scale-free, x scaled by c gives g / c and the same scores);
    the finite Newton method from g = 0 (gate.py); `maxiter` caps its steps, `gtol` its |gradient|."""

    margin: float = 1.0
    lam: float = 1e-3
    maxiter: int = 5000
    gtol: float = 1e-10

    def __post_init__(self):
        _positive("GateConfig", "margin", self.margin)
        _positive("GateConfig", "lam", self.lam)
        _positive("GateConfig", "gtol", self.gtol)
        if isinstance(self.maxiter, bool) or not isinstance(self.maxiter, int) or self.maxiter < 1:
            raise GatedError("GateConfig", "maxiter", f"expected an integer >= 1, got {self.maxiter!r}")

    def summary(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DesignConfig:
    """The rewritten unit: the gate row is alpha * g/|g| with alpha = kappa / (the positives' least
    score along g/|g|), so the weakest positive sits at act(kappa); the up row's direction is `up`
    ("gate": g/|g|; "mean_positive": the mean positive row's direction), scaled so the median
    activation on positives is `target`; `act` the FFN's gate activation ("silu": SwiGLU, "gelu":
    Gemma's GEGLU)."""

    up: str = "gate"
    kappa: float = 8.0
    target: float = 1.0
    act: str = "silu"

    def __post_init__(self):
        if self.up not in UP_ROWS:
            raise GatedError("DesignConfig", "up", f"expected one of {UP_ROWS}, got {self.up!r}")
        if self.act not in ("silu", "gelu"):
            raise GatedError("DesignConfig", "act", f"expected 'silu' or 'gelu', got {self.act!r}")
        _positive("DesignConfig", "kappa", self.kappa)
        _positive("DesignConfig", "target", self.target)

    def summary(self) -> dict:
        return asdict(self)


def as_rows(x, where: str = "x") -> np.ndarray:
    """x as float64 [T, n] with finite values, T >= 1 and n >= 1 (else GatedError on `where`)."""
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2 or a.shape[0] == 0 or a.shape[1] == 0:
        raise GatedError(where, "shape", f"expected rows [T, n] with T, n >= 1, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise GatedError(where, "values", "expected finite values (found nan or inf)")
    return a


def as_labels(y, rows: int, where: str = "y", *, both: bool = True) -> np.ndarray:
    """y as bool [rows]; with `both`, at least one positive and one negative (else GatedError)."""
    a = np.asarray(y)
    if a.shape != (rows,):
        raise GatedError(where, "shape", f"expected one label per row ({rows}), got shape {a.shape}")
    if a.dtype != np.bool_:
        if not np.all(np.isin(a, (0, 1))):
            raise GatedError(where, "values", "expected booleans (or 0/1) marking the positive rows")
        a = a.astype(bool)
    if both and (not a.any() or a.all()):
        raise GatedError(where, "classes", f"expected positive and negative rows, got {int(a.sum())} positive "
                         f"of {rows}")
    return a
