"""One gated unit, the float64 reference: a(x) = act(g.x) * (u.x) per row of x = ffn_norm(R)
(the FFN's input [T, n]); the unit writes W_down[:, j] * a into the residual. `unit_grad` is the
vector-Jacobian product of a with respect to the gate row g and the up row u:

    d(c.a)/dg = sum_t c_t silu'(g.x_t) (u.x_t) x_t,    d(c.a)/du = sum_t c_t silu(g.x_t) x_t,
    silu(z) = z sigma(z),  silu'(z) = sigma(z) (1 + z (1 - sigma(z))).

`SILU_NEG_BOUND` = max over z <= 0 of z^2 sigma(z): with u = beta g/|g| and g = alpha g/|g| the
unit is a = (beta / alpha) z^2 sigma(z) at z = alpha s (s the row's score along g/|g|), so on any row
with s <= 0, seen or not, |a| <= (beta / alpha) * SILU_NEG_BOUND (solvers.l47.gated.design).

`act` "gelu" is Gemma's GEGLU unit, a = gelu(g.x) (u.x) with the tanh form ggml tabulates,
gelu(z) = z/2 (1 + tanh(c (z + A z^3))), c = sqrt(2/pi), A = 0.044715,
gelu'(z) = (1 + t)/2 + z/2 (1 - t^2) c (1 + 3 A z^2); `NEG_BOUND["gelu"]` = max over z <= 0 of
z gelu(z) (at z = -1.19193); the engine's geglu is exactly 0 for z <= -10.
"""
from __future__ import annotations

import numpy as np
from scipy.special import expit

from exactedit.solvers.l47.gated.config import GatedError, as_rows

__all__ = ["ACTS", "NEG_BOUND", "SILU_NEG_BOUND", "act_fn", "act_grad", "gelu", "gelu_grad", "silu", "silu_grad",
           "unit_grad", "unit_ref"]

# z^2 sigma(z) on z <= 0 peaks where 2 (1 + e^y) = y e^y (y = -z = 2.2177151...); checked in the tests
SILU_NEG_BOUND = 0.4828300787890012
# z gelu(z) on z <= 0 peaks at z = -1.1919344 (bounded scalar search); checked in the tests
NEG_BOUND = {"silu": SILU_NEG_BOUND, "gelu": 0.16596867961299244}
ACTS = tuple(NEG_BOUND)
_C = float(np.float32(0.79788456080286535587989211986876))   # the float32 constants ggml's table uses
_A = float(np.float32(0.044715))


def silu(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    return z * expit(z)


def silu_grad(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    s = expit(z)
    return s * (1.0 + z * (1.0 - s))


def gelu(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    return 0.5 * z * (1.0 + np.tanh(_C * (z + _A * z ** 3)))


def gelu_grad(z) -> np.ndarray:
    z = np.asarray(z, dtype=np.float64)
    t = np.tanh(_C * (z + _A * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * _C * (1.0 + 3.0 * _A * z * z)


def _check_act(act: str) -> str:
    if act not in ACTS:
        raise GatedError("act", "value", f"expected one of {list(ACTS)}, got {act!r}")
    return act


def act_fn(act: str):
    return {"silu": silu, "gelu": gelu}[_check_act(act)]


def act_grad(act: str):
    return {"silu": silu_grad, "gelu": gelu_grad}[_check_act(act)]


def _vec(v, n: int, where: str) -> np.ndarray:
    a = np.asarray(v, dtype=np.float64)
    if a.shape != (n,):
        raise GatedError(where, "shape", f"expected a row of {n} values, got shape {a.shape}")
    if not np.all(np.isfinite(a)):
        raise GatedError(where, "values", "expected finite values (found nan or inf)")
    return a


def unit_ref(x, g, u, act: str = "silu") -> np.ndarray:
    """a [T] = act(x @ g) * (x @ u), in float64."""
    x = as_rows(x)
    g, u = _vec(g, x.shape[1], "g"), _vec(u, x.shape[1], "u")
    return act_fn(act)(x @ g) * (x @ u)


def unit_grad(x, g, u, cot=None, act: str = "silu") -> tuple[np.ndarray, np.ndarray]:
    """(d(cot.a)/dg [n], d(cot.a)/du [n]) with a = unit_ref(x, g, u, act); cot [T] defaults to ones
    (the gradient of sum_t a_t). Per-row gradients are cot = e_t."""
    x = as_rows(x)
    g, u = _vec(g, x.shape[1], "g"), _vec(u, x.shape[1], "u")
    c = np.ones(x.shape[0]) if cot is None else _vec(cot, x.shape[0], "cot")
    z, v = x @ g, x @ u
    return (c * act_grad(act)(z) * v) @ x, (c * act_fn(act)(z)) @ x
