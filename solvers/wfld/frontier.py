"""The edit's strength against its specificity: the frontier of an edit dW scaled by s.

At each strength s the tensor is W + s dW (float, before shipping) and, on rows the solve never
acted on, exactly (the full tail and a full-vocabulary pass per strength):
- the cut: per phrase, 1 - mean p'(rejected) / mean p(rejected) over its slop positions
  (bar (c)'s statistic);
- the collateral: per word, the mean dlogp of its legitimate uses and the share below `low`
  (bar (d)'s statistics).
`choose` picks the largest strength whose every word passes (d) (mean >= `min_mean`, share <=
`max_low_share`): where none does, the smallest, flagged. The solve is linear in its targets, so
s dW is what scaling every target by s gives in the first Gauss-Newton round; the chosen
strength is then solved and shipped exactly, and the frontier is an estimate for choosing only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.solvers.tail.vocab_pass import vocab_pass
from exactedit.solvers.wfld.jacobian import gather_rows
from exactedit.solvers.wfld.mining import Mining

__all__ = ["FrontierRows", "Point", "choose", "frontier", "frontier_rows"]


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
    strength: float
    cut: dict                    # phrase index -> continuation cut (None without slop rows)
    cut_all: float | None        # over every slop position
    mean: dict                   # word index -> mean dlogp of its uses
    low: dict                    # word index -> share of uses below `low`
    uses: dict                   # word index -> uses

    def passes(self, min_mean: float, max_low_share: float) -> bool:
        return all(self.mean[w] >= min_mean and self.low[w] <= max_low_share for w in self.mean)

    def to_json(self, phrases: Sequence[str], words: Sequence[str]) -> dict:
        return {"strength": self.strength, "cut_all": self.cut_all,
                "cut": {phrases[p]: c for p, c in self.cut.items()},
                "collateral": {words[w]: {"mean": self.mean[w], "low": self.low[w], "uses": self.uses[w]}
                               for w in self.mean}}


def _logp(tail, fr: FrontierRows, dW, tile_rows: int) -> np.ndarray:
    mix = tail.mix(tail.residual(fr.rows, None, dW))
    vp = vocab_pass(mix, tail.head, token_sets=fr.token[:, None], softcap=tail.softcap, tile_rows=tile_rows)
    return np.asarray(vp.selected[:, 0], np.float64) - vp.lse


def frontier(tail, dW, fr: FrontierRows, strengths: Sequence[float], *, low: float = -0.10,
             tile_rows: int = 8192) -> list[Point]:
    """The frontier of W + s dW at each strength s (see the module doc), exact in float32 logits."""
    base = _logp(tail, fr, None, tile_rows)
    out = []
    P = fr.slop
    for s in strengths:
        lp = _logp(tail, fr, np.asarray(dW, np.float64) * float(s), tile_rows)
        p0, p1 = np.exp(base[:P]), np.exp(lp[:P])
        cut = {int(ph): float(1.0 - p1[fr.phrase == ph].mean() / p0[fr.phrase == ph].mean())
               for ph in np.unique(fr.phrase)}
        d = (lp - base)[P:]
        words = np.unique(fr.word)
        out.append(Point(float(s), cut, float(1.0 - p1.mean() / p0.mean()) if P else None,
                         {int(w): float(d[fr.word == w].mean()) for w in words},
                         {int(w): float(np.mean(d[fr.word == w] < low)) for w in words},
                         {int(w): int(np.sum(fr.word == w)) for w in words}))
    return out


def choose(points: Sequence[Point], *, min_mean: float, max_low_share: float) -> tuple[Point, bool]:
    """(the largest strength passing (d) on these rows, True), else (the smallest strength, False)."""
    ok = [p for p in points if p.passes(min_mean, max_low_share)]
    if ok:
        return max(ok, key=lambda p: p.strength), True
    return min(points, key=lambda p: p.strength), False
