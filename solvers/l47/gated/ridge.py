"""The gate's ridge chosen on dev: `choose_ridge` fits the gate at each lam of a grid on the solve
side, designs the unit from it, and scores the unit on the dev rows, which the fit never saw.

A gate through the origin fitted near the hard margin (lam 1e-3) separates its few dozen
positives in 1,536 dimensions whatever they are, and some such gates fire far off their contexts
on unseen rows (Qwen's 21-phrase run: the "you can" unit at 15 times its contexts' median on a
held-out row; a sign-off's unit at 1.5 times). A larger ridge gives a shorter g that generalizes
better for some detectors and worse for others, so it is chosen per detector, on dev:

    coverage = mean over dev positives of min(a / target, 1)     (the contexts the unit reaches)
    leak     = sum over dev negatives of (a / target)^2 / n_pos  (off-context activation energy
                                                                  per context: the KL a unit's
                                                                  column causes grows with a^2)
    score    = coverage - leak,  the lam with the largest score (ties: the smaller lam)

a = the designed unit's activation (design.design_unit, float64 reference: the choice reads
ratios, not the engine's last bits), target = the design's median activation on the fit's
positives. Without a dev positive the score cannot weigh coverage, and where no lam's coverage
reaches MIN_COVERAGE the detector does not reach dev's contexts at any ridge: in both cases the
grid's first lam is kept (the table still says each lam's numbers). A lam whose gate puts a fit positive at or below zero
cannot be designed and is left out, with the reason.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactedit.solvers.l47.gated.config import DesignConfig, GateConfig, GatedError, as_labels, as_rows

__all__ = ["MIN_COVERAGE", "RidgeChoice", "choose_ridge", "dev_score"]

MIN_COVERAGE = 0.05      # below this best dev coverage, dev cannot tell the ridges apart


def dev_score(a, y, target: float) -> dict:
    """The module doc's coverage, leak and score of activations a [T] on dev rows labelled y."""
    a, y = np.asarray(a, np.float64), np.asarray(y, bool)
    if not target > 0:
        raise GatedError("design", "target", f"expected a positive target activation, got {target!r}")
    r = a / float(target)
    n_pos = int(y.sum())
    leak_energy = float(np.sum(r[~y] ** 2))
    out = {"n_pos": n_pos, "n_neg": int((~y).sum()), "leak_max": float(np.abs(r[~y]).max()) if (~y).any() else 0.0,
           "leak_energy": leak_energy, "coverage": None, "leak": None, "score": None}
    if n_pos:
        cov = float(np.mean(np.minimum(r[y], 1.0)))
        leak = leak_energy / n_pos
        out.update(coverage=cov, leak=leak, score=cov - leak)
    return out


@dataclass(frozen=True, eq=False)
class RidgeChoice:
    """The chosen lam, its gate and unit, and per lam of the grid its dev numbers (`table`)."""

    lam: float
    gate: object                    # gate.Gate
    unit: object                    # design.GatedUnit
    table: tuple[dict, ...]
    by: str                         # "dev": the largest score; "first": dev cannot tell (module doc), or one lam

    def summary(self) -> dict:
        return {"lam": self.lam, "by": self.by, "table": list(self.table)}


def choose_ridge(x, y, x_dev, y_dev, lams, gate: GateConfig = GateConfig(),
                 design: DesignConfig = DesignConfig()) -> RidgeChoice:
    """The module doc's choice: the gate fitted on x [T, n] labelled y at each lam of `lams` (the
    rest of `gate` kept), its unit designed with `design`, scored on x_dev [D, n] labelled y_dev
    (None: no dev rows)."""
    from exactedit.solvers.l47.gated.design import design_unit
    from exactedit.solvers.l47.gated.gate import fit_gate

    grid = [float(v) for v in lams]
    if not grid or not all(np.isfinite(v) and v > 0 for v in grid):
        raise GatedError("gate", "lams", f"expected one or more positive ridges, got {lams!r}")
    grid = list(dict.fromkeys(grid))
    x = as_rows(x)
    pos = as_labels(y, x.shape[0])
    if x_dev is not None:
        x_dev = as_rows(x_dev)
        dev_pos = as_labels(y_dev, x_dev.shape[0], "y_dev", both=False)
        if x_dev.shape[1] != x.shape[1]:
            raise GatedError("x_dev", "shape", f"expected rows of {x.shape[1]} values, got {x_dev.shape[1]}")
    fits, table = {}, []
    for lam in grid:
        g = fit_gate(x, pos, GateConfig(gate.margin, lam, gate.maxiter, gate.gtol))
        try:
            u = design_unit(g, x, pos, design)
        except GatedError as exc:
            table.append({"lam": lam, "error": str(exc)})
            continue
        fits[lam] = (g, u)
        row = {"lam": lam}
        if x_dev is not None and x_dev.shape[0]:
            row.update(dev_score(u.activation(x_dev), dev_pos, design.target))
        table.append(row)
    if not fits:
        raise GatedError("gate", "lams", f"no ridge of {grid} gives a gate that puts every positive above zero")
    scored = [r for r in table if r.get("score") is not None]
    top = max((r["coverage"] for r in scored), default=0.0)
    if top >= MIN_COVERAGE and len(fits) > 1:
        best = max(scored, key=lambda r: (r["score"], -r["lam"]))
        lam, by = best["lam"], "dev"
    else:
        lam, by = next(v for v in grid if v in fits), "first"
    g, u = fits[lam]
    return RidgeChoice(lam, g, u, tuple(table), by)
