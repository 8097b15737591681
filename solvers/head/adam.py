"""Adam (Kingma & Ba, 2015) as a pure transformation: state in, state out.

Parameters and gradients are NamedTuples of arrays (FullRows, LowRank). The arithmetic uses only
operators that numpy and jax.numpy share, so the same `adam_update` runs in the numpy reference
loop and inside the solver's jitted JAX step; the step counter may be a Python int or a traced
array.

    m_t = b1 m + (1 - b1) g          v_t = b2 v + (1 - b2) g^2
    x  -= lr * (m_t / (1 - b1^t)) / (sqrt(v_t / (1 - b2^t)) + eps)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple

import math


@dataclass(frozen=True)
class AdamConfig:
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self):
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"Adam lr must be finite and > 0, got {self.lr!r}")
        for name in ("b1", "b2"):
            value = getattr(self, name)
            if not 0 <= value < 1:
                raise ValueError(f"Adam {name} must be in [0, 1), got {value!r}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"Adam eps must be finite and > 0, got {self.eps!r}")


class AdamState(NamedTuple):
    step: Any  # int, or a 0-d array inside jit
    m: Any     # like params
    v: Any     # like params


def _map(fn, *trees):
    first = trees[0]
    return type(first)(*(fn(*leaves) for leaves in zip(*trees)))


def adam_init(params) -> AdamState:
    zeros = _map(lambda x: x * 0, params)
    return AdamState(step=0, m=zeros, v=zeros)


def adam_update(grads, state: AdamState, params, cfg: AdamConfig):
    """One Adam step: returns (new params, new state)."""
    step = state.step + 1
    m = _map(lambda m, g: cfg.b1 * m + (1 - cfg.b1) * g, state.m, grads)
    v = _map(lambda v, g: cfg.b2 * v + (1 - cfg.b2) * g * g, state.v, grads)
    c1 = 1 - cfg.b1 ** step
    c2 = 1 - cfg.b2 ** step
    new = _map(lambda x, m, v: x - cfg.lr * (m / c1) / ((v / c2) ** 0.5 + cfg.eps), params, m, v)
    return new, AdamState(step=step, m=m, v=v)
