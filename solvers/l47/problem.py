"""The WFLD problem (SPEC.md section 5), built from mined positions: the conditions table, the FTPO
targets, the per-word null basis, the background metric and the shipper.

`ftpo_rows` takes the train positions a solve acts on (mining minus the held-out share, which the
caller draws); `build_problem` turns them into a `WfldProblem`: the alternatives at each position
(one full-vocabulary pass), the special-token holds at the riskiest anchor rows, the condition
table (one row per gathered hh row, columns rejected | alternatives | specials | variants), the
exact base logits and the targets on them, the null basis B of the words' held uses, the metric C
of the background rows and M (C restricted to dW B = 0), and the shipper of the tensor's type.
`solvers.l47.solve` runs Gauss-Newton on it. This module never reads a protocol, a ledger or a
split: the caller hands it the dumps by role and the held-out mask.
"""
from __future__ import annotations

import dataclasses

from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import numpy as np

from exactedit import quant
from exactedit.solvers.phrases import TokenBytes
from exactedit.solvers.tail.logits import tail_mix
from exactedit.solvers.tail.passes.vocab_pass import vocab_pass
from exactedit.solvers.l47 import alternatives as alt_mod
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47 import key as key_mod
from exactedit.solvers.l47 import ship as ship_mod
from exactedit.solvers.l47.config import WfldConfig, WfldError
from exactedit.solvers.l47.jacobian import RowSet, editable_weight, gather_rows, linearize, token_rows, with_weights
from exactedit.solvers.l47.mining import Mining

__all__ = ["FtpoRows", "WfldProblem", "anchor_rows", "background_rows", "build_problem", "ftpo_rows",
           "Plausible", "plausible_rows", "uses_by_word"]

Named = Sequence[tuple[str, object]]        # (trace name, dumps.Dump)


@dataclass(frozen=True, eq=False)
class FtpoRows:
    """The train FTPO positions a solve acts on, in trace order."""

    blocks: list                 # [(dump, rows int64)] per train trace
    rejected: np.ndarray         # int64 [P] the actual next token (the phrase's final token)
    phrase: np.ndarray           # int64 [P] index into the phrases
    where: list                  # [(trace name, row)] per position
    rows: RowSet                 # the gathered rows of `blocks`


def ftpo_rows(train: Named, mining: Mining, held: Mapping[str, np.ndarray]) -> FtpoRows:
    """The mined FTPO positions of each train trace outside its held-out mask `held[name]` (bool
    [P] over that trace's positions); raises WfldError when none is left."""
    blocks, rej, phr, where = [], [], [], []
    for name, dump in train:
        tm = mining.trace(name)
        keep = ~held[name]
        blocks.append((dump, tm.rows[keep]))
        where += [(name, int(r)) for r in tm.rows[keep]]
        rej.append(np.asarray(dump.next)[tm.rows[keep]])
        phr.append(tm.phrase[keep])
    rej, phr = np.concatenate(rej).astype(np.int64), np.concatenate(phr)
    if rej.size == 0:
        raise WfldError("train", "ftpo", f"no FTPO position of {list(mining.phrases)} outside the held-out share "
                        "in the train dumps")
    return FtpoRows(blocks, rej, phr, where, gather_rows(blocks))


def anchor_rows(tail, anchors: Sequence[object], specials, count: int) -> list[tuple[object, np.ndarray]]:
    """The `count` anchor rows (over the dumps `anchors`) where a special token is closest to (or
    above) the actual next token's logit: the rows where holding the specials matters most."""
    if count == 0:
        return []
    cands = []
    w_sp = token_rows(tail.head, specials)
    for ai, d in enumerate(anchors):
        nxt = np.asarray(d.next, dtype=np.int64)
        rows = np.flatnonzero(nxt >= 0)
        if rows.size == 0:
            continue
        mix = np.asarray(tail_mix(tail, d), dtype=np.float64)[rows]
        uniq, inv = np.unique(nxt[rows], return_inverse=True)
        l_next = np.einsum("tn,tn->t", mix, token_rows(tail.head, uniq)[inv])
        risk = (mix @ w_sp.T).max(axis=1) - l_next
        cands += [(float(r), ai, int(row)) for r, row in zip(risk, rows)]
    cands.sort(key=lambda c: (-c[0], c[1], c[2]))
    picked = cands[:count]
    return [(anchors[ai], np.array(sorted(row for _, a, row in picked if a == ai), dtype=np.int64))
            for ai in range(len(anchors)) if any(a == ai for _, a, _ in picked)]


