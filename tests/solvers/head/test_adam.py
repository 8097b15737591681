"""Adam as a pure transformation: the textbook recursion, numpy and JAX agree, state in and out."""
from __future__ import annotations

import math

import numpy as np
import pytest

from exactedit.solvers.head.adam import AdamConfig, adam_init, adam_update
from exactedit.solvers.head.param import FullRows, LowRank


def _scalar_adam(x, grads, lr, b1, b2, eps):
    """Kingma & Ba, Algorithm 1, one float at a time."""
    m = v = 0.0
    for t, g in enumerate(grads, start=1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        x -= lr * (m / (1 - b1**t)) / (math.sqrt(v / (1 - b2**t)) + eps)
    return x


def test_matches_the_textbook_recursion_elementwise():
    rng = np.random.default_rng(0)
    cfg = AdamConfig(lr=0.03, b1=0.8, b2=0.95, eps=1e-6)
    params = LowRank(rng.standard_normal((3, 2)), rng.standard_normal((5, 2)))
    grads_seq = [LowRank(rng.standard_normal((3, 2)), rng.standard_normal((5, 2))) for _ in range(7)]
    state = adam_init(params)
    x = params
    for g in grads_seq:
        x, state = adam_update(g, state, x, cfg)
    assert state.step == 7
    for field in range(2):
        for idx in np.ndindex(params[field].shape):
            want = _scalar_adam(params[field][idx], [g[field][idx] for g in grads_seq], cfg.lr, cfg.b1,
                                cfg.b2, cfg.eps)
            assert x[field][idx] == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_first_step_moves_each_coordinate_by_lr():
    cfg = AdamConfig(lr=0.01, eps=1e-12)
    params = FullRows(np.zeros((2, 3)))
    grads = FullRows(np.array([[3.0, -1e-3, 50.0], [-2.0, 7.0, 1e-2]]))
    new, _ = adam_update(grads, adam_init(params), params, cfg)
    assert np.allclose(new.d, -cfg.lr * np.sign(grads.d), rtol=1e-8)


def test_inputs_are_not_modified():
    params = FullRows(np.ones((2, 2)))
    grads = FullRows(np.full((2, 2), 0.5))
    state = adam_init(params)
    adam_update(grads, state, params, AdamConfig())
    assert np.array_equal(params.d, np.ones((2, 2))) and not state.m.d.any() and state.step == 0


def test_jax_jitted_update_equals_numpy():
    import jax
    import jax.numpy as jnp

    rng = np.random.default_rng(2)
    cfg = AdamConfig(lr=0.1)
    params = LowRank(rng.standard_normal((3, 1)), rng.standard_normal((4, 1)))
    grads = [LowRank(rng.standard_normal((3, 1)), rng.standard_normal((4, 1))) for _ in range(5)]
    step = jax.jit(adam_update, static_argnames="cfg")
    x_np, s_np = params, adam_init(params)
    x_j = LowRank(*(jnp.asarray(a, jnp.float32) for a in params))
    s_j = adam_init(x_j)._replace(step=jnp.zeros((), jnp.int32))
    for g in grads:
        x_np, s_np = adam_update(g, s_np, x_np, cfg)
        x_j, s_j = step(LowRank(*(jnp.asarray(a, jnp.float32) for a in g)), s_j, x_j, cfg=cfg)
    for a, b in zip(x_np, x_j):
        # float32: 1 - b2**t loses ~1e-4 of its digits at small t (b2 = 0.999); it only rescales a step
        assert np.allclose(a, np.asarray(b), rtol=1e-4, atol=1e-5)


def test_minimizes_a_quadratic():
    cfg = AdamConfig(lr=0.05)
    target = np.array([[1.0, -2.0, 0.5]])
    params = FullRows(np.zeros((1, 3)))
    state = adam_init(params)
    for _ in range(2000):
        params, state = adam_update(FullRows(2 * (params.d - target)), state, params, cfg)
    assert np.allclose(params.d, target, atol=1e-3)


@pytest.mark.parametrize("field, value", [("lr", 0.0), ("lr", float("nan")), ("b1", 1.0), ("b2", -0.1),
                                          ("eps", 0.0)])
def test_config_is_validated(field, value):
    with pytest.raises(ValueError, match=field):
        AdamConfig(**{field: value})
