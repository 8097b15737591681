"""The rewritten unit's down column, solved through the exact tail where the unit fires.

Unit j, rewritten as a detector (solvers.l47.gated.design), is ~0 off its phrase's contexts, so its
down column d acts only there: at context r the residual is y_r = y0_r + a_r d (y0: the model
without the unit; a_r: the unit's activation as the engine computes it) and the logits are
z_r = H rmsnorm(y_r) (the final norm and head; a softcap when the model has one). With a post-FFN
norm (Gemma 3) the unit's write is normalized with the rest of the FFN's output before the add:
y_r = R_r + w_post * rmsnorm(f0_r + a_r d) (R: the residual before the FFN, f0: the FFN's output
without the unit), and the gradient goes through that norm too. The column is
    argmin_d  mean_r CE(q_r, softmax(z_r(d)))  +  ridge * |a d|^2 / mean_r |y0_r|^2
(a: the contexts' median activation; the ridge term is scale-free: the column's write against the
residual's size), where q_r is the context's own distribution with the phrase's final tokens
lowered by strength * max(gap_r + margin, margin) nats (gap_r: their best logit over the best other
non-special token's: at strength 1 they end `margin` below it, and `margin` lower than they were
where they already are below it: a minority continuation after the prefix is still the phrase,
and only the phrase's contexts see the column), the freed mass going to the
other non-special tokens in proportion to their probability and the specials kept where they were
(the turn end is never what a cut phrase turns into).

Why not the dense solve's Gauss-Newton on per-token logit targets: one column writes one direction
at every context, the head rows of the phrase's token and its alternatives are nearly parallel
(" an" and " a" on Qwen), so the least-norm column that meets the targets is large against the
residual, the final norm's first-order model misses by its second-order term (the linear solve was
within 2.2 nats, the exact change 9.5 nats off, every alternative 6 nats lower: the distribution
flattened at the contexts) and the rounds diverged. The cross-entropy to q is the exact objective
(the context's distribution kept, the phrase's token moved), solved with its exact gradient.

Each context row keeps its own `top` tokens of the base distribution (plus the phrase's tokens and
the specials) as the softmax's support, so a function evaluation costs rows x top x n, not the
vocabulary; after the solve one full-vocabulary pass adds every token whose probability rose above
`support_floor` outside its row's support, and the solve repeats from where it stopped
(`rounds`). The shipped column is the nearest codes within each row's own block scales of the
stored ffn_down (solvers.l47.gated.down.set_column): L-BFGS-B keeps |d_i| within the codes' range, so
every other byte of the tensor is kept.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.optimize as sopt

from exactedit.solvers.l47.gated.config import GatedError

__all__ = ["ColumnConfig", "ColumnProblem", "ColumnSolve", "column_loss", "column_problem", "solve_column",
           "target_distribution", "top_tokens"]


@dataclass(frozen=True)
class ColumnConfig:
    """The column's solve: `margin` nats below the best other token at strength 1, `ridge` on the
    column's write (scale-free, see the module doc), `top` tokens per context as the support,
    `support_floor` the probability above which a token outside it joins, `rounds` of that,
    L-BFGS-B's `maxiter` and `gtol`."""

    margin: float = 1.0
    ridge: float = 1e-3
    top: int = 256
    support_floor: float = 1e-4
    rounds: int = 3
    maxiter: int = 500
    gtol: float = 1e-9

    def __post_init__(self):
        for name in ("margin", "ridge", "support_floor", "gtol"):
            v = getattr(self, name)
            if not (isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0):
                raise GatedError("ColumnConfig", name, f"expected a finite number >= 0, got {v!r}")
        for name in ("top", "rounds", "maxiter"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise GatedError("ColumnConfig", name, f"expected an integer >= 1, got {v!r}")


@dataclass(frozen=True, eq=False)
class ColumnProblem:
    """One unit's contexts: y0 [T, n] the residual without the unit, a [T] its activation, the
    final norm's weight w_norm [n] and eps, softcap (None: none); with a post-FFN norm (w_post [n],
    None: none) y0 is the residual before the FFN and f0 [T, n] the FFN's output without the unit;
    per row its support tok [T, K]
    (token ids, -1 pads) with the head's rows there Hs [T, K, n] (the stored float32 values, held
    in float64 once: the objective's two batched products per evaluation then run in BLAS without
    a cast; on Qwen's demo the cast each call was 66% of the gated solve) and the base logits z0
    [T, K], and rej [T, K] bool (the phrase's final tokens), spec [T, K] bool (the specials).
    Without a post-FFN norm the fast path needs no Hs: the residual moves along d only, so each
    support logit is s_r (c0 + a_r HU (w_norm * d))[idx] (one [U, n] product per evaluation over
    the union of the supports, not T x K x n), and the gradient folds back through the same
    product (`_loss_fast`); Hs is then built only for the reference (`column_problem(reference=True)`)."""

    y0: np.ndarray
    a: np.ndarray
    w_norm: np.ndarray
    eps: float
    softcap: float | None
    tok: np.ndarray
    Hs: np.ndarray | None
    z0: np.ndarray
    rej: np.ndarray
    spec: np.ndarray
    f0: np.ndarray | None = None
    w_post: np.ndarray | None = None
    HU: np.ndarray | None = None      # [U, n] float64: the union of the rows' supports (the fast path)
    idx: np.ndarray | None = None     # [T, K] int64: each support entry's row of HU (0 at the pads)
    c0: np.ndarray | None = None      # [T, K] float64: H_v . (w_norm * y0_r), the support's logits before the norm

    @property
    def rows(self) -> int:
        return int(self.y0.shape[0])


def _mix(y, w_norm, eps):
    s = 1.0 / np.sqrt(np.mean(y * y, axis=-1, keepdims=True) + eps)
    return y * s * w_norm, s


def _residual(y0, a, d, f0, w_post, eps):
    """(y [T, n], the post norm's (f, scale) or None): the residual with column d written."""
    if w_post is None:
        return y0 + a[:, None] * d[None, :], None
    f = f0 + a[:, None] * d[None, :]
    fm, sf = _mix(f, w_post, eps)
    return y0 + fm, (f, sf)


def _rms_back(g, x, s, w):
    """The vector-Jacobian product of x -> x * s(x) * w (s = 1/sqrt(mean(x^2) + eps)) at g."""
    gw = g * w
    return s * gw - (s ** 3) * np.sum(gw * x, axis=1, keepdims=True) * x / x.shape[1]


def _logits(p: ColumnProblem, d):
    y, post = _residual(p.y0, p.a, d, p.f0, p.w_post, p.eps)
    m, s = _mix(y, p.w_norm, p.eps)
    raw = np.matmul(p.Hs, m[:, :, None])[:, :, 0]
    z = raw if p.softcap is None else p.softcap * np.tanh(raw / p.softcap)
    z = np.where(p.tok >= 0, z, -np.inf)
    return z, raw, y, m, s, post


def target_distribution(z0, rej, spec, valid, strength: float, margin: float, *, lower: bool = True) -> np.ndarray:
    """q [T, K] (module doc): the base softmax of z0 over `valid`, the `rej` tokens lowered by
    strength * max(gap + margin, margin), their freed mass to the other non-special tokens in
    proportion, the specials unchanged. With `lower` False the `rej` tokens (a style's tokens) are
    raised instead: the non-special tokens' share is softmax(z0 + delta [rej]) with delta =
    strength * max(margin - gap, margin) (at strength 1 their best logit ends `margin` above the
    best other's), the specials unchanged."""
    z0 = np.where(valid, z0, -np.inf)
    lse = np.logaddexp.reduce(z0, axis=1, keepdims=True)
    p0 = np.where(valid, np.exp(z0 - lse), 0.0)
    other = valid & ~rej & ~spec
    best_rej = np.max(np.where(rej, z0, -np.inf), axis=1)
    best_other = np.max(np.where(other, z0, -np.inf), axis=1)
    gap = np.where(np.isfinite(best_rej) & np.isfinite(best_other), best_rej - best_other, -np.inf)
    if not lower:
        delta = np.where(np.isfinite(best_rej), float(strength) * np.maximum(float(margin) - np.where(
            np.isfinite(gap), gap, 0.0), float(margin)), 0.0)
        moved = valid & ~spec
        zz = np.where(moved, z0 + np.where(rej, delta[:, None], 0.0), -np.inf)
        share = np.exp(zz - np.logaddexp.reduce(zz, axis=1, keepdims=True))
        mass = np.sum(np.where(moved, p0, 0.0), axis=1, keepdims=True)
        q = np.where(moved, share * mass, p0)
        return q / q.sum(axis=1, keepdims=True)
    delta = np.where(np.isfinite(gap), float(strength) * np.maximum(gap + float(margin), float(margin)), 0.0)
    q = p0.copy()
    q[rej] = (p0 * np.exp(-delta)[:, None])[rej]
    freed = np.sum(np.where(rej, p0 - q, 0.0), axis=1)
    mass = np.sum(np.where(other, p0, 0.0), axis=1)
    grow = np.where(mass > 0, 1.0 + freed / np.maximum(mass, 1e-300), 1.0)
    q = np.where(other, p0 * grow[:, None], q)
    return q / q.sum(axis=1, keepdims=True)


def _ridge_scale(p: ColumnProblem, ridge: float) -> float:
    a_med = float(np.median(np.abs(p.a))) if p.a.size else 1.0
    ref = p.y0 if p.w_post is None else p.f0          # the write against what it is added to
    return ridge * a_med ** 2 / max(float(np.mean(np.sum(ref * ref, axis=1))), 1e-30)


def _fast_logits(p: ColumnProblem, d):
    """(z [T, K] masked, raw, lin = raw / s, s [T]) without Hs (the class doc's fast path)."""
    d = np.asarray(d, np.float64)
    n = d.size
    y2 = np.einsum("tn,tn->t", p.y0, p.y0) + 2.0 * p.a * (p.y0 @ d) + p.a * p.a * float(d @ d)
    s = 1.0 / np.sqrt(y2 / n + p.eps)
    lin = p.c0 + p.a[:, None] * (p.HU @ (p.w_norm * d))[p.idx]
    raw = s[:, None] * lin
    z = raw if p.softcap is None else p.softcap * np.tanh(raw / p.softcap)
    return np.where(p.tok >= 0, z, -np.inf), raw, lin, s


def _loss_fast(p: ColumnProblem, q, d, ridge: float) -> tuple[float, np.ndarray]:
    """`column_loss` without Hs: raw_r = s_r lin_r, lin_r = c0_r + a_r (HU (w d))[idx_r]; the
    gradient of the norm (m = s w y) folded back: sum_r a_r [s_r w (H^T draw_r) - s_r^3 / n
    (draw_r . lin_r) y_r], the first term one HU^T product of the draws scattered to the union."""
    d = np.asarray(d, np.float64)
    n, T = d.size, p.rows
    z, raw, lin, s = _fast_logits(p, d)
    valid = p.tok >= 0
    lse = np.logaddexp.reduce(z, axis=1, keepdims=True)
    logp = np.where(valid, z - lse, 0.0)
    loss = -float(np.sum(q * logp)) / T
    dz = (np.where(valid, np.exp(logp), 0.0) - q) / T
    draw = dz if p.softcap is None else dz * (1.0 - np.tanh(raw / p.softcap) ** 2)
    draw = np.where(valid, draw, 0.0)
    acc = np.bincount(p.idx.ravel(), weights=((p.a * s)[:, None] * draw).ravel(), minlength=p.HU.shape[0])
    beta = p.a * s ** 3 / n * np.sum(draw * lin, axis=1)
    grad = p.w_norm * (acc @ p.HU) - (beta @ p.y0 + float(beta @ p.a) * d)
    scale = _ridge_scale(p, ridge)
    return loss + scale * float(d @ d), grad + 2.0 * scale * d


def column_loss(p: ColumnProblem, q, d, ridge: float, *, reference: bool = False) -> tuple[float, np.ndarray]:
    """(the module doc's objective at column d [n], its exact gradient [n]), float64; the fast
    path (`_loss_fast`) where the problem has one, else (or with `reference`) through Hs."""
    if p.HU is not None and not reference:
        return _loss_fast(p, q, d, ridge)
    if p.Hs is None:
        raise GatedError("column", "reference", "the problem was built without Hs (column_problem(reference=True))")
    d = np.asarray(d, np.float64)
    z, raw, y, m, s, post = _logits(p, d)
    lse = np.logaddexp.reduce(z, axis=1, keepdims=True)
    logp = np.where(p.tok >= 0, z - lse, 0.0)
    T = p.rows
    loss = -float(np.sum(q * logp)) / T
    dz = (np.where(p.tok >= 0, np.exp(logp), 0.0) - q) / T
    draw = dz if p.softcap is None else dz * (1.0 - np.tanh(raw / p.softcap) ** 2)
    dm = np.matmul(draw[:, None, :], p.Hs)[:, 0, :]
    dy = _rms_back(dm, y, s, p.w_norm)
    if post is not None:
        f, sf = post
        dy = _rms_back(dy, f, sf, p.w_post)
    grad = np.sum(p.a[:, None] * dy, axis=0)
    scale = _ridge_scale(p, ridge)
    loss += scale * float(d @ d)
    grad = grad + 2.0 * scale * d
    return loss, grad


def _post_of(tail):
    """(w_post float64 [n], its eps) of an rmsnorm tail with a post-FFN norm, else (None, None)."""
    l47 = getattr(tail, "l47", None)
    w_post = getattr(l47, "w_post", None)
    if w_post is None:
        return None, None
    return np.asarray(w_post, np.float64).reshape(-1), float(l47.eps)


def top_tokens(tail, y0, top: int, *, tile_rows: int = 8192, f0=None) -> np.ndarray:
    """int64 [T, top]: each row's `top` tokens of the base logits (the model without the unit:
    d = 0), one streamed float64 pass over the head; the same for every strength of a unit
    (`column_problem`'s `top_ids`)."""
    y0 = np.asarray(y0, np.float64)
    T = y0.shape[0]
    mp = tail.mix_params
    w_post, _ = _post_of(tail)
    f0 = None if f0 is None else np.asarray(f0, np.float64)
    y_base, _ = _residual(y0, np.zeros(T), np.zeros(y0.shape[1]), f0, w_post, float(mp.eps))
    m0, _ = _mix(y_base, np.asarray(mp.w_norm, np.float64), float(mp.eps))
    head = tail.head
    V = int(head.rows)
    best_z = np.full((T, 0), -np.inf)
    best_i = np.zeros((T, 0), np.int64)
    for start in range(0, V, tile_rows):
        stop = min(V, start + tile_rows)
        z = m0 @ np.asarray(head.read(start, stop), np.float64).T
        cz = np.concatenate([best_z, z], axis=1)
        ci = np.concatenate([best_i, np.broadcast_to(np.arange(start, stop), z.shape)], axis=1)
        k = min(top, cz.shape[1])
        sel = np.argpartition(-cz, k - 1, axis=1)[:, :k]
        best_z, best_i = np.take_along_axis(cz, sel, 1), np.take_along_axis(ci, sel, 1)
    return best_i


def column_problem(tail, y0, a, rej_ids: Sequence[Sequence[int]], specials: Sequence[int], top: int, *,
                   extra: Sequence[Sequence[int]] | None = None, tile_rows: int = 8192,
                   f0=None, top_ids=None, reference: bool = False) -> ColumnProblem:
    """The contexts' ColumnProblem from an rmsnorm `tail` (its final norm and streamed head): each
    row's support is its `top` tokens of the base logits (`top_ids` when the caller has them:
    `top_tokens`), its phrase tokens `rej_ids[r]`, the specials and `extra[r]` (tokens a previous
    round found rising outside the support). With the tail's post-FFN norm, y0 is the residual
    before the FFN and `f0` the FFN's output without the unit (required there, refused without
    one), and the problem holds Hs; without, it holds the fast path's union (the class doc), and
    Hs too with `reference`."""
    y0 = np.asarray(y0, np.float64)
    T = y0.shape[0]
    mp = tail.mix_params
    w_norm = np.asarray(mp.w_norm, np.float64)
    w_post, eps_post = _post_of(tail)
    if (w_post is None) != (f0 is None):
        raise GatedError("column", "f0", "the FFN's output without the unit is needed with a post-FFN norm, "
                         "and only there" if w_post is not None else "given for a tail without a post-FFN norm")
    if w_post is not None:
        f0 = np.asarray(f0, np.float64)
        if f0.shape != y0.shape:
            raise GatedError("column", "f0", f"expected {list(y0.shape)}, got {list(f0.shape)}")
        if eps_post != float(mp.eps):
            raise GatedError("column", "eps", f"the post-FFN norm's eps {eps_post} differs from the final norm's "
                             f"{float(mp.eps)} (one eps is modelled)")
    best_i = top_tokens(tail, y0, top, tile_rows=tile_rows, f0=f0) if top_ids is None else np.asarray(top_ids)
    y_base, _ = _residual(y0, np.zeros(T), np.zeros(y0.shape[1]), f0, w_post, float(mp.eps))
    m0, s0 = _mix(y_base, w_norm, float(mp.eps))
    head = tail.head
    V = int(head.rows)
    sets = []
    for r in range(T):
        s = set(int(x) for x in best_i[r]) | {int(x) for x in rej_ids[r]} | {int(x) for x in specials}
        if extra is not None:
            s |= {int(x) for x in extra[r]}
        sets.append(sorted(x for x in s if 0 <= x < V))
    K = max(len(s) for s in sets)
    tok = np.full((T, K), -1, np.int64)
    for r, s in enumerate(sets):
        tok[r, :len(s)] = s
    want = np.unique(tok[tok >= 0])
    HU = np.zeros((want.size, y0.shape[1]), np.float64)
    for start in range(0, V, tile_rows):            # the support's head rows (float32 values held in float64)
        stop = min(V, start + tile_rows)
        lo, hi = np.searchsorted(want, [start, stop])
        if hi > lo:
            HU[lo:hi] = np.asarray(head.read(start, stop), np.float32)[want[lo:hi] - start]
    idx = np.where(tok >= 0, np.searchsorted(want, np.maximum(tok, 0)), 0)
    fast = w_post is None
    Hs = HU[idx] if (not fast or reference) else None
    c0 = np.stack([HU[idx[r]] @ (w_norm * y_base[r]) for r in range(T)]) if fast else None   # H_v . (w y0_r)
    raw = s0 * c0 if fast else np.matmul(Hs, m0[:, :, None])[:, :, 0]
    z0 = raw if tail.softcap is None else tail.softcap * np.tanh(raw / tail.softcap)
    rej = np.zeros_like(tok, bool)
    spec = np.isin(tok, np.asarray(list(specials), np.int64)) & (tok >= 0)
    for r in range(T):
        rej[r] = np.isin(tok[r], np.asarray(list(rej_ids[r]), np.int64)) & (tok[r] >= 0)
    return ColumnProblem(y0, np.asarray(a, np.float64), w_norm, float(mp.eps), tail.softcap, tok, Hs,
                         np.where(tok >= 0, z0, -np.inf), rej, spec, f0, w_post,
                         HU if fast else None, idx if fast else None, c0 if fast else None)


@dataclass(frozen=True)
class ColumnSolve:
    d: np.ndarray                 # float64 [n] the column
    loss: float
    n_iter: int
    message: str
    support: int                  # the largest support per row at the end
    added: int                    # tokens the full-vocabulary checks added
    rejected_logp: tuple          # (base, solved): mean log-prob of the phrase's tokens at the contexts
    others_kl: float              # mean KL(q || solved) at the contexts


def _support_logits(p: ColumnProblem, d) -> np.ndarray:
    """z [T, K] at column d over each row's support (-inf at the pads)."""
    if p.HU is not None:
        return _fast_logits(p, d)[0]
    return _logits(p, d)[0]


def _outside(tail, p: ColumnProblem, d, floor: float, tile_rows: int) -> list[list[int]]:
    """Per row, the tokens outside its support whose probability at column d is above `floor`:
    one streamed full-vocabulary pass in float32 (a screen: which tokens join the support, not a
    number the solve reports), each tile's tokens above `floor` against the support's own
    log-sum-exp (at most the whole vocabulary's, so no token is missed) kept as candidates and
    checked against the whole vocabulary's at the end."""
    y, _ = _residual(p.y0, p.a, np.asarray(d, np.float64), p.f0, p.w_post, p.eps)
    m, _ = _mix(y, p.w_norm, p.eps)
    m = m.astype(np.float32)
    z_sup = _support_logits(p, d)
    lse_sup = np.logaddexp.reduce(z_sup, axis=1)
    V = int(tail.head.rows)
    lse = np.full(p.rows, -np.inf)
    cand = []
    for start in range(0, V, tile_rows):
        stop = min(V, start + tile_rows)
        zz = (m @ np.asarray(tail.head.read(start, stop), np.float32).T).astype(np.float64)
        if tail.softcap is not None:
            zz = tail.softcap * np.tanh(zz / tail.softcap)
        lse = np.logaddexp(lse, np.logaddexp.reduce(zz, axis=1))
        rows, cols = np.nonzero(zz - lse_sup[:, None] > np.log(floor))
        cand += [(int(r), start + int(c), float(zz[r, c])) for r, c in zip(rows, cols)]
    hits: list[list[int]] = [[] for _ in range(p.rows)]
    for r, t, zv in cand:
        if zv - lse[r] > np.log(floor) and t not in p.tok[r]:
            hits[r].append(t)
    return hits


def solve_column(tail, y0, a, rej_ids, specials, strength: float, cfg: ColumnConfig, *, bound=None,
                 d0=None, tile_rows: int = 8192, f0=None, top_ids=None, lower: bool = True) -> ColumnSolve:
    """The column of the module doc at `strength`: `y0` [T, n] and `a` [T] at the unit's contexts,
    `rej_ids[r]` the phrase's final tokens there; `bound` [n] the largest |d_i| the stored codes
    can hold (None: unbounded); `d0` a start (a neighbouring strength's column); `f0` with a
    post-FFN norm (column_problem); `top_ids` the contexts' `top_tokens` when the caller has them
    (the same for every strength); `lower` False: the `rej_ids` tokens are raised
    (`target_distribution`: a style's tokens at its decision rows)."""
    y0 = np.asarray(y0, np.float64)
    if y0.ndim != 2 or y0.shape[0] == 0:
        raise GatedError("column", "contexts", f"expected residual rows [T >= 1, n], got {list(y0.shape)}")
    extra = [[] for _ in range(y0.shape[0])]
    d = np.zeros(y0.shape[1]) if d0 is None else np.asarray(d0, np.float64).copy()
    added, n_iter, msg, p, q, loss = 0, 0, "", None, None, 0.0
    bounds = None if bound is None else [(-float(b), float(b)) for b in np.asarray(bound, np.float64)]
    if bound is not None:
        d = np.clip(d, -np.asarray(bound), np.asarray(bound))
    if top_ids is None:
        top_ids = top_tokens(tail, y0, cfg.top, tile_rows=tile_rows, f0=f0)
    for _ in range(cfg.rounds):
        p = column_problem(tail, y0, a, rej_ids, specials, cfg.top, extra=extra, tile_rows=tile_rows, f0=f0,
                           top_ids=top_ids)
        q = target_distribution(p.z0, p.rej, p.spec, p.tok >= 0, strength, cfg.margin, lower=lower)
        res = sopt.minimize(lambda x: column_loss(p, q, x, cfg.ridge), d, jac=True, method="L-BFGS-B", bounds=bounds,
                            options={"maxiter": cfg.maxiter, "gtol": cfg.gtol, "ftol": 1e-13})
        d, n_iter, msg, loss = np.asarray(res.x, np.float64), n_iter + int(res.nit), str(res.message), float(res.fun)
        new = _outside(tail, p, d, cfg.support_floor, tile_rows)
        count = sum(len(x) for x in new)
        if not count:
            break
        added += count
        extra = [e + n for e, n in zip(extra, new)]
    z = _support_logits(p, d)
    logp = z - np.logaddexp.reduce(z, axis=1, keepdims=True)
    lp0 = p.z0 - np.logaddexp.reduce(p.z0, axis=1, keepdims=True)
    rej_base = float(np.mean(np.log(np.sum(np.where(p.rej, np.exp(lp0), 0.0), axis=1) + 1e-300)))
    rej_new = float(np.mean(np.log(np.sum(np.where(p.rej, np.exp(logp), 0.0), axis=1) + 1e-300)))
    valid = p.tok >= 0
    kl = float(np.mean(np.sum(np.where(valid & (q > 0), q * (np.log(np.maximum(q, 1e-300)) - np.where(valid, logp, 0.0)),
                                       0.0), axis=1)))
    return ColumnSolve(d, loss, n_iter, msg, int(p.tok.shape[1]), added, (rej_base, rej_new), kl)