def uses_by_word(traces: Named, mining: Mining, width: int | None = None) -> list[np.ndarray]:
    """Per word of `mining`, the hh rows of its legitimate uses in `traces`, concatenated in trace
    order. With `width`, a float64 [0, width] block leads each concatenation (so a word with no use,
    or no trace at all, gives [0, width], and the rows come out as float64); without, the rows keep
    the dumps' dtype and `traces` must not be empty."""
    out = []
    for wi in range(len(mining.words)):
        hh = [np.asarray(d.hh)[mining.trace(n).coll_rows[mining.trace(n).coll_word == wi]] for n, d in traces]
        out.append(np.concatenate(([np.zeros((0, width))] if width is not None else []) + hh, axis=0))
    return out


@dataclass(frozen=True, eq=False)
class Plausible:
    """One word's plausible contexts in the solve-side traces: (dump, rows, base logp of the word)
    blocks, in trace order."""

    blocks: list

    def hh(self, h: int) -> np.ndarray:
        return np.concatenate([np.zeros((0, h))] + [np.asarray(d.hh[r], np.float64) for d, r, _ in self.blocks])

    def top(self, count: int) -> list:
        """The `count` rows where the word is likeliest, as (dump, rows) blocks in trace order."""
        flat = [(-float(lp), bi, int(r)) for bi, (_, rows, lps) in enumerate(self.blocks) for r, lp in zip(rows, lps)]
        flat.sort()
        picked = flat[:count]
        return [(self.blocks[bi][0], np.array(sorted(r for _, b, r in picked if b == bi), dtype=np.int64))
                for bi in range(len(self.blocks)) if any(b == bi for _, b, _ in picked)]


def plausible_rows(tail, traces: Named, mining: Mining, floor: float, *, chunk: int = 2048,
                   tile_rows: int = 8192) -> list[Plausible]:
    """Per word of `mining`, the rows of `traces` where the base model gives the word probability
    >= `floor` and that are no slop context of any phrase (the trace's FTPO rows): the word's
    plausible contexts, legitimate uses included. One exact full-vocabulary pass over every row,
    `chunk` rows at a time."""
    words = np.asarray(mining.words, dtype=np.int64)
    out = [Plausible([]) for _ in words]
    log_floor = float(np.log(floor))
    for name, dump in traces:
        slop = np.zeros(dump.rows, dtype=bool)
        slop[np.asarray(mining.trace(name).rows, dtype=np.int64)] = True
        for a in range(0, dump.rows, chunk):
            b = min(dump.rows, a + chunk)
            mix = tail.mix(tail.residual(dump, slice(a, b)))
            vp = vocab_pass(mix, tail.head, token_sets=words, softcap=tail.softcap, tile_rows=tile_rows)
            logp = np.asarray(vp.selected, np.float64) - vp.lse[:, None]
            for wi in range(words.size):
                rows = np.flatnonzero((logp[:, wi] >= log_floor) & ~slop[a:b])
                if rows.size:
                    out[wi].blocks.append((dump, rows + a, logp[rows, wi]))
    return out


def background_rows(name: str, dump, mining: Mining) -> np.ndarray:
    """A trace's hh rows for the background metric, without its slop contexts (its FTPO rows in
    `mining`): those are where the edit must act, so they are not part of the background it must
    keep quiet on (bar (e) still scores every row)."""
    hh = np.asarray(dump.hh)
    keep = np.ones(hh.shape[0], dtype=bool)
    keep[np.asarray(mining.trace(name).rows, dtype=np.int64)] = False
    return hh[keep]


