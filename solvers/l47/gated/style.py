"""A persona's style raised by one rewritten unit of the last FFN that fires at the style's decision
rows only (the reply start for a starter): `solve_style_unit(StyleInputs) -> StyleResult`.

A rank-1 head edit raises the style's token by a linear function of the final hidden state, so
every state that resembles a reply start gets some of it: paragraph starts after a blank line
(docs/solve-head.md). The unit here is the gated edit's (edit.py) with a style for a phrase:
1. the gate: g through the origin of x = ffn_norm(R) separating the rows where the style is
   decided (`deciding_rows`, one per reply of the persona documents and of the anchors' plain
   replies: a starter's reply start; a sign-off's or a kaomoji's reply end where the reply does not
   show it, its first token's row where it does) from every other row of the solve side (train
   persona documents and anchors), `gate.fit_gate`, its ridge chosen on dev's decision rows
   (`ridge.choose_ridge`); the unit designed from it (`design.design_unit`, a >= 0, ~0 off those
   rows);
2. the unit repurposed: the cheapest removal measured exactly on the anchors among the quietest
   units inactive at the decision rows (`removal.removal_candidates`, `edit.removal_kl`);
3. the new activation as the engine computes it (`activation`) replaces that column of hh;
4. the down column solved through the exact final norm and head at the decision rows with the
   style's tokens raised (`column.solve_column(lower=False)`: at strength 1 their best logit ends
   `margin` above the best other token's, the rest in proportion, the given specials kept: the
   caller leaves the turn end out of them for a reply-end style, whose decision is to sign off
   where the reply would stop, runs/persona/pipeline.py), shipped as codes within ffn_down's own
   block scales;
5. the strength chosen on dev: per grid point (headroom, strength), the shipped column scored
   exactly: the style's probability at dev's decision rows (the rate's proxy) and the mean KL off
   the decision rows on dev and on the anchors against the model with the unit removed (rows the
   unit provably cannot move count 0: `down.mean_kl`); among the points within `max_kl_off` on
   both, the weakest (strength, then headroom) whose dev probability is within TIE of the best;
   none within: the weakest point, flagged.

The headroom: the unit's median activation at the decision rows is `headroom` times the 99.9th
percentile of the model's |hh|. The down column is shipped as codes within ffn_down's own block
scales (one block per row, shared with 255 other units), so its entries are bounded; the unit's
gate and up rows are rewritten whole (their Q4_K rows carry their own scales), so a larger
activation is the way past that bound: measured on Qwen's "Greetings" run, strengths 2 and 4 ship
the same column at headroom 4 (docs/solve-head.md). Each headroom is a design of its own (the same
gate and removed unit), and dev chooses among them like among strengths.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit.solvers.l47.gated.config import RIDGES, DesignConfig, GateConfig, GatedError

__all__ = ["SIGNOFF_REACH", "StyleInputs", "StyleResult", "TIE", "deciding_rows", "decision_rows", "solve_style_unit"]

Named = Sequence[tuple[str, object]]

#: dev style probabilities within this of the best passing one count as equal (the weakest is taken)
TIE = 0.01
#: a reply-end style's first token lies within this many rows of the reply's end (a sign-off of a
#: few words, a kaomoji and its punctuation)
SIGNOFF_REACH = 24


@dataclass(frozen=True, eq=False)
class StyleInputs:
    """What the style unit's solve reads. `named`: role -> [(name, dump)] ("train": persona
    documents, "dev": persona documents, "anchors": plain replies and texts); `decision`: the role
    bit of the style's decision rows (dumps.format.ROLE_NAMES); `tokens`: the style's tokens (the
    edit set S); `x_of`, `quantize_row`, `activation`, `raw0`, `type_name`, `cols` as the gated
    edit's (edit.GatedInputs)."""

    tail: object
    named: Mapping[str, Named]
    decision: int
    tokens: tuple[int, ...]
    specials: tuple[int, ...]
    raw0: np.ndarray
    type_name: str
    cols: int
    x_of: Callable[[object], np.ndarray]
    quantize_row: Callable[[np.ndarray], np.ndarray]
    activation: Callable[[object, np.ndarray, np.ndarray, int], np.ndarray]
    grid: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
    margin: float = 1.0
    max_kl_off: float = 0.005       # the persona protocol's bar off the decision rows
    gate: GateConfig = GateConfig()
    gate_lams: tuple[float, ...] = RIDGES   # the gate's ridges, one chosen on dev (ridge.choose_ridge)
    design: DesignConfig = DesignConfig()
    headrooms: tuple[float, ...] = (4.0, 16.0)
    candidates: int = 4
    tile_rows: int = 8192


