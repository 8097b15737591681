"""Head forward, float32 fast paths: the mix in JAX (jit at the boundary), logits by a
pluggable matmul strategy.

The mix functions are pure and differentiable (the solvers take VJPs through them). The weights
are arguments of the jitted functions, never constants baked into the program; the host wrappers
(`hc4_mix`, `rmsnorm_mix`) run them over bucketed row chunks (`solvers.tail.forward.buckets`), so any row
count reuses one of a few compiled shapes. The
head matmul goes through a `Matmul` strategy so that an engine-faithful product (activations
quantized the way the engine does it, dot products on the raw blocks) can be plugged in later
without touching the streaming pass: a strategy prepares the activations once, then turns a
range of head rows into a float32 logits tile, reading whatever it needs from the RowSource.
"""
from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from exactedit.solvers.tail.forward.buckets import map_rows
from exactedit.solvers.tail.forward.head_ref import HC_LO_DIVISOR, HC_MIX_SCALE, Hc4Head, RmsnormHead

F32 = jnp.float32


def _rms_scale(x, eps):
    return jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps)


@jax.jit
def hc4_mix_jax(Rp, w_onorm, w_odown, w_oup, eps):
    """mix [T, n] from R' [T, streams, n]; traceable float32 version of `hc4_mix_ref`."""
    T, streams, n = Rp.shape
    xn = Rp * w_onorm[None] * _rms_scale(Rp, eps)
    lo = jax.nn.silu((xn.reshape(T, streams * n) @ w_odown.T) / HC_LO_DIVISOR)
    gates = jax.nn.sigmoid(lo @ w_oup.T).reshape(T, streams, n)
    return HC_MIX_SCALE * jnp.sum(xn * gates, axis=1)


@jax.jit
def rmsnorm_mix_jax(Rp, w_norm, eps):
    """mix [T, n] = R' * rsqrt(mean(R'^2) + eps) * w_norm; traceable."""
    return Rp * _rms_scale(Rp, eps) * w_norm


def _f32(x):
    return jnp.asarray(np.asarray(x), dtype=F32)


def _host32(x):
    return np.asarray(x, dtype=np.float32)


def hc4_mix(Rp, head: Hc4Head) -> np.ndarray:
    """mix [T, n] float32 (numpy) from R' [T, streams, n] (bucketed row chunks, weights as arguments)."""
    return map_rows(hc4_mix_jax, [_host32(Rp)], _f32(head.w_onorm), _f32(head.w_odown), _f32(head.w_oup),
                    F32(head.eps))


def rmsnorm_mix(Rp, head: RmsnormHead) -> np.ndarray:
    """mix [T, n] float32 (numpy) from R' [T, n] (bucketed row chunks, weights as arguments)."""
    return map_rows(rmsnorm_mix_jax, [_host32(Rp)], _f32(head.w_norm), F32(head.eps))


class Matmul(Protocol):
    """How head rows [start, stop) become logits for the prepared activations."""

    name: str

    def prepare(self, mix: np.ndarray) -> Any:
        """Convert the activations [T, n] once per pass (cast, quantize, ...)."""

    def tile(self, prepared: Any, source, start: int, stop: int) -> np.ndarray:
        """float32 logits [T, stop - start] for head rows [start, stop) of `source`."""


class Sgemm:
    """float32 BLAS product: mix32 @ W_tile^T, W_tile the source's dequantized float32 rows."""

    name = "sgemm"

    def prepare(self, mix: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(mix, dtype=np.float32)

    def tile(self, prepared: np.ndarray, source, start: int, stop: int) -> np.ndarray:
        return prepared @ source.read(start, stop).T

    def __repr__(self) -> str:
        return "Sgemm()"
