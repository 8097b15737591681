"""Linearized logits of the tail in the edited weight: one vector-Jacobian product per token.

At row t the edit dW enters only through z_t = dW @ hh_t (SPEC.md section 5):
    hc4:        R'_c = R_c + (yr + s_t (W + dW) hh_t) g_tc,  s_t = sigmoid(sgv_t), g_tc = 2 sigmoid(inj_tc / 4)
    rmsnorm:    R'   = R + (W + dW) hh_t                        (s_t = 1, one stream, g = 1)
    post-norm:  R'   = R + w_post * y_t / rms(y_t),  y_t = (W + dW) hh_t   (Gemma-style post-FFN norm)
so the first-order change of logit v is <dW, u_tv hh_t^T> with
    u_tv = s_t * sum_c g_tc * (d l_v / d R'_c)    in R^n                          (hc4, rmsnorm)
    u_tv = J_post(y_t)^T (d l_v / d R')                                          (post-norm)
d l_v / d R' being the head's VJP with cotangent W_out[v] (times 1 - tanh^2 under a softcap), and
J_post the RMSNorm's full Jacobian at y_t = W hh_t (W the weights linearized at), normalization
term included: with r = 1 / sqrt(mean(y^2) + eps) and c a cotangent,
    J_post(y)^T c = r (w_post * c) - r^3 / n * y (y . (w_post * c)).
A post-norm tail's R' is not affine in dW, but it is a smooth function of dW @ hh_t alone, so the
linearization is exact to first order at the point it is taken; Gauss-Newton
(`solvers.l47.gauss_newton`) re-linearizes at the shipped point each round and re-scores exactly.
`head_vjp_ref` / `post_norm_vjp_ref` are the numpy float64 analytic VJPs (the reference);
`head_vjp_jax` / `post_norm_vjp_jax` the JAX autodiff fast paths through `solvers.tail.forward.head_fast`
and `solvers.tail.forward.last_layer_fast.post_norm_jax` (the forward's own norm); a test table compares
both with finite differences of the exact forward.
"""
from __future__ import annotations

import dataclasses
from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from exactedit.solvers.tail.forward import head_ref
from exactedit.solvers.tail.forward import head_fast
from exactedit.solvers.tail.forward import last_layer_fast as l47_fast
from exactedit.solvers.tail.forward.buckets import map_rows
from exactedit.solvers.tail.forward.last_layer_ref import sigmoid, stream_gates

CHUNK = 64  # rows per VJP batch


class RowSet(NamedTuple):
    """Dump fields of selected rows, stacked in memory (a duck-typed stand-in for a Dump that
    `tail.residual` reads). rmsnorm rows have inj, sgv and yr set to None."""

    R: np.ndarray
    hh: np.ndarray
    inj: np.ndarray | None = None
    sgv: np.ndarray | None = None
    yr: np.ndarray | None = None

    @property
    def rows(self) -> int:
        return int(self.hh.shape[0])

    def take(self, mask) -> "RowSet":
        """The rows at `mask` (bool or indices)."""
        return RowSet(*(None if x is None else np.asarray(x)[mask] for x in self))


def gather_rows(blocks: Sequence[tuple[object, np.ndarray]]) -> RowSet:
    """RowSet of the rows `ids` of each (dump, ids) block, in order."""
    def take(name):
        parts = [np.asarray(getattr(d, name)[np.asarray(ids, dtype=np.int64)], dtype=np.float32)
                 for d, ids in blocks]
        return np.concatenate(parts, axis=0)

    kind = blocks[0][0].arch if blocks else "hc4"
    if kind == "hc4":
        return RowSet(take("R"), take("hh"), take("inj"), take("sgv"), take("yr"))
    return RowSet(take("R"), take("hh"))


def with_weights(tail, w: np.ndarray):
    """The same tail with the edited tensor (W_sd or the last ffn_down) replaced by `w` [n, h]."""
    w = np.asarray(w, dtype=np.float32)
    if tail.kind == "hc4":
        return dataclasses.replace(tail, l47=tail.l47._replace(w_sd=w))
    return dataclasses.replace(tail, l47=tail.l47._replace(w_down=w))


