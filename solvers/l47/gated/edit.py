"""The gated edit of the last FFN, one entry: `solve_gated(GatedInputs, WfldConfig) -> GatedResult`.

Unit j of the last SwiGLU FFN computes a_j = silu(g_j . x) * (u_j . x), x = ffn_norm(R), and writes
W_down[:, j] a_j into the residual. The gated edit repurposes one unit:
1. the gate: g fitted through the origin of x to separate the phrase's contexts (every solve-side
   row ending with a tuple's prefix, `_labels`) from every other solve-side row (`gate.fit_gate`),
   its ridge one (`gate_lams`; with several, one chosen per phrase on the heldout (dev) rows:
   `ridge.choose_ridge`), and the unit designed from it
   (`design.design_unit`: gate row alpha d, up row beta d, so a >= 0 everywhere, ~0 off the phrase);
2. the unit: among the `candidates` whose current contribution is the least (`removal.
   removal_candidates`: energy sum_t hh_tj^2 |W_down[:, j]|^2 over the solve-side rows), never one
   active on the slop contexts, the one whose removal costs least, measured exactly (`removal_kl`:
   KL over the full vocabulary on the anchors with its down column at zero); that column is set to
   the stored format's nearest-to-zero codes within the tensor's own block scales (the removal), so
   the edit's base is the model without that unit;
3. the new activation a_j on every row, as the engine computes it from the dump's R and the
   quantized gate and up rows (`activation`, handed in: the caller's engine-faithful path,
   solvers/tail/forward/ffn_hidden.py), replaces column j of each
   trace's hidden state (`GatedDump`);
4. the down column: solved through the exact final norm and head at the unit's contexts, per
   strength (`down.solve_down`, `column.solve_column`: the cross-entropy to the context's own
   distribution with the phrase's token lowered), shipped as codes within ffn_down's own block
   scales; the strengths are chosen on dev as for the dense edit. The dense problem is built on the
   rewritten traces for the report's tables (its conditions scored at the shipped column).
Three tensors change: row j of ffn_gate and of ffn_up, and column j of ffn_down (every other byte
of ffn_down kept). The removal's cost is part of the edit's (the bars score base = the model as
it was against the three edits).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit.solvers.l47.gated.config import ANTISLOP_RIDGES, DesignConfig, GateConfig, GatedError
from exactedit.solvers.l47.gated.design import GatedUnit
from exactedit.solvers.l47.gated.down import Contexts, context_rejected, solve_down, zero_column
from exactedit.solvers.l47.gated.gate import Gate
from exactedit.solvers.l47.gated.ridge import choose_ridge
from exactedit.solvers.l47.gated.removal import col_norms, removal_candidates

__all__ = ["GatedDump", "GatedInputs", "GatedResult", "gated_key", "removal_kl", "solve_gated", "zero_column"]

Named = Sequence[tuple[str, object]]


class GatedDump:
    """A dump as the edited model sees it: every field the dump's, but `hh` with the columns
    `units` replaced by the rewritten units' activations `A` (float32 [T, units]; one copy of hh
    for all of them)."""

    def __init__(self, dump, units, A: np.ndarray):
        units = [int(j) for j in np.atleast_1d(units)]
        hh = np.array(dump.hh, dtype=np.float32)
        A = np.asarray(A, dtype=np.float32).reshape(hh.shape[0], -1) if np.ndim(A) == 1 else np.asarray(A, np.float32)
        if A.shape != (hh.shape[0], len(units)):
            raise GatedError("activation", "shape", f"expected [{hh.shape[0]}, {len(units)}], got {list(A.shape)}")
        hh[:, units] = A
        hh.setflags(write=False)
        self._dump, self.hh, self.units = dump, hh, tuple(units)

    def __getattr__(self, name):
        return getattr(self._dump, name)


def gated_key(units, h: int):
    """The key of the rewritten units: Q = [e_j ...] (their down columns only)."""
    from exactedit.solvers.l47.key import Key

    units = [int(j) for j in units]
    Q = np.zeros((h, len(units)))
    Q[units, np.arange(len(units))] = 1.0
    return Key("gated", Q, np.arange(len(units), dtype=np.int64), np.ones(len(units)), np.array(units, np.int64),
               (), ())


@dataclass(frozen=True, eq=False)
class GatedInputs:
    """What the gated solve reads. `named`: role -> [(trace name, dump)] (train, null, anchors,
    heldout, collateral); `held`: train trace -> its held-out FTPO mask; `x_of(dump)`: the FFN input
    x = ffn_norm(R) per row, float32 [T, n]; `quantize_row(row) -> bytes` in the gate / up tensors'
    type; `activation(dump, gate_raw, up_raw, unit) -> a [T]`: unit `unit` with those rows, at each
    of the dump's rows, as the engine computes it (from the dump's R). `raw0`, `type_name`, `cols`: ffn_down as stored."""

    tail: object
    mining: object
    named: Mapping[str, Named]
    held: Mapping[str, np.ndarray]
    specials: tuple[int, ...]
    phrases: Sequence[str]
    background: tuple[str, ...]
    raw0: np.ndarray
    type_name: str
    cols: int
    bar_d: object
    x_of: Callable[[object], np.ndarray]
    quantize_row: Callable[[np.ndarray], np.ndarray]
    activation: Callable[[object, np.ndarray, np.ndarray, int], np.ndarray]
    gate: GateConfig = GateConfig()
    gate_lams: tuple[float, ...] = ANTISLOP_RIDGES   # the gate's ridges: with several, one chosen per phrase on the
                                                # heldout (dev) rows (WfldConfig.gated_ridges)
    design: DesignConfig = DesignConfig()
    design_target: float | None = None  # the units' median activation on their contexts; None: headroom x the data's scale
    headroom: float = 4.0           # with design_target None: the target is this many times the 99.9th percentile of |hh|
                                    # (WfldConfig.gated_headroom)
    candidates: int = 4             # units whose removal is measured exactly (KL on the anchors)
    max_kl: dict | None = None      # {"dev chat": bar (g)'s, "anchors": bar (e)'s}: a strength point above either fails
    device_head: object = None


@dataclass(frozen=True, eq=False)
class GatedResult:
    units: tuple[int, ...]          # per phrase with train contexts, its unit
    gates: tuple[Gate, ...]
    designs: tuple[GatedUnit, ...]
    gate_raw: np.ndarray            # uint8 [units, row_bytes] those rows of ffn_gate as shipped
    up_raw: np.ndarray              # uint8 [units, row_bytes] those rows of ffn_up as shipped
    named: Mapping[str, Named]      # the traces as the edited model sees them (GatedDump)
    dense: object                   # solve.DenseResult: the down column's solve on the removal's weights
    summary: dict                   # the report's section: units, removal, per phrase its gate and detector


def removal_kl(tail, raw0: np.ndarray, type_name: str, cols: int, units, traces: Named, *,
               tile_rows: int = 8192) -> list[dict]:
    """Per candidate unit, the exact cost of its removal on `traces` (the anchors): KL(model ||
    model with the unit's down column at zero codes) per row over the full vocabulary, mean and max.
    On an rmsnorm tail without a post-FFN norm every candidate is scored in one pass over the head
    (`kl_rows_rank1`: the removal moves the residual along the unit's column, so the edited logits
    are the base's rescaled by the final norm plus the hidden value times the column's own logits;
    on Qwen's anchors at 22 candidates, 44 head passes became 1); elsewhere each candidate's
    residual is recomputed and scored against the base."""
    from exactedit import quant
    from exactedit.solvers.l47.jacobian import editable_weight, with_weights
    from exactedit.solvers.tail.logits import tail_mix
    from exactedit.solvers.tail.passes.kl_pass_numba import kl_rows_numba, kl_rows_rank1

    dumps = [d for _, d in traces]
    units = [int(j) for j in units]
    if not dumps:
        return [{"unit": j, "kl_mean": None, "kl_max": None, "rows": 0} for j in units]
    view = quant.runtime_view if tail.kind == "hc4" else quant.dequantize
    removed = lambda j: view(zero_column(raw0, type_name, cols, j), type_name, cols)  # noqa: E731
    if tail.kind == "rmsnorm" and getattr(tail.l47, "w_post", None) is None and units:
        W = np.asarray(editable_weight(tail), np.float64)
        y = np.concatenate([np.asarray(tail.residual(d, slice(a, min(a + 4096, d.rows))), np.float64)
                            for d in dumps for a in range(0, d.rows, 4096)], axis=0)
        hh = np.concatenate([np.asarray(d.hh, np.float64)[:, units] for d in dumps], axis=0)
        eps, w_norm = float(tail.mix_params.eps), np.asarray(tail.mix_params.w_norm, np.float64).reshape(-1)
        s_b = 1.0 / np.sqrt(np.mean(y * y, axis=1) + eps)
        a, b = np.zeros(hh.shape), np.zeros(hh.shape)
        dirs = np.zeros((W.shape[0], len(units)))
        for c, j in enumerate(units):
            col = np.asarray(removed(j)[:, j], np.float64) - W[:, j]
            y_e = y + hh[:, c:c + 1] * col[None, :]
            s_e = 1.0 / np.sqrt(np.mean(y_e * y_e, axis=1) + eps)
            a[:, c], b[:, c], dirs[:, c] = s_e / s_b, s_e * hh[:, c], w_norm * col
        kl = np.maximum(kl_rows_rank1(tail.mix(y.astype(np.float32)), tail.head, a, b, dirs, softcap=tail.softcap,
                                      tile_rows=tile_rows), 0.0)
        return [{"unit": j, "kl_mean": float(kl[:, c].mean()), "kl_max": float(kl[:, c].max()),
                 "rows": int(kl.shape[0])} for c, j in enumerate(units)]
    mix_b = np.concatenate([tail_mix(tail, d) for d in dumps], axis=0)
    out = []
    for j in units:
        t_j = with_weights(tail, removed(j))
        mix_e = np.concatenate([tail_mix(t_j, d) for d in dumps], axis=0)
        kl = np.maximum(kl_rows_numba(mix_b, mix_e, tail.head, softcap=tail.softcap, tile_rows=tile_rows).kl, 0.0)
        out.append({"unit": j, "kl_mean": float(kl.mean()), "kl_max": float(kl.max()), "rows": int(kl.size)})
    return out


def _labels(side: Named, mining, held) -> tuple[dict, dict]:
    """Per solve-side trace: the phrase index of each row that is one of the phrase's contexts (its
    tokens end with the prefix of one of the phrase's tuples, whatever the next token; -1
    elsewhere), and a mask of the rows the fit leaves out (a train trace's held-out FTPO rows: slop
    contexts kept for scoring). The contexts are the prefix's, not only the FTPO rows: the unit
    fires after the prefix, and a gate fitted on a dozen FTPO rows against everything else,
    the prefix's other rows and the anchors' slop rows among them, separates those rows and
    nothing like them (measured on Qwen: held-out slop rows at -0.7..1.6 of the margin against
    0.9..1.7 with the prefix's rows as positives)."""
    from exactedit.solvers.tail.scores import prefix_positions

    tuples = [tuple(int(x) for x in t) for t in mining.tuples]
    phrase_of = np.asarray(mining.tuple_phrase, dtype=np.int64)
    pos, skip = {}, {}
    for name, d in side:
        hit = prefix_positions(d.tokens, d.doc_index(), tuples)
        pos[name] = np.where(hit >= 0, phrase_of[np.maximum(hit, 0)], -1)
        skip[name] = np.zeros(d.rows, dtype=bool)
        if name in held:
            tm = mining.trace(name)
            rows = np.asarray(tm.rows, dtype=np.int64)
            hold = np.asarray(held[name], dtype=bool)
            skip[name][rows[hold]] = True
    return pos, skip


def _activation_split(a, y) -> dict:
    """The rewritten unit's activations a [T] on its phrase's contexts (y) against every other row:
    the contexts' least and median, the others' largest |a|, and the counts."""
    a, y = np.asarray(a, np.float64), np.asarray(y, bool)
    return {"pos_min": float(a[y].min()) if y.any() else None,
            "pos_median": float(np.median(a[y])) if y.any() else None,
            "neg_max_abs": float(np.abs(a[~y]).max()) if (~y).any() else None,
            "n_pos": int(y.sum()), "n_neg": int((~y).sum())}


def _zero_columns(raw, type_name: str, cols: int, units) -> np.ndarray:
    for j in units:
        raw = zero_column(raw, type_name, cols, int(j))
    return raw


def solve_gated(inputs: GatedInputs, cfg, *, mark: Callable[..., None] | None = None,
                progress: Callable[[int, int], None] | None = None) -> GatedResult:
    """Per phrase a gate and a unit, the units chosen and rewritten, their down columns solved
    jointly (module doc)."""
    from exactedit import quant
    from exactedit.solvers.l47.jacobian import editable_weight, gather_rows, with_weights
    from exactedit.solvers.l47.problem import build_problem, ftpo_rows
    from exactedit.solvers.l47.solve import DenseResult

    mark = mark or (lambda *a: None)
    i = inputs
    named = {r: list(v) for r, v in i.named.items()}
    side = named["train"] + named.get("null", []) + named.get("anchors", [])
    pos, skip = _labels(side, i.mining, i.held)
    fit = {n: ~skip[n] for n, _ in side}
    X = np.concatenate([np.asarray(i.x_of(d), np.float32)[fit[n]] for n, d in side])
    P = np.concatenate([pos[n][fit[n]] for n, _ in side])
    phrases = [p for p in range(len(i.mining.phrases)) if (P == p).any()]
    if not phrases:
        raise GatedError("train", "slop contexts", "no FTPO row to fit a gate on")
    w0 = editable_weight(i.tail)
    HH = np.concatenate([np.asarray(d.hh, np.float32)[fit[n]] for n, d in side])
    cand = removal_candidates(HH, col_norms(w0), P >= 0, i.candidates + len(phrases) - 1)
    # the rewritten units fire at `headroom` times the model's own scale of activation (the 99.9th
    # percentile of |hh| on the solve side): the down column's values must fit the tensor's block
    # scales, and at 1x the column a Qwen solve asked for sat at the codes' ends (35% of them, the
    # shipped column at 96% of the largest it could be), cutting less than solved
    scale = i.headroom * float(np.percentile(np.abs(HH), 99.9)) if i.design_target is None else float(i.design_target)
    del HH
    design = dataclasses.replace(i.design, target=max(scale, 1e-3))
    dev_pos, _ = _labels(named.get("heldout", []), i.mining, {})
    X_dev = (np.concatenate([np.asarray(i.x_of(d), np.float32) for _, d in named["heldout"]])
             if named.get("heldout") else None)
    P_dev = np.concatenate([dev_pos[n] for n, _ in named["heldout"]]) if X_dev is not None else None
    gates, designs, ridges = [], [], []
    for p in phrases:                   # one detector per phrase: every other row is a negative
        rc = choose_ridge(X, P == p, X_dev, None if P_dev is None else P_dev == p, i.gate_lams, i.gate, design)
        gates.append(rc.gate)
        designs.append(rc.unit)
        ridges.append(rc.summary())
    del X, X_dev
    mark("gate")
    if cand.units.size < len(phrases):
        raise GatedError("ffn_down", "units", f"{cand.units.size} units inactive on the slop contexts, "
                         f"{len(phrases)} needed (one per phrase)")
    costs = removal_kl(i.tail, np.asarray(i.raw0), i.type_name, i.cols, cand.units, named.get("anchors", []),
                       tile_rows=getattr(cfg, "tile_rows", 8192))
    chosen = sorted(costs, key=lambda c: (c["kl_mean"] if c["kl_mean"] is not None else 0.0, c["unit"]))
    units = [c["unit"] for c in chosen[:len(phrases)]]
    mark("removal")
    g_raw = np.stack([np.asarray(i.quantize_row(u.g_row.astype(np.float32)), np.uint8).reshape(-1) for u in designs])
    u_raw = np.stack([np.asarray(i.quantize_row(u.u_row.astype(np.float32)), np.uint8).reshape(-1) for u in designs])
    rewritten = {}
    for role, traces in named.items():
        out = []
        for n, d in traces:
            A = np.stack([i.activation(d, g_raw[k], u_raw[k], j) for k, j in enumerate(units)], axis=1)
            out.append((n, GatedDump(d, units, A)))
        rewritten[role] = out
    mark("unit")

    raw_removed = _zero_columns(np.asarray(i.raw0), i.type_name, i.cols, units)
    view = quant.runtime_view if i.tail.kind == "hc4" else quant.dequantize
    tail_removed = with_weights(i.tail, view(raw_removed, i.type_name, i.cols))
    ftpo = ftpo_rows(rewritten["train"], i.mining, i.held)
    problem = build_problem(
        dataclasses.replace(cfg, word_holds=0), tail_removed, ftpo, i.mining, specials=i.specials,
        phrases=i.phrases, anchors=rewritten.get("anchors", []),
        held_from=rewritten["train"] + rewritten.get("null", []),
        background_from=[x for r in i.background for x in rewritten.get(r, [])], raw0=raw_removed,
        type_name=i.type_name, cols=i.cols, device_head=i.device_head, key=gated_key(units, w0.shape[1]), metric=False,
        mark=mark)
    side_new = rewritten["train"] + rewritten.get("null", []) + rewritten.get("anchors", [])
    tuples = [tuple(int(x) for x in t) for t in i.mining.tuples]
    contexts = []
    for k, (p, j) in enumerate(zip(phrases, units)):
        blocks, rej = [], []
        mine = [t for t, ph in zip(tuples, i.mining.tuple_phrase) if int(ph) == p]
        for n, d in side_new:
            rows = np.flatnonzero(fit[n] & (pos[n] == p))
            if rows.size:
                blocks.append((d, rows))
                per_row = context_rejected(d.tokens, d.doc_index(), mine)
                rej += [per_row[r] for r in rows]
        rs = gather_rows(blocks)
        a_j = np.asarray(rs.hh[:, j], np.float64)
        if getattr(tail_removed.l47, "w_post", None) is None:
            contexts.append(Contexts(j, p, np.asarray(tail_removed.residual(rs), np.float64), a_j, rej))
        else:                           # Gemma: the unit's write is normalized with the FFN's output
            f0 = np.asarray(rs.hh, np.float64) @ np.asarray(tail_removed.l47.w_down, np.float64).T
            contexts.append(Contexts(j, p, np.asarray(rs.R, np.float64), a_j, rej, f0))
    mark("contexts")
    gn, strength, columns = solve_down(cfg, tail_removed, problem, contexts, i.mining, rewritten.get("heldout", []),
                                       rewritten.get("collateral", []), i.bar_d, raw_removed=raw_removed,
                                       type_name=i.type_name, cols=i.cols, specials=i.specials, max_kl=i.max_kl,
                                       anchors=rewritten.get("anchors", []),
                                       progress=progress)
    mark("strength")
    dense = DenseResult(problem, gn, strength)
    held_pos, _ = _labels(rewritten.get("heldout", []), i.mining, {})
    per_phrase = []
    for k, (p, j) in enumerate(zip(phrases, units)):
        a = np.concatenate([np.asarray(d.hh[:, j])[fit[n]] for n, d in side_new])
        per_phrase.append({"phrase": i.mining.phrases[p], "unit": j, "gate": gates[k].summary(), "ridge": ridges[k],
                           "design": designs[k].summary(), "fit_activation": _activation_split(a, P == p),
                           "heldout_activation": _activation_split(
                               np.concatenate([np.asarray(d.hh[:, j]) for _, d in rewritten.get("heldout", [])] or
                                              [np.zeros(0)]),
                               np.concatenate([held_pos[n] == p for n, _ in rewritten.get("heldout", [])] or
                                              [np.zeros(0, bool)]))})
    summary = {"units": units, "activation": design.act, "activation_target": design.target, "removal": {**cand.summary(), "measured": costs, "chosen": chosen[:len(phrases)]},
               "phrases": per_phrase, "columns": columns}
    return GatedResult(tuple(units), tuple(gates), tuple(designs), g_raw, u_raw, rewritten, dense, summary)
