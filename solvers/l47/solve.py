"""The dense edit of the last layer's down projection, one entry: `solve_dense(inputs, cfg) ->
DenseResult` builds the problem from mined positions (`solvers.l47.problem`), chooses each phrase's
strength on dev where a grid is given (`solvers.l47.frontier.choose_strength`) and runs Gauss-Newton
on the K x K Gram system, shipped through the tensor's quantization (`solve`); and the summaries the
report reads (how still the null anchors are, what shipping kept, what each position raised).

Scoring the edit on whole traces and the bars are the caller's (runs.solve.wfld): this module
never reads a protocol, a ledger or a split (bar (d)'s thresholds come in as data).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from exactedit.solvers.l47 import alternatives as alt_mod
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47 import ship as ship_mod
from exactedit.solvers.l47.config import WfldConfig
from exactedit.solvers.l47.problem import WfldProblem

__all__ = ["DenseInputs", "DenseResult", "Summaries", "null_summary", "solve", "solve_dense", "summaries"]

Named = Sequence[tuple[str, object]]        # (trace name, dump) pairs


@dataclass(frozen=True, eq=False)
class DenseInputs:
    """What the dense solve reads, gathered by its driver: the tail, the mined positions and the
    rows they give (`ftpo`), the traces by role, the tensor's original bytes, and bar (d)'s
    thresholds for the strength choice."""

    tail: object
    mining: object                  # solvers.l47.mining.Mining
    ftpo: object                    # problem.ftpo_rows of the train traces
    specials: tuple[int, ...]
    phrases: Sequence[str]
    anchors: Named
    held_from: Named                # train + null traces: the word holds' rows
    background_from: Named
    dev: Named                      # the held-out traces the strength is chosen on
    collateral: Named               # the collateral traces (the frontier there is reported only)
    raw0: np.ndarray                # the tensor's original bytes
    type_name: str
    cols: int
    bar_d: object                   # solvers.l47.frontier.BarD
    device_head: object = None
    key: object = None              # a fixed key (solvers.l47.key.Key); None: the config's kind

@dataclass(frozen=True, eq=False)
class DenseResult:
    problem: WfldProblem            # as solved (at the chosen strengths)
    gn: wfld.GaussNewton
    strength: dict | None           # the strength section of the report (None: the config's strength)


def solve_dense(inputs: DenseInputs, cfg: WfldConfig, *, mark: Callable[..., None] | None = None,
                progress: Callable[[int, int], None] | None = None,
                searched: Callable[[int, int], None] | None = None) -> DenseResult:
    """Build the problem, choose the strengths on dev (a `cfg.strength_grid`; `searched(done,
    total)`: its dev points), solve and ship (`progress`: the Gauss-Newton rounds)."""
    from exactedit.solvers.l47.frontier import choose_strength
    from exactedit.solvers.l47.problem import build_problem

    mark = mark or (lambda *a: None)
    i = inputs
    problem = build_problem(cfg, i.tail, i.ftpo, i.mining, specials=i.specials, phrases=i.phrases, anchors=i.anchors,
                            held_from=i.held_from, background_from=i.background_from, raw0=i.raw0,
                            type_name=i.type_name, cols=i.cols, device_head=i.device_head, key=i.key, mark=mark)
    strength = None
    if cfg.strength_grid:
        problem, strength = choose_strength(cfg, i.tail, problem, i.mining, i.dev, i.collateral, i.bar_d,
                                            progress=searched)
        mark("strength")
    return DenseResult(problem, solve(problem, cfg, progress=progress), strength)


def solve(problem: WfldProblem, cfg: WfldConfig, progress: Callable[[int, int], None] | None = None
          ) -> wfld.GaussNewton:
    """`cfg.gn_iters` Gauss-Newton rounds from the base, each shipped by the problem's shipper."""
    return wfld.gauss_newton(problem.w0, problem.cond, problem.hh, problem.M, problem.evaluate, problem.shipper,
                             iters=cfg.gn_iters, tol=cfg.gn_tol, base=problem.base, gram=problem.gram(),
                             progress=progress)


def null_summary(groups, B, w0, gn: wfld.GaussNewton) -> dict:
    """How still the null anchors are: max over the held uses of ||dW h|| / ||W h||, for the
    solved edit and for the edit as shipped (the round trip's share)."""
    hh = np.concatenate([np.asarray(g, np.float64) for g in groups], axis=0) if groups else np.zeros((0, w0.shape[1]))
    out = {"rows": int(hh.shape[0]), "rank": int(B.shape[1]), "solved_max_rel": None, "shipped_max_rel": None}
    if hh.shape[0]:
        base = np.linalg.norm(hh @ np.asarray(w0, np.float64).T, axis=1)
        for key, dW in (("solved_max_rel", gn.last_solve.dW), ("shipped_max_rel", gn.dW)):
            out[key] = float(np.max(np.linalg.norm(hh @ dW.T, axis=1) / np.maximum(base, 1e-30)))
    return out


@dataclass(frozen=True)
class Summaries:
    """The report's sections on the solve itself."""

    null: dict                # null_summary
    shipping: dict            # ship.shipping_summary
    raised: object            # alternatives.raised_table
    warnings: tuple[str, ...]  # alternatives below the floor, per phrase


def summaries(problem: WfldProblem, gn: wfld.GaussNewton, cfg: WfldConfig, *, collateral_by_word,
              word_names: Sequence[str], phrases: Sequence[str], piece: Callable[[int], str]) -> Summaries:
    """What the report says about the solve: `collateral_by_word` (per word, the hh of its scored
    legitimate uses, never held), `word_names` (per word), `phrases` (the phrases' text), `piece`
    (token id -> text)."""
    p = problem
    shipping = ship_mod.shipping_summary(
        gn=gn, cond=p.cond, Hh=p.hh, w0=p.w0, held_by_word=p.held_by_word, collateral_by_word=collateral_by_word,
        word_names=list(word_names), raw0=p.raw0, type_name=p.type_name, cols=p.cols, view=p.view, mode=cfg.ship,
        hold_weight=cfg.ship_hold_weight, shipper=p.shipper, hh_bg=p.hh_bg)
    cidx = {(int(a), int(b)): i for i, (a, b) in enumerate(zip(p.slot, p.col))}
    names = [phrases[i] for i in p.ftpo.phrase]
    raised = alt_mod.raised_table(p.alts, p.ftpo.where, names, p.ftpo.rejected,
                                  lambda i, key, j: cidx.get((i, p.column(key, j))), gn.base_logits, gn.logits,
                                  p.vp.lse, piece)
    return Summaries(null_summary(p.held_by_word, p.B, p.w0, gn), shipping, raised,
                     tuple(alt_mod.floor_warnings(p.alts, names, cfg.alt_floor)))