def editable_weight(tail) -> np.ndarray:
    """The runtime view of the tensor the edit adds to, [n, h] float32."""
    if tail.kind == "hc4":
        return np.asarray(tail.l47.w_sd)
    return np.asarray(tail.l47.w_down)


def has_post_norm(tail) -> bool:
    """Whether the FFN output goes through a post-FFN norm before the residual add (Gemma style)."""
    return tail.kind != "hc4" and tail.l47.w_post is not None


def ffn_gains(tail, rs: RowSet) -> tuple[np.ndarray, np.ndarray]:
    """(s [T], g [T, S]) float64: how dW @ hh reaches each stream of R' (before a post-FFN norm,
    whose Jacobian `linearize` applies on top: s = g = 1 there)."""
    if tail.kind == "hc4":
        return sigmoid(rs.sgv), stream_gates(rs.inj)
    return np.ones(rs.rows), np.ones((rs.rows, 1))


def token_rows(head, ids) -> np.ndarray:
    """float64 [len(ids), n]: rows of the head's runtime view (ids < 0 give zeros)."""
    from exactedit.solvers.tail.passes.vocab_pass import QuantRows

    ids = np.asarray(ids, dtype=np.int64).reshape(-1)
    out = np.zeros((ids.size, head.cols))
    uniq = np.unique(ids[ids >= 0])
    if isinstance(head, QuantRows) and uniq.size:  # gather the raw rows, convert them in one call
        raw = np.concatenate([np.asarray(head.read_raw(int(i), int(i) + 1)) for i in uniq])
        gathered = QuantRows(lambda a, b: raw[a:b], head.qtype, uniq.size, head.cols, runtime=head.runtime)
        values = gathered.read(0, uniq.size)
    else:
        values = np.stack([head.read(int(i), int(i) + 1)[0] for i in uniq]) if uniq.size else None
    for j, i in enumerate(ids):
        if i >= 0:
            out[j] = values[np.searchsorted(uniq, i)]
    return out


# ---- the head's VJP: reference (numpy float64, analytic) ------------------------------------------

def _silu_grad(z):
    s = sigmoid(z)
    return s * (1.0 + z * (1.0 - s))


def head_vjp_ref(tail, Rp, cot) -> np.ndarray:
    """d(cot . mix)/dR' [T, m, S, n] (hc4) or [T, m, n] (rmsnorm), float64; `cot` [T, m, n]."""
    Rp, cot = np.asarray(Rp, dtype=np.float64), np.asarray(cot, dtype=np.float64)
    if tail.kind != "hc4":
        p = tail.mix_params
        w = np.asarray(p.w_norm, dtype=np.float64)
        r = 1.0 / np.sqrt(np.mean(Rp * Rp, axis=-1, keepdims=True) + p.eps)       # [T, 1]
        xbar = cot * w                                                            # [T, m, n]
        dot = np.sum(xbar * Rp[:, None, :], axis=-1, keepdims=True)               # [T, m, 1]
        return r[:, None] * xbar - (r ** 3)[:, None] / Rp.shape[-1] * Rp[:, None, :] * dot
    p = tail.mix_params
    w_onorm = np.asarray(p.w_onorm, dtype=np.float64)
    w_odown = np.asarray(p.w_odown, dtype=np.float64)
    w_oup = np.asarray(p.w_oup, dtype=np.float64)
    T, S, n = Rp.shape
    m = cot.shape[1]
    r = 1.0 / np.sqrt(np.mean(Rp * Rp, axis=-1, keepdims=True) + p.eps)           # [T, S, 1]
    xn = Rp * w_onorm[None] * r                                                   # [T, S, n]
    z = xn.reshape(T, S * n) @ w_odown.T / head_ref.HC_LO_DIVISOR                 # [T, d_lo]
    lo = z * sigmoid(z)
    gate = sigmoid(lo @ w_oup.T).reshape(T, S, n)
    c = head_ref.HC_MIX_SCALE * cot[:, :, None, :]                                # [T, m, 1, n]
    xbar = c * gate[:, None]                                                      # [T, m, S, n]
    abar = (c * xn[:, None]) * (gate * (1.0 - gate))[:, None]                     # [T, m, S, n]
    lobar = abar.reshape(T, m, S * n) @ w_oup                                     # [T, m, d_lo]
    zbar = lobar * _silu_grad(z)[:, None, :]
    xbar = xbar + (zbar @ w_odown).reshape(T, m, S, n) / head_ref.HC_LO_DIVISOR
    wx = xbar * w_onorm[None, None]                                               # d/d(Rp * r)
    dot = np.sum(wx * Rp[:, None], axis=-1, keepdims=True)
    return r[:, None] * wx - (r ** 3)[:, None] / n * Rp[:, None] * dot


