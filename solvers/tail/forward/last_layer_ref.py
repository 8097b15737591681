"""Layer-47 tail forward, numpy float64 reference (SPEC.md section 2).

hc4 (production):
    bo   = yr + sigmoid(sgv) * ((W_sd + dW) @ hh)              [n]
    R'_c = R_c + bo * 2*sigmoid(inj_c / 4)                      c = 0..streams-1
rmsnorm (public models):
    R' = R + (W_down + dW) @ hh                                 plain residual add
    R' = R + rmsnorm((W_down + dW) @ hh, eps) * w_post          post-FFN norm (Gemma style)

Rows are the leading axis everywhere: R [T, streams, n] (hc4) or [T, n] (rmsnorm), hh [T, h].
Weights are (rows, cols) as in the GGUF: W_sd and W_down are [n, h].
These are the short, obviously right versions; `forward_fast.py` holds the float32 paths
that the rest of the toolkit runs, and a test table compares the two.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


class Hc4L47(NamedTuple):
    """Layer-47 weights of the hc4 tail, at runtime precision (W_sd: its Q8_0 dequant)."""

    w_sd: np.ndarray  # [n, h]


class RmsnormL47(NamedTuple):
    """Last-layer FFN down projection of an rmsnorm tail; `w_post` is None without a post-FFN norm."""

    w_down: np.ndarray  # [n, h]
    w_post: np.ndarray | None = None  # [n]
    eps: float = 1e-6


def sigmoid(x: np.ndarray) -> np.ndarray:
    """Logistic function in float64 (no overflow warning for large |x|)."""
    x = np.asarray(x, dtype=np.float64)
    return np.exp(-np.logaddexp(0.0, -x))


def stream_gates(inj: np.ndarray) -> np.ndarray:
    """g_tc = 2*sigmoid(inj_tc / 4): how strongly the FFN output enters stream c at row t."""
    return 2.0 * sigmoid(np.asarray(inj, dtype=np.float64) / 4.0)


def hc4_l47_ref(R, inj, hh, sgv, yr, params: Hc4L47, dW=None) -> np.ndarray:
    """R' [T, streams, n] float64 from dump rows; `dW` [n, h] is added to W_sd when given."""
    w = np.asarray(params.w_sd, dtype=np.float64)
    if dW is not None:
        w = w + np.asarray(dW, dtype=np.float64)
    hh = np.asarray(hh, dtype=np.float64)
    shared = hh @ w.T  # [T, n]
    bo = np.asarray(yr, dtype=np.float64) + sigmoid(sgv)[:, None] * shared
    return np.asarray(R, dtype=np.float64) + bo[:, None, :] * stream_gates(inj)[:, :, None]


def rms_norm_ref(x: np.ndarray, eps: float) -> np.ndarray:
    """x * rsqrt(mean(x^2) + eps) over the last axis, float64."""
    x = np.asarray(x, dtype=np.float64)
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)


def rmsnorm_l47_ref(R, hh, params: RmsnormL47, dW=None) -> np.ndarray:
    """R' [T, n] float64: the residual after the last layer's FFN write."""
    w = np.asarray(params.w_down, dtype=np.float64)
    if dW is not None:
        w = w + np.asarray(dW, dtype=np.float64)
    ffn = np.asarray(hh, dtype=np.float64) @ w.T
    if params.w_post is not None:
        ffn = rms_norm_ref(ffn, params.eps) * np.asarray(params.w_post, dtype=np.float64)
    return np.asarray(R, dtype=np.float64) + ffn