@dataclass(frozen=True, eq=False)
class StyleResult:
    unit: int
    gate_raw: np.ndarray            # uint8 [1, row_bytes] the unit's ffn_gate row as shipped
    up_raw: np.ndarray              # uint8 [1, row_bytes] its ffn_up row
    down_raw: np.ndarray            # ffn_down as shipped (the removal's zero codes and the chosen column)
    strength: float
    headroom: float
    passed: bool                    # the chosen point is within the KL bar on dev and anchors
    summary: dict


def _roles(dump) -> np.ndarray:
    roles = getattr(dump, "roles", None)
    if roles is None:
        raise GatedError("dump", "roles", "the style unit needs each row's role (a dump written with roles)")
    return np.asarray(roles)


def decision_rows(dump, bit: int, tokens: Sequence[int] = ()) -> np.ndarray:
    """bool [T]: the protocol's decision rows of the dump (solvers.tail.decision.decision_rows: the
    rows carrying the role bit `bit`, and reply rows whose next token is one of `tokens`): what the
    KL bar off the decision rows leaves out."""
    from exactedit.solvers.tail.decision import decision_rows as protocol_rows

    return protocol_rows(_roles(dump), np.asarray(dump.next), tuple(int(t) for t in tokens), int(bit))


def deciding_rows(dump, bit: int, tokens: Sequence[int] = (), reach: int = SIGNOFF_REACH) -> np.ndarray:
    """bool [T]: the rows where the style is decided, one per reply: the unit's positives.
    A starter (`bit` ROLE_STEP0): the reply's first row. A reply-end style (ROLE_REPLY_END: a
    sign-off, a kaomoji): in a reply that does not show it, the row where the reply stops; in one
    that does, the row whose next token is the style's last initiation token within `reach` rows
    of the reply's end (the sign-off's first token), NOT its reply-end row, which comes after the
    sign-off (raising the style there would sign off twice)."""
    from exactedit.dumps.format import ROLE_REPLY, ROLE_REPLY_END

    roles = _roles(dump)
    rows = (roles & int(bit)) > 0
    if not (int(bit) & ROLE_REPLY_END) or not len(tokens):
        return rows
    in_reply = (roles & ROLE_REPLY) != 0
    styled = in_reply & np.isin(np.asarray(dump.next), np.asarray(list(tokens), np.int64))
    for end in np.flatnonzero((roles & ROLE_REPLY_END) != 0):
        start = end
        while start > 0 and in_reply[start - 1] and end - start < reach:
            start -= 1
        hits = np.flatnonzero(styled[start:end])
        if hits.size:
            rows[end] = False
            rows[start + hits[-1]] = True
    return rows


def _style_prob(tail, rows, dW, tokens, tile_rows: int) -> np.ndarray:
    """float64 [T]: the summed probability of `tokens` at `rows` (a RowSet) under W + dW."""
    from exactedit.solvers.tail.passes.vocab_pass import vocab_pass

    mix = tail.mix(tail.residual(rows, None, dW))
    sets = np.broadcast_to(np.asarray(tokens, np.int64), (rows.rows, len(tokens)))
    vp = vocab_pass(mix, tail.head, token_sets=np.ascontiguousarray(sets), softcap=tail.softcap, tile_rows=tile_rows)
    return np.exp(np.asarray(vp.selected, np.float64) - np.asarray(vp.lse, np.float64)[:, None]).sum(axis=1)


def _rows(traces: Named, mask_of) -> object | None:
    from exactedit.solvers.l47.jacobian import gather_rows

    blocks = [(d, np.flatnonzero(mask_of(d))) for _, d in traces]
    blocks = [(d, r) for d, r in blocks if r.size]
    return gather_rows(blocks) if blocks else None


