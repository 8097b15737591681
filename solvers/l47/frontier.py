"""The edit's strength against its specificity: the frontier of an edit scaled per phrase.

The edit's first Gauss-Newton round is linear in its targets, so it is the sum of one edit per
phrase, dW_p (that phrase's targets, every hold at 0). The parts add up in dW, not in the logits:
the tail is nonlinear in dW (the final norm and head; a post-FFN norm, Gemma style, before them),
so a point's logits are never a sum of per-phrase effects and every point is scored through the
exact tail. At a strength vector s the tensor is
W + sum_p s_p dW_p (float, before shipping) and, on rows the solve never acted on, exactly (the
full tail and the full vocabulary at every point; on a plain RMSNorm tail along lines of
strengths, `line_frontier`: a head pass per direction of a batch, not per point,
solvers/tail/passes/line_pass.py):
- the cut: per phrase, 1 - mean p'(rejected) / mean p(rejected) over its slop positions
  (bar (c)'s statistic);
- the collateral: per word, the mean dlogp of its legitimate uses and the share below `low`
  (bar (d)'s statistics).
`choose` picks, among the points whose every word passes (d) (mean >= `min_mean`, share <=
`max_low_share`), the one with the largest mean cut over the phrases: where none passes, the
weakest, flagged. The chosen strengths are then solved (every target of phrase p scaled by s_p)
and shipped exactly; the frontier is an estimate for choosing only.

With more phrases than the grid's combinations can cover (GRID_LIMIT), the choice is a
coordinate search (`search_strengths`): from the best shared strength, each phrase in turn at
each grid strength with the others held, about P x G points instead of G^P; with the gated edit
each phrase's unit fires on its own contexts only, so the phrases' choices barely interact.

A word with fewer than `BarD.min_uses` legitimate uses on dev is not measured there: (d) cannot
judge it, so `choose_strength` leaves it out of the choice and never takes a phrase ending in it
above the cautious `WfldConfig.unmeasured_strength` (the edit is first order in the strength: at
0.3 a word nothing measured loses about a third of what full strength costs it). The run still
ships, with the word named in the report (`unmeasured`) and `passed_d` false.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import Callable, NamedTuple, Sequence

import numpy as np

from exactedit.solvers.tail.passes.vocab_pass import vocab_pass
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47.jacobian import gather_rows
from exactedit.solvers.tail.passes.line_pass import LINE_ELEMS, HeadTiles, LineScorer, line_ready
from exactedit.solvers.l47.mining import Mining
from exactedit.solvers.l47.problem import WfldProblem

__all__ = ["BarD", "FrontierBase", "FrontierRows", "Point", "choose", "choose_strength", "condition_phrase",
           "edited_logp", "frontier", "frontier_base", "frontier_rows", "grid_points", "line_frontier", "line_scorer",
           "phrase_factors", "phrase_parts", "point_at", "points", "residual_change", "scaled", "search_strengths"]


@dataclass(frozen=True)
class BarD:
    """Bar (d)'s thresholds, handed in by the caller (the protocol's): a word's legitimate uses pass
    when their mean dlogp is >= `min_mean` and at most `max_low_share` of them fall below `low`;
    a word with fewer than `min_uses` uses is not measured (the protocol's `collateral_min_uses`)."""

    low: float = -0.1
    min_mean: float = -0.05
    max_low_share: float = 0.1
    min_uses: int = 5


@dataclass(frozen=True, eq=False)
class FrontierRows:
    """The rows a frontier is measured on: slop positions (their phrase and rejected token) and
    legitimate uses (their word), gathered from the given traces."""

    rows: object                 # RowSet: slop rows, then use rows
    token: np.ndarray            # int64 [T] the token whose logp is followed
    slop: int                    # the first `slop` rows are slop positions
    phrase: np.ndarray           # int64 [slop]
    word: np.ndarray             # int64 [T - slop]


def frontier_rows(traces: Sequence[tuple[str, object]], mining: Mining) -> FrontierRows | None:
    """Slop positions and legitimate uses of `traces` (as mined), or None when there is neither."""
    sb, ub, tok_s, tok_u, phr, word = [], [], [], [], [], []
    for name, dump in traces:
        tm = mining.trace(name)
        nxt = np.asarray(dump.next, dtype=np.int64)
        if tm.rows.size:
            sb.append((dump, tm.rows))
            tok_s.append(nxt[tm.rows])
            phr.append(tm.phrase)
        if tm.coll_rows.size:
            ub.append((dump, tm.coll_rows))
            tok_u.append(nxt[tm.coll_rows])
            word.append(tm.coll_word)
    if not sb and not ub:
        return None
    cat = lambda xs: np.concatenate(xs).astype(np.int64) if xs else np.zeros(0, np.int64)  # noqa: E731
    return FrontierRows(gather_rows(sb + ub), np.concatenate([cat(tok_s), cat(tok_u)]), int(cat(tok_s).size),
                        cat(phr), cat(word))


@dataclass(frozen=True)
class Point:
    strength: tuple              # per phrase (index into the mining's phrases): its strength
    cut: dict                    # phrase index -> continuation cut
    cut_all: float | None        # over every slop position
    mean: dict                   # word index -> mean dlogp of its uses
    low: dict                    # word index -> share of uses below `low`
    uses: dict                   # word index -> uses
    kl: dict | None = None       # rows -> mean KL there, where the caller measures it (the gated edit)
    scored: int | None = None    # rows scored through the full head (the others provably unmoved)

    def passes(self, min_mean: float, max_low_share: float, ignore=(), max_kl: dict | None = None) -> bool:
        """Every word's uses pass (d), the words in `ignore` (not measured) left out; and, where
        measured, each mean KL is at most its `max_kl`."""
        if max_kl is not None and self.kl is not None and any(v > max_kl[k] for k, v in self.kl.items()):
            return False
        return all(self.mean[w] >= min_mean and self.low[w] <= max_low_share for w in self.mean if w not in ignore)

    def to_json(self, phrases: Sequence[str], words: Sequence[str]) -> dict:
        out = {"strength": {phrases[p]: s for p, s in enumerate(self.strength)}, "cut_all": self.cut_all,
               "cut": {phrases[p]: c for p, c in self.cut.items()},
               "collateral": {words[w]: {"mean": self.mean[w], "low": self.low[w], "uses": self.uses[w]}
                              for w in self.mean}}
        if self.kl is not None:
            out["kl"] = self.kl
        if self.scored is not None:
            out["rows_scored"] = self.scored
        return out


def _logp(tail, rows, token: np.ndarray, dW, tile_rows: int) -> np.ndarray:
    mix = tail.mix(tail.residual(rows, None, dW))
    vp = vocab_pass(mix, tail.head, token_sets=token[:, None], softcap=tail.softcap, tile_rows=tile_rows)
    return np.asarray(vp.selected[:, 0], np.float64) - vp.lse


class FrontierBase(NamedTuple):
    """The unedited side of a frontier's rows: the log-probs of the followed tokens, the residual
    [T, n] (what `moved.logit_bound` bounds an edit's effect against) and the scored points' per-row
    log-probs (`moved.RowMemo`)."""

    logp: np.ndarray
    y: np.ndarray
    memo: object                    # moved.RowMemo


def frontier_base(tail, fr: FrontierRows, tile_rows: int = 8192) -> FrontierBase:
    """`fr`'s unedited log-probs and residual (what `points` scores against)."""
    from exactedit.solvers.tail.moved import RowMemo

    y = tail.residual(fr.rows)
    vp = vocab_pass(tail.mix(y), tail.head, token_sets=fr.token[:, None], softcap=tail.softcap, tile_rows=tile_rows)
    logp = np.asarray(vp.selected[:, 0], np.float64) - vp.lse
    return FrontierBase(logp, np.asarray(y), RowMemo(tail, fr.rows, y, logp, tile_rows=tile_rows))


def edited_logp(tail, fr: FrontierRows, base: FrontierBase, dW, tile_rows: int = 8192) -> tuple[np.ndarray, int]:
    """(the log-probs of `fr`'s followed tokens under the edit dW, the rows scored through the full
    head): a row the edit provably cannot move by more than `moved.MOVE_TOL` nats from the base, or
    from a point already scored (`moved.RowMemo`: an edit of a few down columns whose units are ~0
    there), keeps that value; every other row is scored exactly over the full vocabulary."""
    if dW is None:
        return base.logp.copy(), 0

    def compute(move):
        if move.all():
            return _logp(tail, fr.rows, fr.token, dW, tile_rows)
        return _logp(tail, fr.rows.take(move), fr.token[move], dW, tile_rows)
    return base.memo.score(dW, compute)


def frontier(tail, parts: Sequence[np.ndarray], fr: FrontierRows, strengths: Sequence[Sequence[float]], *,
             low: float = -0.10, tile_rows: int = 8192, base=None) -> list[Point]:
    """The frontier of W + sum_p s_p dW_p (`parts`: one edit per phrase) at each strength vector
    s of `strengths` (see the module doc), exact in float32 logits."""
    parts = np.asarray(parts, np.float64)          # [P, n, h]: phrase_parts gives it as one array
    for sv in strengths:
        if len(sv) != len(parts):
            raise ValueError(f"a strength per part: {len(parts)} parts, got {list(sv)}")
    # each point's edit sum_p s_p dW_p as one product over the parts (a pass over them, not P
    # scaled copies: on Qwen's 21 phrases, 0.7 s a point of 3)
    return points(tail, fr, ((sv, np.tensordot(np.asarray(sv, np.float64), parts, axes=1)) for sv in strengths),
                  low=low, tile_rows=tile_rows, base=base)


def points(tail, fr: FrontierRows, edits, *, low: float = -0.10, tile_rows: int = 8192,
           base: FrontierBase | None = None) -> list[Point]:
    """A Point per (strength vector, dW [n, h]) of `edits`, each scored exactly on `fr`'s rows
    against the unedited tail (the gated edit hands in one shipped column per strength; a row it
    provably cannot move by more than `moved.MOVE_TOL` keeps its base value, `edited_logp`);
    `base` the unedited side when already computed (`frontier_base`)."""
    base = frontier_base(tail, fr, tile_rows) if base is None else base
    out = []
    for sv, dW in edits:
        lp, scored = edited_logp(tail, fr, base, dW, tile_rows)
        out.append(point_at(sv, fr, base.logp, lp, low=low, scored=scored))
    return out


def point_at(sv, fr: FrontierRows, base_logp: np.ndarray, lp: np.ndarray, *, low: float = -0.10,
             scored: int | None = None) -> Point:
    """The Point of strengths `sv` from its log-probs `lp` of `fr`'s followed tokens and the
    unedited ones `base_logp`."""
    P = fr.slop
    p0, p1 = np.exp(base_logp[:P]), np.exp(lp[:P])
    cut = {int(ph): float(1.0 - p1[fr.phrase == ph].mean() / p0[fr.phrase == ph].mean())
           for ph in np.unique(fr.phrase)}
    d = (lp - base_logp)[P:]
    words = np.unique(fr.word)
    return Point(tuple(float(x) for x in sv), cut, float(1.0 - p1.mean() / p0.mean()) if P else None,
                 {int(w): float(d[fr.word == w].mean()) for w in words},
                 {int(w): float(np.mean(d[fr.word == w] < low)) for w in words},
                 {int(w): int(np.sum(fr.word == w)) for w in words}, scored=scored)


def residual_change(parts, hh) -> Callable[[np.ndarray], np.ndarray]:
    """s [P] -> float64 [T, n]: the change hh (sum_p s_p dW_p)^T of rows hh [T, h] under the phrase
    parts, formed ([P, n, h]: a single phrase's part read as itself) or unformed
    (`gauss_newton.PartFactors`: ((hh G^T) * (lam s)) U, the parts never formed)."""
    hh = np.asarray(hh, np.float64)
    if isinstance(parts, wfld.PartFactors):
        hg = hh @ parts.G.T                        # [T, K]
        return lambda s: (hg * (parts.lam @ s)) @ parts.U
    parts = np.asarray(parts, np.float64)

    def change(s):
        nz = np.flatnonzero(s)
        if nz.size == 1:
            return hh @ (s[nz[0]] * parts[nz[0]]).T
        return hh @ np.tensordot(s, parts, axes=1).T
    return change


def line_scorer(tail, parts, rows, token, *, tile_rows: int = 8192, max_elems: int = LINE_ELEMS,
                head: HeadTiles | None = None) -> LineScorer:
    """A `line_pass.LineScorer` of the rows `rows` (a RowSet) and their followed tokens under the
    phrase parts (formed or unformed, `residual_change`)."""
    P = parts.lam.shape[1] if isinstance(parts, wfld.PartFactors) else len(parts)
    return LineScorer(tail, residual_change(parts, rows.hh), P, rows, token, tile_rows=tile_rows,
                      max_elems=max_elems, head=head)


def line_frontier(scorer, fr: FrontierRows, strengths: Sequence[Sequence[float]], *, low: float = -0.10) -> list[Point]:
    """The frontier of `frontier` at `strengths` through a `line_scorer` of `fr`'s rows and the
    phrase parts: the same points, each row through the full head, a head pass per direction of
    the batch instead of one per point (solvers/tail/passes/line_pass.py)."""
    lps = scorer.logp([tuple(sv) for sv in strengths]) if len(strengths) else []
    return [point_at(sv, fr, scorer.base, lp, low=low, scored=len(fr.token)) for sv, lp in zip(strengths, lps)]


#: cuts within this of the best passing cut count as equal, and the weakest of them is chosen
CUT_TIE = 0.01


def choose(points: Sequence[Point], *, min_mean: float, max_low_share: float, ignore=(),
           max_kl: dict | None = None, phrase: int | None = None) -> tuple[Point, bool]:
    """(among the points passing (d), the one of the smallest total strength whose mean cut over
    its phrases is within CUT_TIE of the largest; True), else (the point of the smallest total
    strength, False). The words in `ignore` (word indices: not measured) are not judged.
    The weakest of equal cuts: the frontier scales the first round's edit, and says nothing of
    what a stronger one does to the other tokens at the contexts; on Qwen the gated edit cut
    0.99 of "Here's an" on dev at 1.0 and 1.0 at 4.0, and at 4.0 (chosen, ties to the larger) the
    solve's targets of -20 nats drove its Gauss-Newton rounds apart (KL 12 on the anchors).
    A point with a measured `kl` above its `max_kl` does not pass. With `phrase` (a coordinate
    step of the search, `choose_strength`), the cut compared is that phrase's own."""
    ok = [p for p in points if p.passes(min_mean, max_low_share, ignore, max_kl)]
    if ok:
        if phrase is None:
            cut = lambda p: float(np.mean(list(p.cut.values()))) if p.cut else 0.0  # noqa: E731
        else:
            cut = lambda p: float(p.cut.get(phrase, 0.0))  # noqa: E731
        best = max(cut(p) for p in ok)
        return min((p for p in ok if cut(p) >= best - CUT_TIE), key=lambda p: (sum(p.strength), -cut(p))), True
    return min(points, key=lambda p: sum(p.strength)), False


#: above this many per-phrase combinations the grid is searched by coordinates (`choose_strength`)
GRID_LIMIT = 256


def grid_points(grid: Sequence[float], phrases: int, limit: int = GRID_LIMIT) -> list[tuple[float, ...]]:
    """Every per-phrase combination of the grid's strengths, or (above `limit` combinations) one
    shared strength for every phrase: the start of the coordinate search."""
    grid = sorted(set(float(x) for x in grid))
    if len(grid) ** phrases <= limit:
        return [tuple(c) for c in itertools.product(grid, repeat=phrases)]
    return [(g,) * phrases for g in grid]


def search_strengths(combos, grid, measured, capped=lambda c: c, *, progress=None,
                     **pick) -> tuple[list[Point], Point, bool]:
    """(every point measured, the chosen one, whether it passes): `choose` over `combos`, then with
    a `grid` (the combinations too many to measure: `combos` the shared strengths) a coordinate
    search from the best of them, one phrase at a time in order, each step measuring that phrase at
    every other strength of the grid (`capped`) with the others where they are, and keeping the
    `choose` of the step by that phrase's own cut (len(grid) + P (len(grid) - 1) points at most).
    `measured(combos)` -> a Point each. `progress(done, total)`: after each batch, the points
    measured against the most the search can measure."""
    combos = list(combos)
    most = len(combos) + (len(combos[0]) * (len(grid) - 1) if grid is not None and combos else 0)
    tell = progress or (lambda done, total: None)
    pts = list(measured(combos))
    tell(len(pts), most)
    best, passed = choose(pts, **pick)
    if grid is None:
        return pts, best, passed
    seen = {p.strength for p in pts}
    for ph in range(len(best.strength)):
        alts = [c for c in dict.fromkeys(capped(best.strength[:ph] + (g,) + best.strength[ph + 1:]) for g in grid)
                if c not in seen]
        new = list(measured(alts)) if alts else []
        seen.update(p.strength for p in new)
        pts += new
        most -= len(grid) - 1 - len(new)           # a step measures fewer where points were seen or capped
        tell(len(pts), most)
        best, passed = choose([best] + new, **pick, phrase=ph)
    return pts, best, passed


def choose_strength(cfg, tail, problem, mining: Mining, dev: Sequence[tuple[str, object]],
                    collateral: Sequence[tuple[str, object]], bar_d: BarD, *, edits=None, kl_of=None,
                    max_kl: dict | None = None, progress=None):
    """Per phrase, a strength of `cfg.strength_grid`: the combination whose dev collateral passes
    (d) on the `dev` traces' legitimate uses with the largest mean dev cut, read off the frontier of
    the per-phrase edits of the problem's first round. A word with fewer than `bar_d.min_uses` dev
    uses is not judged, and each phrase ending in it is held at or below `cfg.unmeasured_strength`
    (a grid strength above it is taken at it; without any dev row, every phrase at its strongest
    allowed point). Returns (the problem at those strengths, which the caller solves and ships; the
    report's section: the dev frontier, the chosen strengths, whether (d) passed (never with a word
    not measured), the words not measured with their dev uses and the phrases limited, and the
    same points on the `collateral` traces the bars score, reported only). `edits(combos)`, when
    given, yields (combo, dW) for each combo of absolute strengths in place of the scaled first
    round (the gated edit: a column solved and shipped per strength); `kl_of(combo)` (absolute
    strengths), when given, measures each point's mean KL on some rows ({rows: KL}), and a point
    above `max_kl[rows]` does not pass (the gated edit's cost at the phrase's contexts grows with its strength).
    `progress(done, total)`: the dev points measured (`search_strengths`)."""
    fr = frontier_rows(dev, mining)
    n_ph = len(mining.phrases)
    uses = np.bincount(fr.word, minlength=len(mining.words)) if fr is not None else np.zeros(len(mining.words), int)
    short = [wi for wi in range(len(mining.words)) if uses[wi] < bar_d.min_uses]
    limited = sorted({p for wi in short for p in mining.word_phrases[wi]})
    cap = cfg.unmeasured_strength / cfg.strength
    grid = sorted(set(s / cfg.strength for s in cfg.strength_grid))
    capped = lambda c: tuple(min(x, cap) if p in limited else x for p, x in enumerate(c))  # noqa: E731
    combos = list(dict.fromkeys(capped(c) for c in grid_points(grid, n_ph, GRID_LIMIT)))
    search = len(grid) ** n_ph > GRID_LIMIT
    lines = edits is None and line_ready(tail)
    parts = None if edits is not None else phrase_factors(problem, n_ph) if lines else phrase_parts(problem, n_ph)
    head = HeadTiles(tail, cfg.tile_rows) if lines else None     # the dev and collateral lines' one head
    bases: dict = {}

    def score(rows, combos):
        if id(rows) not in bases:
            bases[id(rows)] = (line_scorer(tail, parts, rows.rows, rows.token, head=head) if lines
                               else frontier_base(tail, rows, cfg.tile_rows))
        base = bases[id(rows)]
        if lines:
            return line_frontier(base, rows, combos, low=bar_d.low)
        if edits is None:
            return frontier(tail, parts, rows, combos, low=bar_d.low, tile_rows=cfg.tile_rows, base=base)
        return [dataclasses.replace(p, strength=c) for p, c in zip(points(
            tail, rows, edits([tuple(x * cfg.strength for x in c) for c in combos]), low=bar_d.low,
            tile_rows=cfg.tile_rows, base=base), combos)]

    def measured(combos):
        pts = score(fr, combos)
        if kl_of is not None:
            pts = [dataclasses.replace(p, kl=dict(kl_of(tuple(x * cfg.strength for x in p.strength)))) for p in pts]
        return pts

    pick = dict(min_mean=bar_d.min_mean, max_low_share=bar_d.max_low_share, ignore=short, max_kl=max_kl)
    if fr is None:      # nothing on dev to read: every phrase at its strongest allowed point
        pts, passed = [], False
        best = Point(max(combos, key=sum), {}, None, {}, {}, {})
    else:
        pts, best, passed = search_strengths(combos, grid if search else None, measured, capped, progress=progress,
                                             **pick)
    words = [tail.tokens.piece(int(w)) for w in mining.words]
    phrases = list(mining.phrases)
    absolute = lambda p: dataclasses.replace(p, strength=tuple(x * cfg.strength for x in p.strength))  # noqa: E731
    out = {"chosen": {phrases[i]: x * cfg.strength for i, x in enumerate(best.strength)}, "on": "dev",
           "passed_d": passed and not short, "measured_passed_d": passed, "solved_at": cfg.strength,
           "grid": sorted(set(cfg.strength_grid)), "min_uses": bar_d.min_uses, "max_kl": max_kl,
           "unmeasured": {words[wi]: int(uses[wi]) for wi in short},
           "limited": {phrases[p]: cfg.unmeasured_strength for p in limited},
           "frontier": [absolute(p).to_json(phrases, words) for p in pts]}
    held = frontier_rows(collateral, mining)
    if held is not None:   # the same points on the collateral the bars score: reported, never chosen on
        shown = list(dict.fromkeys(combos + [best.strength])) if search else [p.strength for p in pts] or combos
        out["collateral_frontier"] = [absolute(p).to_json(phrases, words) for p in score(held, shown)]
    out["search"] = ({"kind": "coordinate", "points": len(pts), "combinations": len(grid) ** n_ph} if search
                     else {"kind": "grid", "points": len(pts)})
    if edits is not None:
        return problem, out
    return (scaled(problem, best.strength) if any(x != 1.0 for x in best.strength) else problem), out


def condition_phrase(problem: WfldProblem) -> np.ndarray:
    """int64 [K]: each condition's phrase (index into the phrases) at FTPO rows, -1 at the holds'
    rows (anchors, word holds)."""
    P = problem.ftpo.rejected.size
    slot = problem.cond.slot
    return np.where(slot < P, np.asarray(problem.ftpo.phrase, np.int64)[np.minimum(slot, max(P - 1, 0))], -1)


def scaled(problem: WfldProblem, scale) -> WfldProblem:
    """The same problem with every target multiplied by `scale`: one number, or one per phrase
    (the targets at that phrase's FTPO rows); the holds' targets are 0 and stay held. The targets
    are logit changes, solved for from the base by Gauss-Newton and re-scored exactly, so a scaled
    problem is exact whatever the tail's curvature (not a scaled edit)."""
    sv = np.asarray(scale, dtype=np.float64)
    if sv.ndim == 0:
        factor = np.full(problem.cond.size, float(sv))
    else:
        ph = condition_phrase(problem)
        factor = np.where(ph >= 0, sv[np.maximum(ph, 0)], 1.0)
    return dataclasses.replace(problem, cond=problem.cond._replace(target=problem.cond.target * factor))


def phrase_parts(problem: WfldProblem, phrases: int) -> np.ndarray:
    """float64 [P, n, h]: per phrase, the first Gauss-Newton round's edit for that phrase's targets
    alone (every other target and every hold at 0), at the base linearization: their sum is that
    round's edit, in dW (their effects on the logits do not add up through the nonlinear tail, post-FFN norm or not:
    `frontier` scores every combination exactly)."""
    return phrase_factors(problem, phrases).dense()


def phrase_factors(problem: WfldProblem, phrases: int) -> wfld.PartFactors:
    """`phrase_parts` unformed (`gauss_newton.PartFactors`: what the search along lines reads)."""
    ph = condition_phrase(problem)
    bs = np.stack([np.where(ph == p, problem.cond.target, 0.0) for p in range(phrases)], axis=1)
    return wfld.min_norm_factors(problem.base.U, problem.hh, problem.M, bs, problem.cond.eps, problem.gram())