# ---- the head's VJP: fast path (JAX float32 autodiff) ---------------------------------------------

def _pull_each(pull, cot):
    """pull(cot[:, j]) for each of the m cotangents, one after another (lax.map) -> [T, m, ...].
    Not jax.vmap: XLA:CPU (jax 0.10.2) miscompiles the batched pull at 64 rows x 16 or more
    cotangents (off by up to 0.2 at production width; tests/solvers/l47/test_jacobian.py,
    test_many_tokens_per_row)."""
    return jnp.swapaxes(jax.lax.map(lambda c: pull(c)[0], jnp.swapaxes(cot, 0, 1)), 0, 1)


@jax.jit
def _hc4_vjp(Rp, cot, w_onorm, w_odown, w_oup, eps):
    _, pull = jax.vjp(lambda r: head_fast.hc4_mix_jax(r, w_onorm, w_odown, w_oup, eps), Rp)
    return _pull_each(pull, cot)


@jax.jit
def _rms_vjp(Rp, cot, w_norm, eps):
    _, pull = jax.vjp(lambda r: head_fast.rmsnorm_mix_jax(r, w_norm, eps), Rp)
    return _pull_each(pull, cot)


def head_vjp_jax(tail, Rp, cot) -> np.ndarray:
    """Same as `head_vjp_ref`, float32 through JAX autodiff (returned as float64). The weights are
    arguments of the jitted VJP; rows go in bucketed chunks (`solvers.tail.forward.buckets`: one compile per
    bucket and cotangent count m, which is fixed within a solve)."""
    f32 = lambda x: jnp.asarray(np.asarray(x), dtype=jnp.float32)  # noqa: E731
    p = tail.mix_params
    Rp, cot = np.asarray(Rp, np.float32), np.asarray(cot, np.float32)
    if tail.kind == "hc4":
        out = map_rows(_hc4_vjp, [Rp, cot], f32(p.w_onorm), f32(p.w_odown), f32(p.w_oup), jnp.float32(p.eps))
    else:
        out = map_rows(_rms_vjp, [Rp, cot], f32(p.w_norm), jnp.float32(p.eps))
    return np.asarray(out, dtype=np.float64)


# ---- the post-FFN norm's VJP: R' = R + rmsnorm(y) * w_post at y = W hh -----------------------------

def post_norm_vjp_ref(y, w_post, eps: float, cot) -> np.ndarray:
    """J_post(y)^T c [T, m, n] float64 for cotangents `cot` [T, m, n] at y [T, n]: the analytic
    VJP of y -> w_post * y / sqrt(mean(y^2) + eps), normalization term included (module doc)."""
    y = np.asarray(y, dtype=np.float64)
    wc = np.asarray(cot, dtype=np.float64) * np.asarray(w_post, dtype=np.float64)          # [T, m, n]
    r = 1.0 / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps)                     # [T, 1]
    dot = np.sum(wc * y[:, None, :], axis=-1, keepdims=True)                            # [T, m, 1]
    return r[:, None] * wc - (r ** 3)[:, None] / y.shape[-1] * y[:, None, :] * dot


