"""Phrase rates in free generation: how often a model says each banned phrase, base vs edited.

What the user sees is generation (SPEC.md section 7), so an anti-slop edit is also measured on
sampled replies to held-out prompts, the base and the edited model on the same prompts and seeds.
Per banned phrase and side:
- `replies_with` / `share`: replies containing the phrase (whole words, as written or capitalized);
- `per_1k_tokens`: its occurrences per 1,000 generated tokens (the stop token counted);
- `continuation`: at the positions where the phrase's prefix was produced ("you can" of "you can
  use"), the share where its last word followed; `top_continuations`: what followed instead;
- `contexts`: the prefix-exact token contexts found (the FTPO positions `solve wfld` would mine),
  beside `occurrences` in the text, so a tokenization the matcher misses shows up as a gap.
Percentile bootstrap intervals resample prompts (a prompt's replies are not independent), the
same draws for both sides, so the change's interval is paired. `token_shifts` lists the tokens
whose generation rate changed most, to catch paraphrase swaps ("utilize" for "use") and artefacts.

Everything here is a pure function of token lists and the shared phrase matcher
(solvers/phrases.py); the engine that sampled the replies is not needed.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from exactedit.evals.scoring import bootstrap as bs
from exactedit.solvers.phrases import PhraseMatcher, Span, text_occurrences

RATES = ("share", "per_1k_tokens", "continuation")


@dataclass(frozen=True)
class Reply:
    """One sampled reply: the prompt it answers (the bootstrap's unit), its seed, the rendered
    prompt's tokens, the generated tokens (stop token included when one came) and whether the
    generation cap cut it."""

    prompt: int
    seed: int
    context: np.ndarray
    tokens: np.ndarray
    truncated: bool = False


@dataclass(frozen=True)
class ReplyCounts:
    """Per phrase counts in one reply, and the tokens that followed each prefix position."""

    tokens: int
    occurrences: np.ndarray
    contexts: np.ndarray
    prefixes: np.ndarray
    continued: np.ndarray
    follow: tuple[tuple[int, ...], ...]


def count_reply(matcher: PhraseMatcher, reply: Reply, capitalized: bool = True) -> ReplyCounts:
    """Occurrences, contexts, prefix positions and continuations of each phrase in one reply.
    Rows run from the last prompt token (its bare context token may be the prompt's last "\\n") to
    the reply's second-to-last token; no phrase token is taken from the prompt."""
    tb, P = matcher.tb, len(matcher.phrases)
    ctx, gen = np.asarray(reply.context, np.int64), np.asarray(reply.tokens, np.int64)
    seq = np.concatenate([ctx, gen])
    start = max(ctx.size - 1, 0)
    nxt = np.append(seq[1:], -1)
    contexts = np.zeros(P, np.int64)
    for _, pi, _ in matcher.find(seq, nxt, [Span(start, seq.size)]):
        contexts[pi] += 1
    prefixes, continued = np.zeros(P, np.int64), np.zeros(P, np.int64)
    follow: list[list[int]] = [[] for _ in range(P)]
    for t in range(start, seq.size - 1):
        for pi in matcher.prefix_at(seq, t, start):
            prefixes[pi] += 1
            continued[pi] += matcher.continues(tb.text(seq[t + 1:t + 9]), pi)
            follow[pi].append(int(seq[t + 1]))
    text = tb.text(gen).decode("utf-8", errors="replace")
    occ = np.asarray(text_occurrences(text, matcher.phrases, capitalized), np.int64)
    return ReplyCounts(int(gen.size), occ, contexts, prefixes, continued, tuple(tuple(f) for f in follow))


@dataclass(frozen=True)
class SideRates:
    """One phrase on one side (base or edited). Rates are NaN where they have no denominator."""

    replies: int
    tokens: int
    replies_with: int
    share: float
    occurrences: int
    contexts: int
    per_1k_tokens: float
    prefixes: int
    continued: int
    continuation: float
    ci: dict[str, tuple[float, float]] = field(default_factory=dict)
    top_continuations: tuple[tuple[str, int], ...] = ()

    def to_dict(self) -> dict:
        return {"replies_with": self.replies_with, "replies": self.replies, "share": _num(self.share),
                "occurrences": self.occurrences, "contexts": self.contexts, "tokens": self.tokens,
                "per_1k_tokens": _num(self.per_1k_tokens), "prefixes": self.prefixes, "continued": self.continued,
                "continuation": _num(self.continuation),
                "ci": {k: [_num(a), _num(b)] for k, (a, b) in self.ci.items()},
                "top_continuations": [[t, n] for t, n in self.top_continuations]}


@dataclass(frozen=True)
class PhraseRate:
    phrase: str
    base: SideRates
    edited: SideRates | None = None
    change: dict[str, float] = field(default_factory=dict)           # edited - base, per rate
    change_ci: dict[str, tuple[float, float]] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"phrase": self.phrase, "base": self.base.to_dict(),
                "edited": None if self.edited is None else self.edited.to_dict(),
                "change": {k: _num(v) for k, v in self.change.items()},
                "change_ci": {k: [_num(a), _num(b)] for k, (a, b) in self.change_ci.items()}}


@dataclass(frozen=True)
class TokenShift:
    token: int
    text: str
    base: int
    edited: int
    base_per_1k: float
    edited_per_1k: float

    @property
    def change_per_1k(self) -> float:
        return self.edited_per_1k - self.base_per_1k

    def to_dict(self) -> dict:
        return {"token": self.token, "text": self.text, "base": self.base, "edited": self.edited,
                "base_per_1k": _num(self.base_per_1k), "edited_per_1k": _num(self.edited_per_1k),
                "change_per_1k": _num(self.change_per_1k)}


@dataclass(frozen=True)
class PhraseRates:
    phrases: tuple[PhraseRate, ...]
    prompts: int
    replies: int
    tokens: dict[str, int]
    truncated: dict[str, int]
    token_shifts: tuple[TokenShift, ...] = ()
    n_boot: int = 1000
    level: float = 0.95
    seed: int = 0

    def to_dict(self) -> dict:
        return {"phrase_rates": [p.to_dict() for p in self.phrases], "prompts": self.prompts,
                "replies": self.replies, "tokens": dict(self.tokens), "truncated": dict(self.truncated),
                "token_shifts": [s.to_dict() for s in self.token_shifts],
                "bootstrap": {"n_boot": self.n_boot, "level": self.level, "seed": self.seed, "unit": "prompt"}}


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


class _Side:
    """Per-prompt sums of one side's counts: [n_prompts] per quantity, [n_prompts, P] per phrase."""

    def __init__(self, replies: Sequence[Reply], counts: Sequence[ReplyCounts], n_prompts: int, P: int):
        self.replies, self.counts = replies, counts
        self.n = np.zeros(n_prompts)
        self.tok = np.zeros(n_prompts)
        self.has, self.occ, self.ctx = (np.zeros((n_prompts, P)) for _ in range(3))
        self.pre, self.cont = np.zeros((n_prompts, P)), np.zeros((n_prompts, P))
        for r, c in zip(replies, counts):
            p = r.prompt
            self.n[p] += 1
            self.tok[p] += c.tokens
            self.has[p] += c.occurrences > 0
            self.occ[p] += c.occurrences
            self.ctx[p] += c.contexts
            self.pre[p] += c.prefixes
            self.cont[p] += c.continued

    def stats(self, w: np.ndarray, pi: int) -> dict[str, np.ndarray]:
        """Each rate under prompt weights w [B, n_prompts] -> [B]."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return {"share": (w @ self.has[:, pi]) / (w @ self.n),
                    "per_1k_tokens": 1000.0 * (w @ self.occ[:, pi]) / (w @ self.tok),
                    "continuation": (w @ self.cont[:, pi]) / (w @ self.pre[:, pi])}

    def side(self, pi: int, ci: dict, piece, top: int) -> SideRates:
        point = {k: float(v[0]) for k, v in self.stats(np.ones((1, self.n.size)), pi).items()}
        follow = Counter(t for c in self.counts for t in c.follow[pi])
        return SideRates(int(self.n.sum()), int(self.tok.sum()), int(self.has[:, pi].sum()), point["share"],
                         int(self.occ[:, pi].sum()), int(self.ctx[:, pi].sum()), point["per_1k_tokens"],
                         int(self.pre[:, pi].sum()), int(self.cont[:, pi].sum()), point["continuation"], ci,
                         tuple((piece(t), n) for t, n in follow.most_common(top)))


def phrase_rates(matcher: PhraseMatcher, base: Sequence[Reply], edited: Sequence[Reply] | None = None, *,
                 capitalized: bool = True, n_boot: int = 1000, level: float = 0.95, seed: int = 0,
                 top: int = 5, shifts: int = 12) -> PhraseRates:
    """Phrase rates of `base` (and `edited`: the same prompts and seeds, in the same order)."""
    if edited is not None and [(r.prompt, r.seed) for r in edited] != [(r.prompt, r.seed) for r in base]:
        raise ValueError("edited replies must answer the same prompts with the same seeds, in order")
    P = len(matcher.phrases)
    n_prompts = 1 + max((r.prompt for r in base), default=-1)
    piece = _piece(matcher)
    sides = {"base": _Side(base, [count_reply(matcher, r, capitalized) for r in base], n_prompts, P)}
    if edited is not None:
        sides["edited"] = _Side(edited, [count_reply(matcher, r, capitalized) for r in edited], n_prompts, P)
    strata = [np.unique([r.prompt for r in base])]
    weights = bs.resample_weights(strata, n_prompts, n_boot, seed) if n_boot > 0 and n_prompts > 1 else None
    out = []
    for pi, phrase in enumerate(matcher.phrases):
        boot = {k: s.stats(weights, pi) for k, s in sides.items()} if weights is not None else {}
        res = {k: s.side(pi, {r: _interval(boot[k][r], level) if boot else (math.nan, math.nan) for r in RATES},
                         piece, top) for k, s in sides.items()}
        change, change_ci = {}, {}
        if "edited" in res:
            for r in RATES:
                change[r] = getattr(res["edited"], r) - getattr(res["base"], r)
                change_ci[r] = _interval(boot["edited"][r] - boot["base"][r], level) if boot else (math.nan, math.nan)
        out.append(PhraseRate(phrase, res["base"], res.get("edited"), change, change_ci))
    tokens = {k: int(s.tok.sum()) for k, s in sides.items()}
    truncated = {k: int(sum(r.truncated for r in s.replies)) for k, s in sides.items()}
    moved = token_shifts(base, edited, piece, shifts) if edited is not None else ()
    return PhraseRates(tuple(out), len(strata[0]), len(base), tokens, truncated, moved, n_boot, level, seed)


def _interval(vals: np.ndarray, level: float) -> tuple[float, float]:
    vals = np.asarray(vals, np.float64)
    vals = vals[np.isfinite(vals)]
    if not vals.size:
        return (math.nan, math.nan)
    a = (1.0 - level) / 2.0
    lo, hi = np.quantile(vals, [a, 1.0 - a])
    return (float(lo), float(hi))


def _piece(matcher: PhraseMatcher):
    table = matcher.tb.table

    def piece(t: int) -> str:
        return table.token_bytes(int(t)).decode("utf-8", errors="replace")
    return piece


def token_shifts(base: Sequence[Reply], edited: Sequence[Reply], piece, top: int = 12) -> tuple[TokenShift, ...]:
    """The `top` tokens whose generation rate (per 1,000 generated tokens) changed most."""
    cb = Counter(int(t) for r in base for t in r.tokens)
    ce = Counter(int(t) for r in edited for t in r.tokens)
    nb, ne = max(sum(cb.values()), 1), max(sum(ce.values()), 1)
    rows = [TokenShift(t, piece(t), cb[t], ce[t], 1000.0 * cb[t] / nb, 1000.0 * ce[t] / ne) for t in set(cb) | set(ce)]
    rows.sort(key=lambda s: (-abs(s.change_per_1k), s.token))
    return tuple(rows[:top])