@dataclass(frozen=True, eq=False)
class WfldProblem:
    """Everything Gauss-Newton needs, and what the summaries read afterwards.

    The condition table `tok` [R, 1 + k + s + m] has one row per gathered row (`rows`: the P FTPO
    positions, then the anchor rows) and columns rejected | k alternatives | s specials | m variants
    (-1 pads; anchor rows hold the specials in their first s columns); (slot, col) lists its
    entries row-major, and `cond` is one condition per entry."""

    w0: np.ndarray               # float32 [n, h] the tensor's runtime view
    ftpo: FtpoRows
    specials: tuple[int, ...]
    vp: object                   # the target pass (solvers.tail.passes.vocab_pass): top-k ids, logits, lse
    alts: alt_mod.Alternatives
    rows: RowSet                 # FTPO rows, then the anchor rows
    tok: np.ndarray              # int64 [R, 1 + k + s + m]
    slot: np.ndarray             # int64 [K]
    col: np.ndarray              # int64 [K]
    cond: wfld.Conditions
    base: wfld.Evaluation        # exact logits and VJPs at w0
    evaluate: Callable           # w -> wfld.Evaluation at the conditions
    held_by_word: list           # per word: hh of the uses the null space holds
    key: key_mod.Key             # the edit's input side (dW Q_perp = 0)
    B: np.ndarray                # [h, r] the null basis (dW B = 0)
    hh_bg: np.ndarray            # the background rows
    C: np.ndarray | None         # [h, h] background metric (None: built without, `build_problem`)
    M: np.ndarray | None         # [h, h] C restricted to dW B = 0
    raw0: np.ndarray             # uint8 the tensor's original bytes
    type_name: str
    cols: int
    view: Callable               # (raw, type, cols) -> the runtime view
    shipper: wfld.Shipper
    cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)  # shared by `replace`

    def gram(self) -> wfld.Gram:
        """gram_parts(hh, M), computed once for this problem and every problem made from it by
        dataclasses.replace with the same rows and metric (`frontier.scaled` changes the targets
        only): the strength's per-phrase parts and the Gauss-Newton rounds share it (K h^2)."""
        hit = self.cache.get("gram")
        if hit is None or hit[0] is not self.rows or hit[1] is not self.slot or hit[2] is not self.M:
            hit = (self.rows, self.slot, self.M, wfld.gram_parts(self.hh, self.M))
            self.cache["gram"] = hit
        return hit[3]

    @property
    def k(self) -> int:
        return int(self.alts.ids.shape[1])

    @property
    def hh(self) -> np.ndarray:
        """hh of each condition's row [K, h]."""
        return self.rows.hh[self.slot]

    def column(self, kind: str, j: int = 0) -> int:
        """The table column of the j-th `rejected` / `raised` / `variants` entry."""
        return {"rejected": 0, "raised": 1, "variants": 1 + self.k + len(self.specials)}[kind] + j