@jax.jit
def _post_vjp(hh, cot, w_down, w_post, eps):
    _, pull = jax.vjp(lambda y: l47_fast.post_norm_jax(y, w_post, eps), hh @ w_down.T)
    return _pull_each(pull, cot)


def post_norm_vjp_jax(tail, hh, cot) -> np.ndarray:
    """Same as `post_norm_vjp_ref` at y = hh @ W^T (W the tail's w_down), float32 through JAX
    autodiff of the forward's own norm (returned as float64); bucketed rows as `head_vjp_jax`."""
    f32 = lambda x: jnp.asarray(np.asarray(x), dtype=jnp.float32)  # noqa: E731
    p = tail.l47
    out = map_rows(_post_vjp, [np.asarray(hh, np.float32), np.asarray(cot, np.float32)], f32(p.w_down),
                   f32(p.w_post), jnp.float32(p.eps))
    return np.asarray(out, dtype=np.float64)


def post_norm_vjp(tail, hh, cot, *, reference: bool) -> np.ndarray:
    """u = J_post(W hh)^T cot [T, m, n] float64 for a post-norm tail (reference: numpy float64)."""
    if not reference:
        return post_norm_vjp_jax(tail, hh, cot)
    p = tail.l47
    y = np.asarray(hh, dtype=np.float64) @ np.asarray(p.w_down, dtype=np.float64).T
    return post_norm_vjp_ref(y, p.w_post, p.eps, cot)


# ---- logits and condition vectors at selected rows ------------------------------------------------

class Linearization(NamedTuple):
    """At rows of a RowSet and tokens [T, m] (-1: none): exact logits and their vectors u."""

    logits: np.ndarray   # float64 [T, m] (nan where the token is -1)
    u: np.ndarray        # float64 [T, m, n]


def linearize(tail, rs: RowSet, tokens, *, backend: str = "jax", head_cache: dict | None = None) -> Linearization:
    """Logits l_tv of `tokens` [T, m] at the RowSet's rows through `tail` (whose weights are the
    point of linearization), and u_tv with l_v(W + dW) ~ l_v(W) + u_tv . (dW @ hh_t) (through the
    post-FFN norm's Jacobian at W hh_t where the tail has one).
    `head_cache` (owned by the caller, for one head) keeps head rows already read."""
    tokens = np.asarray(tokens, dtype=np.int64)
    T, m = tokens.shape
    reference = backend == "numpy"
    vjp = head_vjp_ref if reference else head_vjp_jax
    s, g = ffn_gains(tail, rs)
    post = has_post_norm(tail)
    cache = head_cache if head_cache is not None else {}
    missing = [int(i) for i in np.unique(tokens[tokens >= 0]) if int(i) not in cache]
    if missing:
        cache.update(zip(missing, token_rows(tail.head, missing)))
    n = tail.head.cols
    zero = np.zeros(n)
    W = np.stack([cache[int(i)] if i >= 0 else zero for i in tokens.reshape(-1)]).reshape(T, m, n)
    logits = np.full((T, m), np.nan)
    u = np.zeros((T, m, n))
    for a in range(0, T, CHUNK):
        b = min(T, a + CHUNK)
        Rp = tail.residual(rs, slice(a, b), reference=reference)
        mix = np.asarray(tail.mix(Rp, reference=reference), dtype=np.float64)
        raw = np.einsum("tn,tmn->tm", mix, W[a:b])
        cot = W[a:b]
        if tail.softcap is not None:
            lg = head_ref.apply_softcap(raw, tail.softcap)
            cot = cot * (1.0 - (lg / tail.softcap) ** 2)[:, :, None]
        else:
            lg = raw
        dR = vjp(tail, Rp, cot)
        if tail.kind == "hc4":
            u[a:b] = s[a:b, None, None] * np.einsum("tmcn,tc->tmn", dR, g[a:b])
        elif post:
            u[a:b] = post_norm_vjp(tail, rs.hh[a:b], dR, reference=reference)
        else:
            u[a:b] = dR
        logits[a:b] = np.where(tokens[a:b] >= 0, lg, np.nan)
    u[tokens < 0] = 0.0
    return Linearization(logits, u)
