"""Head forward, numpy float64 reference (SPEC.md section 2): R' -> mix -> logits.

hc4 (production, 4 residual streams):
    xn_c   = R'_c * w_onorm_c * rsqrt(mean_d(R'_c[d]^2) + 1e-6)
    lo     = silu((W_odown[0:d_lo] @ concat(xn_0..xn_3)) / 4)          [d_lo]
    mix_d  = 1/4 * sum_c xn_c[d] * sigmoid(W_oup[c*n + d] @ lo)        [n]
rmsnorm (public models):
    mix    = R' * rsqrt(mean(R'^2) + eps) * w_norm
logits = W_out @ mix, then c * tanh(logits / c) when the model has a final softcap c.

The constants 4 (silu divisor) and 1/4 (stream mean) are the production model's, written as
in SPEC.md; `streams` comes from the tensors. Weights are the runtime views (what the engine
multiplies with); `solvers.tail.model` loads them. `head_fast.py` holds the float32 paths.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

HC_EPS = 1e-6
HC_LO_DIVISOR = 4.0
HC_MIX_SCALE = 0.25


class Hc4Head(NamedTuple):
    """The hc4 output read: norm [streams, n], down [d_lo, streams*n], up [streams*n, d_lo]."""

    w_onorm: np.ndarray
    w_odown: np.ndarray
    w_oup: np.ndarray
    eps: float = HC_EPS


class RmsnormHead(NamedTuple):
    """Final RMSNorm weight [n]; `softcap` is None when the model applies none."""

    w_norm: np.ndarray
    eps: float = 1e-6
    softcap: float | None = None


def _sigmoid(x):
    return np.exp(-np.logaddexp(0.0, -x))


def hc4_mix_ref(Rp, head: Hc4Head) -> np.ndarray:
    """mix [T, n] float64 from R' [T, streams, n]."""
    Rp = np.asarray(Rp, dtype=np.float64)
    T, streams, n = Rp.shape
    w_onorm = np.asarray(head.w_onorm, dtype=np.float64)
    w_odown = np.asarray(head.w_odown, dtype=np.float64)
    w_oup = np.asarray(head.w_oup, dtype=np.float64)
    inv_rms = 1.0 / np.sqrt(np.mean(Rp * Rp, axis=-1, keepdims=True) + head.eps)
    xn = Rp * w_onorm[None] * inv_rms  # [T, streams, n]
    z = xn.reshape(T, streams * n) @ w_odown.T / HC_LO_DIVISOR  # [T, d_lo]
    lo = z * _sigmoid(z)  # silu
    gates = _sigmoid(lo @ w_oup.T).reshape(T, streams, n)
    return HC_MIX_SCALE * np.sum(xn * gates, axis=1)


def rmsnorm_mix_ref(Rp, head: RmsnormHead) -> np.ndarray:
    """mix [T, n] float64 from R' [T, n]."""
    Rp = np.asarray(Rp, dtype=np.float64)
    inv_rms = 1.0 / np.sqrt(np.mean(Rp * Rp, axis=-1, keepdims=True) + head.eps)
    return Rp * inv_rms * np.asarray(head.w_norm, dtype=np.float64)


def apply_softcap(logits, softcap: float | None):
    """c * tanh(logits / c), or the logits unchanged when `softcap` is None."""
    if softcap is None:
        return logits
    return softcap * np.tanh(logits / softcap)


def logits_ref(mix, w_out, softcap: float | None = None) -> np.ndarray:
    """logits [T, V] float64 = W_out @ mix per row (whole head in memory: small shapes only)."""
    out = np.asarray(mix, dtype=np.float64) @ np.asarray(w_out, dtype=np.float64).T
    return apply_softcap(out, softcap)


def log_softmax_ref(logits) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    logits = np.asarray(logits, dtype=np.float64)
    m = logits.max(axis=-1, keepdims=True)
    return logits - (m + np.log(np.sum(np.exp(logits - m), axis=-1, keepdims=True)))
