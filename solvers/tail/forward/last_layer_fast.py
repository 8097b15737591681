"""Layer-47 tail forward, float32 fast path (JAX, jit at the boundary).

Same math as `forward.py` (the float64 reference); the comparison table lives in
tests/solvers/l47/test_forward.py. The jitted functions are pure and differentiable, so the
solvers can take vector-Jacobian products through them. The weights are arguments of the jitted
functions, never constants; the host wrappers run them over bucketed row chunks
(`solvers.tail.forward.buckets`), so any row count reuses one of a few compiled shapes.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from exactedit.solvers.tail.forward.buckets import map_rows
from exactedit.solvers.tail.forward.last_layer_ref import Hc4L47, RmsnormL47

F32 = jnp.float32


@jax.jit
def hc4_l47_jax(R, inj, hh, sgv, yr, w_sd):
    """R' [T, streams, n] = R + (yr + sigmoid(sgv) * hh @ w_sd^T) * 2*sigmoid(inj/4), traceable."""
    bo = yr + jax.nn.sigmoid(sgv)[:, None] * (hh @ w_sd.T)
    return R + bo[:, None, :] * (2.0 * jax.nn.sigmoid(inj / 4.0))[:, :, None]


def _rms_norm(x, eps):
    return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


@jax.jit
def rmsnorm_l47_jax(R, hh, w_down):
    """R' [T, n] = R + hh @ w_down^T, traceable."""
    return R + hh @ w_down.T


def post_norm_jax(y, w_post, eps):
    """rmsnorm(y) * w_post over the last axis: the post-FFN norm (Gemma style), traceable (the
    forward below and the WFLD linearization's VJP through the norm share it)."""
    return _rms_norm(y, eps) * w_post


@jax.jit
def rmsnorm_post_l47_jax(R, hh, w_down, w_post, eps):
    """R' [T, n] = R + rmsnorm(hh @ w_down^T) * w_post (Gemma-style post-FFN norm), traceable."""
    return R + post_norm_jax(hh @ w_down.T, w_post, eps)


def _f32(x):
    return jnp.asarray(np.asarray(x), dtype=F32)


def _with_delta(w, dW):
    w = _f32(w)
    return w if dW is None else w + _f32(dW)


def _rows32(*xs):
    return [np.asarray(x, dtype=np.float32) for x in xs]


def hc4_l47(R, inj, hh, sgv, yr, params: Hc4L47, dW=None) -> np.ndarray:
    """R' [T, streams, n] float32 (numpy) from dump rows; `dW` [n, h] is added to W_sd."""
    return map_rows(hc4_l47_jax, _rows32(R, inj, hh, sgv, yr), _with_delta(params.w_sd, dW))


def rmsnorm_l47(R, hh, params: RmsnormL47, dW=None) -> np.ndarray:
    """R' [T, n] float32 (numpy); `dW` [n, h] is added to W_down."""
    w = _with_delta(params.w_down, dW)
    if params.w_post is None:
        return map_rows(rmsnorm_l47_jax, _rows32(R, hh), w)
    return map_rows(rmsnorm_post_l47_jax, _rows32(R, hh), w, _f32(params.w_post), F32(params.eps))
