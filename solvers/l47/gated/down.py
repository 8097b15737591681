"""The gated edit's down columns: per rewritten unit, its column solved exactly at the unit's
contexts for each strength (`column.solve_column`), shipped as codes within ffn_down's own block
scales (`set_column`: every other byte of the tensor kept), the strengths chosen on dev among the
shipped columns (`frontier.choose_strength` with these edits, scored exactly), and the record the
report reads: a one-round `GaussNewton` at the dense problem's conditions (its exact logits there;
the conditions' targets are the dense solve's, shown beside, not what the column solved for).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from exactedit.solvers.l47.gated.column import ColumnConfig, solve_column, top_tokens
from exactedit.solvers.l47.gated.config import GatedError

__all__ = ["BarRows", "Contexts", "bar_rows", "bound_of", "context_rejected", "mean_kl", "set_column", "solve_down",
           "with_memo", "zero_column"]


def set_column(raw: np.ndarray, type_name: str, cols: int, j: int, values) -> np.ndarray:
    """`raw` (a tensor's rows as stored) with column j at the nearest codes to `values` [rows]
    within each row's own block scales (clamped to the codes' range); every other code and every
    scale byte kept."""
    from exactedit.quant.rounding.grid import COLUMN_TYPES, codes_of, grid_of, nearest, pack

    if type_name not in COLUMN_TYPES:
        raise GatedError("ffn_down", "type", f"the gated edit writes a unit's column in {', '.join(COLUMN_TYPES)}, "
                         f"not {type_name}")
    grid = grid_of(raw, type_name, cols)
    codes = np.array(codes_of(raw, type_name, cols))
    codes[:, j] = nearest(_one_column(grid, j), np.asarray(values, np.float64)[:, None])[:, 0]
    return pack(grid, codes)


def zero_column(raw: np.ndarray, type_name: str, cols: int, j: int) -> np.ndarray:
    """`raw` with column j at the nearest-to-zero code of each row's own block scales (Q8_0 and
    Q6_K: exactly 0; Q4_1: offset + step * code, within half a step of 0 where the block's range
    holds 0, else its end nearest 0); every other code and every scale byte kept."""
    rows = np.asarray(raw).shape[0] if np.asarray(raw).ndim == 2 else 1
    return set_column(raw, type_name, cols, j, np.zeros(rows))


def _one_column(grid, j: int):
    """The Grid of column j alone (its steps [rows, 1], its offsets where affine)."""
    off = None if grid.offsets is None else grid.offsets[:, j:j + 1]
    return grid._replace(steps=grid.steps[:, j:j + 1], offsets=off)


def _bound(col) -> np.ndarray:
    """float64 [rows]: the largest b with [-b, b] within the values the column's codes hold
    (symmetric grids: step * the codes' smaller end; affine: 0 where the range misses 0)."""
    step = np.nan_to_num(col.steps[:, 0].astype(np.float64))
    if col.offsets is None:
        return np.abs(step) * min(abs(col.lo), col.hi)
    ends = np.nan_to_num(col.offsets[:, 0].astype(np.float64))[:, None] + step[:, None] * np.array([col.lo, col.hi])
    return np.maximum(0.0, np.minimum(-ends.min(axis=1), ends.max(axis=1)))


def _shipped(col, d) -> np.ndarray:
    """float64 [rows]: the column as the engine loads it once `d` is written by `set_column`
    (grid.values of the nearest codes: bit for bit the dequantized bytes)."""
    from exactedit.quant.rounding.grid import nearest, values

    return values(col, nearest(col, np.asarray(d, np.float64)[:, None]))[:, 0].astype(np.float64)


def bound_of(raw: np.ndarray, type_name: str, cols: int, j: int) -> np.ndarray:
    """float64 [rows]: the largest |value| column j's codes hold in each row (symmetric: the
    codes' smaller end), so a solve bounded by it ships without clamping."""
    from exactedit.quant.rounding.grid import grid_of

    return _bound(_one_column(grid_of(raw, type_name, cols), j))


def context_rejected(tokens, doc, tuples: Sequence[Sequence[int]]) -> list[list[int]]:
    """Per row, the final tokens of every tuple whose prefix the row's tokens end with (within the
    row's document): what the unit's column lowers there."""
    from exactedit.solvers.tail.scores import prefix_positions

    out: list[list[int]] = [[] for _ in range(np.asarray(tokens).size)]
    for t in tuples:
        for r in np.flatnonzero(prefix_positions(tokens, doc, [t]) >= 0):
            if int(t[-1]) not in out[r]:
                out[r].append(int(t[-1]))
    return out


@dataclass(frozen=True, eq=False)
class Contexts:
    """One unit's contexts on the solve side: y0 [T, n] the residual without the unit, a [T] the
    unit's activation, rej[r] the phrase's final tokens at row r; with a post-FFN norm, y0 is the
    residual before the FFN and f0 [T, n] the FFN's output without the unit (column.column_problem)."""

    unit: int
    phrase: int
    y0: np.ndarray
    a: np.ndarray
    rej: list
    f0: np.ndarray | None = None


def _record(problem, raw, w_new, d_cont, units, seconds):
    """The one-round GaussNewton the report reads (module doc)."""
    from exactedit.solvers.l47 import gauss_newton as gn_mod

    w0 = np.asarray(problem.w0, np.float64)
    dW = np.asarray(w_new, np.float64) - w0
    cont = np.zeros_like(w0)
    for j, d in zip(units, d_cont):
        cont[:, j] = d
    t0 = time.perf_counter()
    ev = problem.evaluate(np.asarray(w_new, np.float32))
    cond = problem.cond
    change = ev.logits - problem.base.logits
    err = np.abs(change - cond.target)
    lin = gn_mod.linear_change(cont, problem.base.U, problem.hh)
    dn = float(np.linalg.norm(cont))
    it = gn_mod.Iteration(
        it=1, conditions=cond.size, dw_rel=float(np.linalg.norm(dW) / max(np.linalg.norm(w0), 1e-30)),
        ship_rel=float(np.linalg.norm(dW - cont) / dn) if dn > 0 else 0.0,
        linear_residual=gn_mod._by_kind(np.abs(lin - cond.target), cond.kind, np.max),
        exact_err=gn_mod._by_kind(err, cond.kind, np.max), mean_change=gn_mod._by_kind(change, cond.kind, np.mean),
        moved=float(np.max(np.abs(change))) if change.size else 0.0,
        seconds={**seconds, "rescore": time.perf_counter() - t0})
    sol = gn_mod.MinNorm(cont, np.zeros(cond.size), lin, cond.target)
    return gn_mod.GaussNewton(np.asarray(w_new, np.float32), raw, dW, ev.logits, problem.base.logits, (it,), sol,
                              problem.base.U)


def _chat_rows(d) -> np.ndarray:
    """bool [T]: the rows of the dump's chat documents (tagged "chat", or holding reply rows), as
    bar (g) counts them (evals.scoring.bars.chat_docs)."""
    from exactedit.dumps.format import ROLE_REPLY

    out = np.zeros(d.rows, bool)
    roles = d.roles
    for doc in d.docs:
        reply = roles is not None and bool(np.any(np.asarray(roles[doc.first_row:doc.stop]) & ROLE_REPLY))
        out[doc.first_row:doc.stop] = "chat" in doc.tags or reply
    return out


class BarRows(NamedTuple):
    """The rows a KL bar counts (a RowSet, or None when there are none), their base residual
    y [T, n] (what `moved.logit_bound` bounds an edit's effect against) and the scored points' per-row
    KLs (`moved.RowMemo`)."""

    rows: object
    y: np.ndarray | None
    memo: object                    # moved.RowMemo (None with no rows)

    @property
    def total(self) -> int:
        return 0 if self.rows is None else self.rows.rows


def bar_rows(tail, traces, mining, *, chat_non_slop: bool) -> BarRows:
    """The rows of `traces` a KL bar counts: with `chat_non_slop`, the chat documents' rows that
    are not slop positions (bar (g)'s rows: at a slop position the KL is the cut itself), else
    every row (bar (e)'s)."""
    from exactedit.solvers.l47.jacobian import gather_rows

    blocks = []
    for name, d in traces:
        keep = np.ones(d.rows, bool)
        if chat_non_slop:
            keep[np.asarray(mining.trace(name).rows, np.int64)] = False
            keep &= _chat_rows(d)
        if keep.any():
            blocks.append((d, np.flatnonzero(keep)))
    if not blocks:
        return BarRows(None, None, None)
    return with_memo(tail, gather_rows(blocks))


def with_memo(tail, rows, tile_rows: int = 8192) -> BarRows:
    """BarRows of `rows` (a RowSet) with their base residual and a memo of per-row KLs (0 at the base)."""
    from exactedit.solvers.tail.moved import RowMemo

    y = np.asarray(tail.residual(rows))
    return BarRows(rows, y, RowMemo(tail, rows, y, np.zeros(rows.rows), tile_rows=tile_rows, kl=True))


def mean_kl(tail, bar: BarRows, dW, tile_rows: int) -> tuple[float, int]:
    """(the mean KL of the edit dW over the bar's rows, exact over the full vocabulary, the rows
    scored): a row whose KL the edit provably keeps within `moved.MOVE_TOL` of the base's 0 (its
    logits moved by at most sqrt(2 MOVE_TOL): KL <= B^2 / 2) or of a point already scored
    (`moved.RowMemo`; where the rewritten units are ~0) keeps that KL; every other row is scored."""
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba

    if bar.rows is None:
        return 0.0, 0

    def compute(move):
        rows = bar.rows.take(move)
        mix_b = tail.mix(bar.y[move])
        mix_e = tail.mix(tail.residual(rows, None, dW))
        return np.maximum(kl_rows_numba(mix_b, mix_e, tail.head, softcap=tail.softcap, tile_rows=tile_rows).kl, 0.0)
    kl, scored = bar.memo.score(dW, compute)
    return float(kl.sum()) / bar.total, scored


def solve_down(cfg, tail_removed, problem, contexts: Sequence[Contexts], mining, dev, collateral, bar_d, *,
               raw_removed: np.ndarray, type_name: str, cols: int, specials: Sequence[int],
               column: ColumnConfig | None = None, max_kl: dict | None = None, anchors=(),
               progress: Callable[[int, int], None] | None = None):
    """(GaussNewton record, strength section, per unit its column solves) of the gated edit: the
    strengths of `cfg.strength_grid` (else `cfg.strength`) chosen on `dev` as the dense edit's are,
    each point a set of shipped columns scored exactly; with `max_kl` ({"dev chat": bar (g)'s,
    "anchors": bar (e)'s}) a point whose mean KL on dev's non-slop chat rows, or on any one of the
    `anchors` traces (a domain each), is above its bar does not pass: at the phrase's contexts
    where the model went on otherwise, the lowered word's mass is the edit's KL and it grows with
    the strength (on Qwen's two demo phrases at strength 2 each: (g) 0.0064, (e) 0.0105, both
    failing, where the cut on dev was 0.97 / 0.94). `progress(done, total)`: the search's dev points."""
    from exactedit import quant
    from exactedit.quant.rounding.grid import grid_of
    from exactedit.solvers.l47.frontier import choose_strength
    from exactedit.solvers.tail.moved import MOVE_TOL

    column = column or ColumnConfig(margin=float(cfg.margin))
    margins = {c.phrase: cfg.margin_for(mining.phrases[c.phrase]) for c in contexts}
    grid = grid_of(raw_removed, type_name, cols)         # the block scales every column is written within
    cols_of = {c.unit: _one_column(grid, c.unit) for c in contexts}
    bounds = {u: _bound(g) for u, g in cols_of.items()}
    col0 = {c.unit: np.asarray(problem.w0[:, c.unit], np.float64) for c in contexts}   # the removal's column
    solved: dict = {}                     # (unit, strength) -> (ColumnSolve, shipped column values)
    tops: dict = {}                       # unit -> its contexts' top_tokens
    t_solve = [0.0]

    def column_at(c: Contexts, s: float):
        key = (c.unit, float(s))
        if key not in solved:
            t = time.perf_counter()
            near = [v[0].d for (u, x), v in sorted(solved.items(), key=lambda kv: abs(kv[0][1] - s)) if u == c.unit]
            cc = dataclasses.replace(column, margin=margins[c.phrase])
            tile = getattr(cfg, "tile_rows", 8192)
            if c.unit not in tops:          # the contexts' base top tokens: the same at every strength
                tops[c.unit] = top_tokens(tail_removed, c.y0, cc.top, tile_rows=tile, f0=c.f0)
            sol = solve_column(tail_removed, c.y0, c.a, c.rej, specials, float(s), cc, bound=bounds[c.unit],
                               d0=near[0] if near else None, tile_rows=tile, f0=c.f0, top_ids=tops[c.unit])
            solved[key] = (sol, _shipped(cols_of[c.unit], sol.d))
            t_solve[0] += time.perf_counter() - t
        return solved[key]

    by_phrase = {c.phrase: c for c in contexts}

    def dW_of(combo):
        dW = np.zeros(problem.w0.shape, np.float64)
        for p, s in enumerate(combo):
            c = by_phrase.get(p)
            if c is not None:
                dW[:, c.unit] = column_at(c, s)[1] - col0[c.unit]
        return dW

    def edits(combos):
        for combo in combos:
            yield combo, dW_of(combo)

    tile = getattr(cfg, "tile_rows", 8192)
    kl_of = limits = None
    scored: dict = {}                     # per bar: rows scored through the full head, per point
    if max_kl is not None:
        sets = [("dev chat", bar_rows(tail_removed, dev, mining, chat_non_slop=True))]
        sets += [(n if n.startswith("anchors:") else f"anchors:{n}",      # trace names carry their role
                  bar_rows(tail_removed, [(n, d)], mining, chat_non_slop=False)) for n, d in anchors]

        def measured(combo):
            dW = dW_of(combo)
            out = {}
            for k, bar in sets:
                out[k], rows = mean_kl(tail_removed, bar, dW, tile)
                scored.setdefault(k, {"rows": bar.total, "scored": []})["scored"].append(rows)
            return out
        kl_of = measured
        limits = {k: max_kl["anchors" if k.startswith("anchors:") else k] for k, _ in sets}
    if cfg.strength_grid:
        _, strength = choose_strength(cfg, tail_removed, problem, mining, dev, collateral, bar_d, edits=edits,
                                      kl_of=kl_of, max_kl=limits, progress=progress)
        chosen = [strength["chosen"][ph] for ph in mining.phrases]
        strength["kl_rows"] = {k: {"rows": v["rows"], "scored_max": max(v["scored"]),
                                   "scored_mean": float(np.mean(v["scored"])), "tol_nats": MOVE_TOL}
                               for k, v in scored.items()}
    else:
        strength, chosen = None, [cfg.strength] * len(mining.phrases)
    raw = np.array(raw_removed)
    d_cont = []
    for c in contexts:
        sol, shipped = column_at(c, chosen[c.phrase])
        raw = set_column(raw, type_name, cols, c.unit, sol.d)
        d_cont.append(sol.d - col0[c.unit])
    w_new = quant.dequantize(raw, type_name, cols)
    rec = _record(problem, raw, w_new, d_cont, [c.unit for c in contexts], {"solve": t_solve[0]})
    table = [{"unit": u, "strength": s, "loss": v[0].loss, "iterations": v[0].n_iter, "message": v[0].message,
              "support": v[0].support, "added": v[0].added, "rejected_logp": list(v[0].rejected_logp),
              "kl_to_target": v[0].others_kl,
              "clamped": int(np.sum(np.abs(v[0].d) >= bounds[u] * (1 - 1e-9)) if bounds[u].size else 0)}
             for (u, s), v in sorted(solved.items())]
    return rec, strength, table