def build_problem(cfg: WfldConfig, tail, ftpo: FtpoRows, mining: Mining, *, specials: Sequence[int],
                  phrases: Sequence[str], anchors: Named, held_from: Named, background_from: Named,
                  raw0: np.ndarray, type_name: str, cols: int, device_head=None, key=None, metric: bool = True,
                  mark: Callable[[str], None] | None = None) -> WfldProblem:
    """The problem of `ftpo` (cfg's alternatives, margins, holds and metric). `anchors`: the anchor
    dumps (the special-token holds); `held_from`: the dumps whose legitimate uses of the words form
    the null space; `background_from`: the dumps of the background metric (less their slop
    contexts); `raw0`, `type_name`, `cols`: the edited tensor's bytes as stored. `device_head`
    (solvers.tail.passes.device_pass.to_device) runs the target pass on a device; `key` a fixed key
    space (the gated edit's one unit), else cfg's kind is built. `metric` False: no background
    metric, null basis or shipping metric (C and M None, B empty, the plain shipper): the gated
    edit solves its columns through the exact tail and ships them itself, and reads the problem
    only for its conditions and their exact logits (on Qwen at 21 phrases the metric's products
    were 147 s of the solve). `mark(stage)` is
    called once the conditions ("targets") and once the metric ("metric") are built."""
    mark = mark or (lambda stage: None)
    w0 = editable_weight(tail)
    rej, phr = ftpo.rejected, ftpo.phrase
    mix_t = tail.mix(tail.residual(ftpo.rows))
    pool = max(cfg.alt_pool, cfg.alternatives + len(specials) + 1)
    if device_head is None:
        vp = vocab_pass(mix_t, tail.head, topk=pool, softcap=tail.softcap, tile_rows=cfg.tile_rows)
    else:
        from exactedit.solvers.tail.passes.device_pass import vocab_pass_jax

        vp = vocab_pass_jax(mix_t, device_head, topk=pool, softcap=tail.softcap, tile_rows=cfg.tile_rows)
    tb = TokenBytes(tail.tokens)
    sense = {ph: alt_mod.same_sense_ids(ws, tb, tail.spec.vocab) for ph, ws in cfg.same_sense}
    alts = alt_mod.choose(vp.topk_ids, vp.topk_logits, vp.lse, rej, specials, cfg.alternatives, cfg.alt_floor,
                          tb, [sense.get(phrases[p], frozenset()) for p in phr] if sense else None)
    a_blocks = anchor_rows(tail, [d for _, d in anchors], specials, cfg.special_rows)
    plaus = (plausible_rows(tail, held_from, mining, cfg.key_floor, tile_rows=cfg.tile_rows)
             if (cfg.key != "dense" and key is None) or cfg.word_holds else None)
    h_blocks, h_word = [], []
    for wi, pl in enumerate(plaus if cfg.word_holds else ()):
        for d, r in pl.top(cfg.word_holds):
            h_blocks.append((d, r))
            h_word.append(np.full(r.size, mining.words[wi], dtype=np.int64))
    rs = gather_rows(ftpo.blocks + a_blocks + h_blocks)
    P, s_n, k, m = rej.size, len(specials), cfg.alternatives, alts.variants.shape[1]
    NA = sum(int(r.size) for _, r in a_blocks)
    tok = np.full((rs.rows, 1 + k + s_n + m), -1, dtype=np.int64)
    tok[:P, 0], tok[:P, 1:1 + k], tok[:P, 1 + k:1 + k + s_n] = rej, alts.ids, specials
    tok[:P, 1 + k + s_n:] = alts.variants
    tok[P:P + NA, :s_n] = specials
    if h_word:
        tok[P + NA:, 0] = np.concatenate(h_word)
    slot, col = wfld.condition_layout(tok)
    kind = np.select([slot >= P + NA, slot >= P], [wfld.WORD_HOLD, wfld.SPECIAL_ANCHOR],
                     np.select([col == 0, col <= k, col <= k + s_n],
                               [wfld.REJECTED, wfld.ALTERNATIVE, wfld.SPECIAL_TARGET], wfld.VARIANT))
    head_cache: dict = {}

    def evaluate(w):
        lin = linearize(with_weights(tail, w), rs, tok, backend=cfg.backend, head_cache=head_cache)
        return wfld.Evaluation(lin.logits[slot, col], lin.u[slot, col])

    base = evaluate(w0)
    base_tab = np.full(tok.shape, np.nan)
    base_tab[slot, col] = base.logits
    margins = np.array([cfg.margin_for(phrases[p]) for p in phr])
    d_rej, d_alt = wfld.ftpo_targets(base_tab[:P, 0], base_tab[:P, 1:1 + k], margins, cfg.delta_cho)
    d_rej, d_alt = d_rej * cfg.strength, d_alt * cfg.strength
    target_tab = np.zeros(tok.shape)
    target_tab[:P, 0], target_tab[:P, 1:1 + k] = d_rej, d_alt
    target_tab[:P, 1 + k + s_n:] = d_rej[:, None]      # variants count as rejected: they move with it
    target = target_tab[slot, col]
    eps = np.where(kind == wfld.WORD_HOLD, cfg.word_hold_eps,
                   np.where(np.isin(kind, wfld.HOLD_KINDS), cfg.hold_eps, cfg.target_eps))
    cond = wfld.Conditions(slot, tok[slot, col], kind.astype(np.int8), target, eps)
    mark("targets")

    groups = uses_by_word(held_from, mining)
    hh_bg = np.concatenate([background_rows(n, d, mining) for n, d in background_from])
    key = key if key is not None else problem_key(cfg, tail, ftpo, mining, plaus)
    if metric:
        C = wfld.background_metric(hh_bg, cfg.ridge)
        M, B = key_mod.key_metric(key, C, groups, null_rank=cfg.null_rank if key.Q is None else cfg.key_null_rank,
                                  null_tol=cfg.null_tol)
    else:
        C = M = None
        B = np.zeros((w0.shape[1], 0))
    view = quant.runtime_view if tail.kind == "hc4" else quant.dequantize
    if metric and ship_mod.uses_feedback(cfg.ship, type_name):
        kept = np.concatenate(groups + [np.asarray(rs.hh, np.float64)], axis=0)
        metric = ship_mod.shipping_metric(hh_bg, cfg.ridge, kept, w0, cfg.ship_hold_weight)
        shipper = ship_mod.FeedbackShipper(raw0, type_name, cols, view, metric, cfg.ship_sweeps)
    else:
        shipper = wfld.Shipper(raw0, type_name, cols, view)
    mark("metric")
    return WfldProblem(w0, ftpo, tuple(specials), vp, alts, rs, tok, slot, col, cond, base, evaluate, groups,
                       key, B, hh_bg, C, M, raw0, type_name, int(cols), view, shipper)


def problem_key(cfg: WfldConfig, tail, ftpo: FtpoRows, mining: Mining, plaus: Sequence[Plausible] | None
                ) -> key_mod.Key:
    """cfg.key built on the train FTPO rows (per rejected word) against the words' plausible
    contexts in the solve-side traces (`plausible_rows` of train and null, never a held-out or
    collateral trace)."""
    if cfg.key == "dense":
        return key_mod.dense_key()
    h = editable_weight(tail).shape[1]
    words = np.asarray(mining.words, dtype=np.int64)
    slop = [np.asarray(ftpo.rows.hh, np.float64)[ftpo.rejected == w] for w in words]
    return key_mod.build_key(cfg.key, slop, [p.hh(h) for p in plaus], dims=cfg.key_dims, ridge=cfg.ridge,
                             min_ratio=cfg.key_min_ratio, h=h)
