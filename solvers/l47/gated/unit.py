"""One SwiGLU unit, the float64 reference: a(x) = silu(g.x) * (u.x) per row of x = ffn_norm(R)
(the FFN's input [T, n]); the unit writes W_down[:, j] * a into the residual. `unit_grad` is the
vector-Jacobian product of a with respect to the gate row g and the up row u:

    d(c.a)/dg = sum_t c_t silu'(g.x_t) (u.x_t) x_t,    d(c.a)/du = sum_t c_t silu(g.x_t) x_t,
    silu(z) = z sigma(z),  silu'(z) = sigma(z) (1 + z (1 - sigma(z))).

`SILU_NEG_BOUND` = max over z <= 0 of z^2 sigma(z): with u = beta g/|g| and g = alpha g/|g| the
unit is a = (beta / alpha) z^2 sigma(z) at z = alpha s (s the row's score along g/|g|), so on any row
with s <= 0, seen or not, |a| <= (beta / alpha) * SILU_NEG_BOUND (solvers.l47.gated.design).
"""
from __future__ import annotations

import numpy as np
from scipy.special import expit

from exactedit.solvers.l47.gated.config import GatedError, as_rows

__all__ = ["SILU_NEG_BOUND", "silu", "silu_grad", "unit_grad", "unit_ref"]

# z^2 sigma(z) on z <= 0 peaks where 2 (1 + e^y) = y e^y (y = -z = 2.2177151...); checked in the tests
SILU_NEG_BOUND = 0.4828300787890012


def silu(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    return z * expit(z)


def silu_grad(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    s = expit(z)
    return s * (1.0 + z * (1.0 - s))


def _vec(v, n: int, where: str) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (n,):
        raise GatedError(where, "shape", f"expected a row of {n} values, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise GatedError(where, "values", "expected finite values (found nan or inf)")
    return a


def unit_ref(x, g, u) -> np.ndarray:
    """a [T] = silu(x @ g) * (x @ u), in float64."""
    x = as_rows(x)
    g, u = _vec(g, x.shape[1], "g"), _vec(u, x.shape[1], "u")
    return silu(x @ g) * (x @ u)


def unit_grad(x, g, u, cot=None) -> tuple[np.ndarray, np.ndarray]:
    """(d(cot.a)/dg [n], d(cot.a)/du [n]) with a = unit_ref(x, g, u); cot [T] defaults to ones
    (the gradient of sum_t a_t). Per-row gradients are cot = e_t."""
    x = as_rows(x)
    g, u = _vec(g, x.shape[1], "g"), _vec(u, x.shape[1], "u")
    c = np.ones(x.shape[0]) if cot is None else _vec(cot, x.shape[0], "cot")
    z, v = x @ g, x @ u
    return (c * silu_grad(z) * v) @ x, (c * silu(z)) @ x
