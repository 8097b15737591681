"""The head objective in JAX (float32): pure `(params, data, cfg)` functions; the solver jits once.

Same J as objective.py (the float64 reference, with the analytic gradient); here the gradient is
JAX autodiff, and the tests check the two against each other. Two choices differ for speed and
float32 accuracy, not in value:
- the edit enters as Z (P B) A^T for rank r, so a step costs rows x n x r, not rows x n x |S|;
- LSE' - LSE is computed as log1p(sum_{s in S} p_s expm1(delta_s)), which equals
  logaddexp(LSE_rest, logsumexp_S(l')) - LSE exactly but keeps its digits when the change is tiny
  (KL on anchor rows is such a difference).
Set terms use probabilities, not a masked logsumexp, so an empty set has a zero (not NaN) gradient.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp

from exactedit.solvers.head.adam import AdamConfig, AdamState, adam_update
from exactedit.solvers.head.objective import HeadBatch, Terms, TERM_NAMES, Weights, TargetTerm, SetTerm
from exactedit.solvers.head.param import FullRows, LowRank


class StepData(NamedTuple):
    """What a step reads besides the parameters: the rows and the null-space basis Q (n x k)."""

    batch: HeadBatch
    null: jnp.ndarray


@dataclass(frozen=True)
class StepConfig:
    """Static (hashable) configuration of a jitted step."""

    weights: Weights
    adam: AdamConfig


def to_device(batch: HeadBatch, null, dtype=jnp.float32) -> StepData:
    """Move a numpy batch to JAX arrays once (float arrays to `dtype`, index arrays as int32)."""

    def conv(x):
        x = jnp.asarray(x)
        if jnp.issubdtype(x.dtype, jnp.floating):
            return x.astype(dtype)
        if jnp.issubdtype(x.dtype, jnp.integer):
            return x.astype(jnp.int32)
        return x

    return StepData(jax.tree_util.tree_map(conv, batch), jnp.asarray(null, dtype=dtype))


def _project_out(x, q):
    return x - q @ (q.T @ x)


def delta_w(params, null):
    """dW (|S| x n) of the parameters (same maps as param.delta_w)."""
    if isinstance(params, FullRows):
        return _project_out(params.d.T, null).T
    return params.a @ _project_out(params.b, null).T


def delta_logits(params, data: StepData):
    """delta = Z dW^T (rows x |S|), computed in the cheap order for each parameterization."""
    z = data.batch.z
    if isinstance(params, FullRows):
        return z @ delta_w(params, data.null).T
    return (z @ _project_out(params.b, data.null)) @ params.a.T


def _mean(values, rows):
    return jnp.sum(values) / max(rows.shape[0], 1)


def _target_logit(term: TargetTerm, ls):
    inside = term.slot >= 0
    picked = ls[term.rows, jnp.where(inside, term.slot, 0)]
    return jnp.where(inside, picked, term.logit)


def _set_term(term: SetTerm, p2, lse2):
    p_out = jnp.exp(term.lse_out - lse2[term.rows])
    p_set = p_out + jnp.sum(jnp.where(term.mask, p2[term.rows], 0.0), axis=1)
    return _mean(-jnp.log1p(-p_set), term.rows)


def terms(params, data: StepData, w: Weights) -> Terms:
    """Every weighted term of J and the total, as JAX scalars."""
    b = data.batch
    delta = delta_logits(params, data)
    ls = b.base_s + delta
    p = jnp.exp(b.base_s - b.lse[:, None])
    dlse = jnp.log1p(jnp.sum(p * jnp.expm1(delta), axis=1))
    lse2 = b.lse + dlse
    p2 = jnp.exp(ls - lse2[:, None])
    zero = jnp.zeros((), ls.dtype)
    values = dict.fromkeys(TERM_NAMES, zero)
    if w.nll:
        values["nll"] = w.nll * _mean(lse2[b.nll.rows] - _target_logit(b.nll, ls), b.nll.rows)
    if w.margin:
        gap = _target_logit(b.margin.cho, ls) - _target_logit(b.margin.rej, ls)
        values["margin"] = w.margin * _mean(jax.nn.softplus(w.margin_m - gap), b.margin.cho.rows)
    if w.ul:
        values["opener"] = w.ul * _set_term(b.opener, p2, lse2)
    if w.close:
        values["closer"] = w.close * _set_term(b.closer, p2, lse2)
    if w.kl:
        rows = b.anchor
        kl = jnp.sum(-p[rows] * delta[rows], axis=1) + dlse[rows]
        values["kl"] = w.kl * _mean(kl, rows)
    if w.guard:
        h = jax.nn.relu(-dlse[b.guard] - w.guard_eps)
        values["guard"] = w.guard * _mean(h * h, b.guard)
    if w.ridge:
        dw = delta_w(params, data.null)
        values["ridge"] = w.ridge * jnp.sum(dw * dw)
    values["total"] = sum(values[name] for name in TERM_NAMES)
    return Terms(**values)


def loss(params, data: StepData, w: Weights):
    return terms(params, data, w).total


def value_and_grad(params, data: StepData, w: Weights):
    """(Terms, dJ/dparams) by autodiff."""

    def total_with_terms(p):
        t = terms(p, data, w)
        return t.total, t

    (_, t), grads = jax.value_and_grad(total_with_terms, has_aux=True)(params)
    return t, grads


def train_step(params, state: AdamState, data: StepData, cfg: StepConfig):
    """One Adam step; B (or D) is re-projected into the null space afterwards. Returns
    (params, state, terms at the old params)."""
    t, grads = value_and_grad(params, data, cfg.weights)
    params, state = adam_update(grads, state, params, cfg.adam)
    if isinstance(params, LowRank):
        params = LowRank(params.a, _project_out(params.b, data.null))
    else:
        params = FullRows(_project_out(params.d.T, data.null).T)
    return params, state, t


#: `train_step` jitted once per process (cfg static): every solve and bench shares its compiled programs
train_step_jit = jax.jit(train_step, static_argnames="cfg")
