"""The cost of repurposing one FFN unit j: what the model loses when unit j's current contribution
hh[:, j] W_down[:, j] leaves the FFN's output.

- `unit_energy`: per unit, sum_t hh[t, j]^2 |W_down[:, j]|^2, the exact squared Frobenius norm of
  its contribution over the rows (streamed over row chunks of hh: [chunk, h] at a time, never a
  T x h x n tensor); `col_norms` the |W_down[:, j]| (streamed over W_down's rows).
- `removal_candidates`: the k units of least energy among those NOT active on the phrase contexts
  (max over positive rows of |hh[t, j]| at most active_tol times the positive rows' RMS hidden
  value), with their numbers: a cheap screen; the caller pushes `removal_delta` of each candidate
  through the exact tail for the KL it really costs.
- `removal_delta`: the FFN output's change when unit j is zeroed, dY = -hh[:, j] outer W_down[:, j]
  (R' = R + dY where no post-FFN norm sits between; otherwise the tail applies that norm).
  `rewrite_delta`: the change when unit j is rewritten to activation a and down column `down`,
  a outer down - hh[:, j] outer W_down[:, j].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exactedit.solvers.l47.gated.config import GatedError, as_labels

__all__ = ["RemovalCandidates", "col_norms", "removal_candidates", "removal_delta", "rewrite_delta", "unit_energy"]


def _matrix(a, where: str) -> np.ndarray:
    m = np.asarray(a)
    if m.ndim != 2 or m.shape[0] == 0 or m.shape[1] == 0:
        raise GatedError(where, "shape", f"expected a matrix with both sides >= 1, got shape {m.shape}")
    return m


def _chunk(chunk: int) -> int:
    if isinstance(chunk, bool) or not isinstance(chunk, (int, np.integer)) or chunk < 1:
        raise GatedError("removal", "chunk", f"expected an integer >= 1, got {chunk!r}")
    return int(chunk)


def col_norms(wdown, chunk: int = 1024) -> np.ndarray:
    """|W_down[:, j]| (float64 [h]) of W_down [n_embd, h], streamed over chunks of its rows."""
    w = _matrix(wdown, "wdown")
    ss = np.zeros(w.shape[1])
    for i in range(0, w.shape[0], _chunk(chunk)):
        b = np.asarray(w[i:i + chunk], dtype=np.float64)
        ss += np.einsum("ij,ij->j", b, b)
    if not np.all(np.isfinite(ss)):
        raise GatedError("wdown", "values", "expected finite values (found nan or inf)")
    return np.sqrt(ss)


def unit_energy(hh, wdown_col_norms, chunk: int = 4096) -> np.ndarray:
    """sum_t hh[t, j]^2 |W_down[:, j]|^2 per unit (float64 [h]) of hh [T, h], streamed over rows."""
    h = _matrix(hh, "hh")
    cn = np.asarray(wdown_col_norms, dtype=np.float64)
    if cn.shape != (h.shape[1],):
        raise GatedError("wdown_col_norms", "shape", f"expected one norm per unit ({h.shape[1]}), got {cn.shape}")
    ss = np.zeros(h.shape[1])
    for i in range(0, h.shape[0], _chunk(chunk)):
        b = np.asarray(h[i:i + chunk], dtype=np.float64)
        ss += np.einsum("tj,tj->j", b, b)
    if not np.all(np.isfinite(ss)):
        raise GatedError("hh", "values", "expected finite values (found nan or inf)")
    return ss * cn**2


@dataclass(frozen=True, eq=False)
class RemovalCandidates:
    """The k cheapest units to repurpose, cheapest first: `units` [k], their contribution's energy
    [k] (sum over rows of |hh[t, j] W_down[:, j]|^2), `share` [k] of all units' energy, `rms` [k] =
    sqrt(energy / T) (the contribution's RMS norm per row), `pos_max_abs` [k] (max |hh| on the
    positive rows); `threshold` the activity cut, `n_active` the units it excluded."""

    units: np.ndarray
    energy: np.ndarray
    share: np.ndarray
    rms: np.ndarray
    pos_max_abs: np.ndarray
    threshold: float
    n_active: int
    total_energy: float
    rows: int

    def summary(self) -> dict:
        return {"units": self.units.tolist(), "energy": self.energy.tolist(), "share": self.share.tolist(),
                "rms": self.rms.tolist(), "pos_max_abs": self.pos_max_abs.tolist(), "threshold": self.threshold,
                "n_active": self.n_active, "total_energy": self.total_energy, "rows": self.rows}


def removal_candidates(hh, wdown_col_norms, positives_mask, k: int, *, active_tol: float = 1.0,
                       chunk: int = 4096) -> RemovalCandidates:
    """The k units of least `unit_energy` whose max |hh| over the positive rows is at most
    active_tol * sqrt(mean hh[positives]^2) (ties broken by unit index); fewer when fewer qualify."""
    h = _matrix(hh, "hh")
    pos = as_labels(positives_mask, h.shape[0], "positives_mask", both=False)
    if not pos.any():
        raise GatedError("positives_mask", "values", "expected at least one positive row (the phrase's contexts)")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise GatedError("removal", "k", f"expected an integer >= 1, got {k!r}")
    if not (isinstance(active_tol, (int, float)) and np.isfinite(active_tol) and active_tol >= 0):
        raise GatedError("removal", "active_tol", f"expected a finite number >= 0, got {active_tol!r}")
    energy = unit_energy(h, wdown_col_norms, chunk)
    hp = np.asarray(h[np.flatnonzero(pos)], dtype=np.float64)
    pos_max = np.abs(hp).max(axis=0)
    threshold = float(active_tol * np.sqrt(np.mean(hp * hp)))
    quiet = np.flatnonzero(pos_max <= threshold)
    order = quiet[np.lexsort((quiet, energy[quiet]))][: int(k)]
    total = float(energy.sum())
    e = energy[order]
    return RemovalCandidates(order.astype(np.int64), e, e / total if total > 0 else np.zeros_like(e),
                             np.sqrt(e / h.shape[0]), pos_max[order], threshold, int(h.shape[1] - quiet.size),
                             total, int(h.shape[0]))


def _column(hh, wdown, j) -> tuple[np.ndarray, np.ndarray]:
    h, w = _matrix(hh, "hh"), _matrix(wdown, "wdown")
    if h.shape[1] != w.shape[1]:
        raise GatedError("wdown", "shape", f"expected [n_embd, {h.shape[1]}] (one column per unit), got {w.shape}")
    if isinstance(j, bool) or not isinstance(j, (int, np.integer)) or not 0 <= j < h.shape[1]:
        raise GatedError("removal", "j", f"expected a unit in [0, {h.shape[1]}), got {j!r}")
    return np.asarray(h[:, j], dtype=np.float64), np.asarray(w[:, j], dtype=np.float64)


def removal_delta(hh, wdown, j: int) -> np.ndarray:
    """dY [T, n_embd] = -hh[:, j] outer W_down[:, j]: the FFN output's change when unit j is zeroed."""
    a, col = _column(hh, wdown, j)
    return -np.outer(a, col)


def rewrite_delta(hh, wdown, j: int, a, down) -> np.ndarray:
    """[T, n_embd] = a outer down - hh[:, j] outer W_down[:, j]: the change when unit j's activation
    becomes a [T] (e.g. GatedUnit.activation(x)) and its down column `down` [n_embd]."""
    old, col = _column(hh, wdown, j)
    a, down = np.asarray(a, dtype=np.float64), np.asarray(down, dtype=np.float64)
    if a.shape != old.shape or down.shape != col.shape:
        raise GatedError("rewrite", "shape", f"expected a {old.shape} and down {col.shape}, "
                         f"got {a.shape}, {down.shape}")
    return np.outer(a, down) - np.outer(old, col)