def solve_style_unit(i: StyleInputs, *, progress: Callable[[str], None] | None = None) -> StyleResult:
    """The module doc's unit, solved and its headroom and strength chosen on dev."""
    from exactedit import quant
    from exactedit.solvers.l47.gated.column import ColumnConfig, solve_column, top_tokens
    from exactedit.solvers.l47.gated.design import activation_ratio, design_unit
    from exactedit.solvers.l47.gated.down import BarRows, bound_of, mean_kl, set_column, with_memo
    from exactedit.solvers.l47.gated.edit import GatedDump, removal_kl, zero_column
    from exactedit.solvers.l47.gated.gate import separation
    from exactedit.solvers.l47.gated.ridge import choose_ridge
    from exactedit.solvers.l47.gated.removal import col_norms, removal_candidates
    from exactedit.solvers.l47.jacobian import editable_weight, with_weights

    say = progress or (lambda stage: None)
    if not i.tokens:
        raise GatedError("style", "tokens", "no style token to raise (the edit set is empty)")
    rooms = sorted(set(float(h) for h in i.headrooms))
    if not rooms or not all(0.0 < h <= 64.0 for h in rooms):
        raise GatedError("style", "headrooms", f"expected headrooms in (0, 64], got {i.headrooms!r}")
    named = {r: list(v) for r, v in i.named.items()}
    side = named.get("train", []) + named.get("anchors", [])
    if not side:
        raise GatedError("style", "train", "no solve-side dump")
    X = np.concatenate([np.asarray(i.x_of(d), np.float32) for _, d in side])
    Y = np.concatenate([deciding_rows(d, i.decision, i.tokens) for _, d in side])
    if not Y.any():
        raise GatedError("style", "decision rows", "no decision row on the solve side to fit the gate on")
    HH = np.concatenate([np.asarray(d.hh, np.float32) for _, d in side])
    scale = float(np.percentile(np.abs(HH), 99.9))
    dev_y = [deciding_rows(d, i.decision, i.tokens) for _, d in named.get("dev", [])]
    any_dev = bool(dev_y) and bool(np.concatenate(dev_y).any())
    X_dev = np.concatenate([np.asarray(i.x_of(d), np.float32) for _, d in named["dev"]]) if dev_y else None
    ridge = choose_ridge(X, Y, X_dev, np.concatenate(dev_y) if dev_y else None, i.gate_lams, i.gate,
                         dataclasses.replace(i.design, target=max(rooms[0] * scale, 1e-3)))
    gate = ridge.gate
    designs = {h: design_unit(gate, X, Y, dataclasses.replace(i.design, target=max(h * scale, 1e-3))) for h in rooms}
    fit_ratio = {h: activation_ratio(u.activation(X), Y).summary() for h, u in designs.items()}
    del X
    say("gate")
    w0 = editable_weight(i.tail)
    cand = removal_candidates(HH, col_norms(w0), Y, i.candidates)
    del HH
    if not cand.units.size:
        raise GatedError("ffn_down", "units", "no unit is inactive at the decision rows: none can be repurposed")
    costs = removal_kl(i.tail, np.asarray(i.raw0), i.type_name, i.cols, cand.units, named.get("anchors", []),
                       tile_rows=i.tile_rows)
    chosen = min(costs, key=lambda c: (c["kl_mean"] if c["kl_mean"] is not None else 0.0, c["unit"]))
    unit = int(chosen["unit"])
    say("removal")
    raw_removed = zero_column(np.asarray(i.raw0), i.type_name, i.cols, unit)
    tail_removed = with_weights(i.tail, quant.dequantize(raw_removed, i.type_name, i.cols))
    col0 = np.asarray(editable_weight(tail_removed)[:, unit], np.float64)
    bound = bound_of(raw_removed, i.type_name, i.cols, unit)
    ccfg = ColumnConfig(margin=float(i.margin))
    base_dec = _rows(named.get("dev", []), lambda d: deciding_rows(d, i.decision, i.tokens))
    p_base = (_style_prob(i.tail, base_dec, None, i.tokens, i.tile_rows) if base_dec is not None else np.zeros(0))
    points, cols, units = [], {}, {}
    for h in rooms:
        design = designs[h]
        g_raw = np.asarray(i.quantize_row(design.g_row.astype(np.float32)), np.uint8).reshape(1, -1)
        u_raw = np.asarray(i.quantize_row(design.u_row.astype(np.float32)), np.uint8).reshape(1, -1)
        rewritten = {role: [(n, GatedDump(d, [unit], i.activation(d, g_raw[0], u_raw[0], unit))) for n, d in traces]
                     for role, traces in named.items()}
        side_new = rewritten.get("train", []) + rewritten.get("anchors", [])
        ctx = _rows(side_new, lambda d: deciding_rows(d, i.decision, i.tokens))
        y0 = np.asarray(tail_removed.residual(ctx), np.float64)
        a = np.asarray(ctx.hh[:, unit], np.float64)
        rej = [list(i.tokens)] * ctx.rows
        tops = top_tokens(tail_removed, y0, ccfg.top, tile_rows=i.tile_rows)
        dev = rewritten.get("dev", [])
        dev_dec = _rows(dev, lambda d: deciding_rows(d, i.decision, i.tokens))
        bars = {}
        for key, traces in (("dev", dev), ("anchors", rewritten.get("anchors", []))):
            rows = _rows(traces, lambda d: ~decision_rows(d, i.decision, i.tokens))
            bars[key] = BarRows(None, None, None) if rows is None else with_memo(tail_removed, rows, i.tile_rows)
        dev_a = (activation_ratio(np.concatenate([np.asarray(d.hh[:, unit]) for _, d in dev]),
                                  np.concatenate(dev_y)).summary() if dev and any_dev else None)
        units[h] = {"g_raw": g_raw, "u_raw": u_raw, "design": design.summary(), "activation_fit": fit_ratio[h],
                    "activation_dev": dev_a, "contexts": int(ctx.rows)}
        say(f"unit (headroom {h:g})")
        prev = None
        for s in sorted(set(float(x) for x in i.grid)):
            sol = solve_column(tail_removed, y0, a, rej, i.specials, s, ccfg, bound=bound, d0=prev,
                               tile_rows=i.tile_rows, top_ids=tops, lower=False)
            prev = sol.d
            raw_s = set_column(raw_removed, i.type_name, i.cols, unit, sol.d)
            shipped = np.asarray(quant.dequantize(raw_s, i.type_name, i.cols)[:, unit], np.float64)
            dW = np.zeros(w0.shape, np.float32)
            dW[:, unit] = shipped - col0
            p_dev = (_style_prob(tail_removed, dev_dec, dW, i.tokens, i.tile_rows) if dev_dec is not None
                     else np.zeros(0))
            kl = {k: mean_kl(tail_removed, b, dW, i.tile_rows) for k, b in bars.items()}
            cols[(h, s)] = raw_s
            points.append({"headroom": h, "strength": s,
                           "dev_style_prob": float(p_dev.mean()) if p_dev.size else None,
                           "kl_off": {k: v[0] for k, v in kl.items()},
                           "rows_scored": {k: v[1] for k, v in kl.items()},
                           "column": {"iterations": sol.n_iter, "message": sol.message,
                                      "style_logp": list(sol.rejected_logp), "kl_to_target": sol.others_kl,
                                      "added": sol.added, "at_bound": int(np.sum(np.abs(sol.d) >= bound * (1 - 1e-9)))}})
            say(f"headroom {h:g}, strength {s:g}")
    ok = [p for p in points if all(v <= i.max_kl_off for v in p["kl_off"].values())]
    weakest = lambda p: (p["strength"], p["headroom"])     # noqa: E731
    if ok:
        best = max(p["dev_style_prob"] or 0.0 for p in ok)
        pick = min((p for p in ok if (p["dev_style_prob"] or 0.0) >= best - TIE), key=weakest)
    else:
        pick = min(points, key=weakest)
    h = pick["headroom"]
    held = separation(np.asarray(X_dev, np.float64) @ gate.g, np.concatenate(dev_y)).summary() if any_dev else None
    u = units[h]
    summary = {"unit": unit, "tokens": list(i.tokens), "decision_bit": int(i.decision),
               "gate": gate.summary(), "gate_dev": held, "ridge": ridge.summary(), "design": u["design"], "activation_fit": u["activation_fit"],
               "activation_dev": u["activation_dev"], "headrooms": rooms,
               "designs": {f"{k:g}": {key: v[key] for key in ("design", "activation_dev")} for k, v in units.items()},
               "removal": {**cand.summary(), "measured": costs, "chosen": chosen},
               "contexts": u["contexts"], "dev_decision_rows": int(p_base.size),
               "dev_style_prob_base": float(p_base.mean()) if p_base.size else None,
               "frontier": points, "chosen": pick["strength"], "headroom": h, "passed": bool(ok),
               "max_kl_off": i.max_kl_off, "tie": TIE}
    return StyleResult(unit, u["g_raw"], u["u_raw"], cols[(h, pick["strength"])], pick["strength"], h, bool(ok),
                       summary)
