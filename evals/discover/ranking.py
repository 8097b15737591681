"""The phrases a model over-uses against the user's own writing, ranked by the log-odds z.

    discover(model_texts, human_texts, config=None, *, progress=None, **fields) -> Discovery
    discover_paths(model_paths, human_paths, config=None, *, sides=None, limits=LIMITS, progress=None)

Every n-gram of order 1..max_n the model wrote at least min_count times is scored (logodds.py)
against the human corpus, with the background prior of `config.background`: "wordfreq" (English word
frequencies, the product over a gram's tokens, normalized per order) or "human" (the pooled counts of
both corpora, the classic choice). A gram is over-used when its z is at least min_z. Longer phrases
grow by extension: an n-gram past max_n (up to max_len) is a candidate when both its (n-1)-gram
sub-grams are candidates and it has min_count occurrences and z >= min_z itself.

What is listed, of the candidates:
- grams in at least min_docs of the model's texts (one reply saying a thing ten times is no habit),
  with a log-odds ratio (delta) of at least min_log_odds (a large corpus makes a 10% difference
  significant; that is no slop);
- a gram of function words and punctuation only ("of the", ", and", "—") only with delta at least
  function_log_odds: it has to be really over-used (the default asks about 4x the human rate);
- no gram of two tokens or more that starts with punctuation attached to the word before it
  (, . ; : ! ? … )) or ends with "(";
- redundancy: a gram is dropped when a listed longer gram containing it has at least `redundancy`
  (0.9) of its model count: nearly every use of "it's worth noting" is inside "it's worth noting
  that", so only the longer is listed; "delve into" used alone half the time stays beside
  "delve into the".
The rest are sorted by z (descending) and the first `top` kept.
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from exactedit.evals.discover.logodds import log_odds, normalized, prior, wordfreq_token_logp
from exactedit.evals.discover.ngrams import (Level, Stream, char_span, count_grams, encode, occurrences,
                                             written_form)
from exactedit.evals.discover.sources import LIMITS, DiscoverError, Limits, Text, human_texts, model_texts
from exactedit.evals.discover.tokens import is_punct

BACKGROUNDS = ("wordfreq", "human")
#: English function words: a gram of these and punctuation alone needs function_log_odds to be listed
FUNCTION_WORDS = frozenset("""
a about above after again against all am an and any are as at be because been before being below between
both but by can could did do does doing down during each either few for from further had has have having he
her here hers herself him himself his how i if in into is it its itself just me more most my myself neither
no nor not now of off on once only or other our ours ourselves out over own same she should so some such
than that the their theirs them themselves then there these they this those through to too under until up
upon us very was we were what when where which while who whom whose why will with would you your yours
yourself yourselves also may might must shall since though yet via per
i'm i've i'll i'd you're you've you'll you'd he's she's it's we're we've we'll we'd they're they've they'll
they'd that's there's here's what's who's let's isn't aren't wasn't weren't hasn't haven't hadn't doesn't
don't didn't won't wouldn't shan't shouldn't can't cannot couldn't mustn't
""".split())
#: punctuation that belongs to the word before it: no phrase of two tokens or more starts with one
ATTACHED = frozenset({",", ".", ";", ":", "!", "?", "…", ")"})


@dataclass(frozen=True)
class DiscoverConfig:
    """What `discover` lists and how it scores (docs/discover.md explains each default)."""

    top: int = 50                      # phrases listed
    min_count: int = 3                 # model occurrences a gram needs to be scored
    max_n: int = 5                     # every gram up to this order is scored
    max_len: int = 8                   # longer ones grow by extension up to this order
    background: str = "wordfreq"       # the prior's background: "wordfreq" or "human"
    alpha0: float = 1000.0             # the prior's total: the background is worth this many grams
    alpha_min: float = 1.0             # no gram's prior below this many pseudo-occurrences
    min_z: float = 3.0                 # over-used: z at least this (and the extension's threshold)
    min_log_odds: float = 0.7          # listed: delta at least this (about 2x the human rate)
    function_log_odds: float = 1.4     # function words / punctuation only: delta at least this (~4x)
    min_docs: int = 2                  # listed: in at least this many of the model's texts
    redundancy: float = 0.9            # a sub-gram goes when a listed super-gram has this share of its count

    def __post_init__(self):
        if self.top < 1 or self.min_count < 1 or self.min_docs < 1:
            raise ValueError("top, min_count and min_docs must be at least 1")
        if not 1 <= self.max_n <= self.max_len <= 16:
            raise ValueError(f"need 1 <= max_n <= max_len <= 16, got max_n {self.max_n}, max_len {self.max_len}")
        if self.background not in BACKGROUNDS:
            raise ValueError(f"background must be one of {', '.join(BACKGROUNDS)}, got {self.background!r}")
        if not (self.alpha0 > 0 and math.isfinite(self.alpha0)) or not 0 <= self.alpha_min < math.inf:
            raise ValueError(f"need alpha0 > 0 and alpha_min >= 0 (finite), got {self.alpha0}, {self.alpha_min}")
        if not 0 < self.redundancy <= 1:
            raise ValueError(f"redundancy must lie in (0, 1], got {self.redundancy}")
        for name in ("min_z", "min_log_odds", "function_log_odds"):
            if not math.isfinite(getattr(self, name)):
                raise ValueError(f"{name} must be finite")


@dataclass(frozen=True)
class Phrase:
    phrase: str                 # the most frequent written form in the model's text
    n: int                      # tokens (words and punctuation)
    z: float
    log_odds: float             # delta: the posterior log-odds ratio, model over human
    model_count: int
    human_count: int
    model_per_1k: float         # per 1,000 word tokens of the model's text
    human_per_1k: float
    model_docs: int             # model texts holding it
    human_docs: int
    sources: dict[str, int]     # model occurrences per source tag
    example: str                # context of the first model occurrence


@dataclass(frozen=True)
class Corpus:
    """One side's size: texts, tokens (words and punctuation), word tokens, texts per source tag."""

    texts: int
    tokens: int
    words: int
    sources: dict[str, int]


@dataclass(frozen=True)
class Discovery:
    phrases: tuple[Phrase, ...]
    model: Corpus
    human: Corpus
    config: DiscoverConfig
    notes: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict:
        return {"phrases": [asdict(p) for p in self.phrases], "model": asdict(self.model),
                "human": asdict(self.human), "settings": asdict(self.config), "notes": list(self.notes)}

    def to_json(self) -> str:
        """The JSON text of `to_dict` (what `exactedit discover --out` writes)."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


@dataclass(frozen=True)
class _Scores:
    """Per gram of one order: the log-odds, the background log-probability and the statuses."""

    delta: np.ndarray
    z: np.ndarray
    logp: np.ndarray            # unnormalized log background (wordfreq: sum of token log p)
    candidate: np.ndarray       # over-used (and, past max_n, both sub-grams candidates)
    function: np.ndarray        # function words and punctuation only
    first_token: np.ndarray     # key id of the first token


def discover(model_texts: Sequence[Text | str], human_texts: Sequence[Text | str],
             config: DiscoverConfig | None = None, *, progress: Callable[[int, int], None] | None = None,
             **fields) -> Discovery:
    """The phrases over-used in `model_texts` against `human_texts` (Text or plain strings);
    `fields` override the config's (discover(m, h, top=10, background="human"))."""
    cfg = replace(config or DiscoverConfig(), **fields)
    model, human = _texts(model_texts, "model"), _texts(human_texts, "human")
    stream = encode([t.text for t in model], [t.text for t in human], progress)
    for side, is_model in (("model", True), ("human", False)):
        if stream.words(is_model) == 0:
            raise DiscoverError(f"{side} text", "words", "no words to count (only code, markup or punctuation)")
    levels = count_grams(stream, cfg.max_len)
    scores = _score_levels(stream, levels, cfg)
    chosen = _select(stream, levels, scores, cfg)
    words = (stream.words(True), stream.words(False))
    where = {n: occurrences(stream, levels[n - 1], [g for k, g in chosen if k == n]) for n in {n for n, _ in chosen}}
    phrases = tuple(_phrase(stream, levels, scores, n, g, where[n][g], model, words) for n, g in chosen)
    notes = []
    if words[1] < 10 * cfg.alpha0:
        notes.append(f"the human text is small ({words[1]} words against alpha0 {cfg.alpha0:g}): the prior pulls "
                     "its rates toward the background; more of your own text gives sharper results")
    return Discovery(phrases, _corpus(stream, model, True), _corpus(stream, human, False), cfg, tuple(notes))


def discover_paths(model_paths, human_paths, config: DiscoverConfig | None = None, *, sides=None,
                   limits: Limits = LIMITS, progress: Callable[[int, int], None] | None = None) -> Discovery:
    """`discover` on the texts read from files and directories (sources.py)."""
    return discover(model_texts(model_paths, sides=sides, limits=limits), human_texts(human_paths, limits=limits),
                    config, progress=progress)


def _texts(texts: Sequence[Text | str], side: str) -> list[Text]:
    out = [t if isinstance(t, Text) else Text(t, "text", f"{side} text [{i}]") for i, t in enumerate(texts)]
    if not out:
        raise DiscoverError(f"{side} text", "texts", "none given")
    return out


def _corpus(stream: Stream, texts: list[Text], is_model: bool) -> Corpus:
    return Corpus(len(texts), stream.tokens(is_model), stream.words(is_model),
                  dict(Counter(t.source for t in texts).most_common()))


def _score_levels(stream: Stream, levels: list[Level], cfg: DiscoverConfig) -> list[_Scores]:
    function_key = np.fromiter((k.lower() in FUNCTION_WORDS or is_punct(k) for k in stream.keys), bool,
                               len(stream.keys))
    token_logp = None
    if cfg.background == "wordfreq":
        token_logp = wordfreq_token_logp(stream.keys, np.bincount(levels[0].last, levels[0].human,
                                                                  minlength=len(stream.keys)))
    out: list[_Scores] = []
    for lv in levels:
        below = out[-1] if out else None
        n_m, n_h = int(lv.model.sum()), int(lv.human.sum())
        if token_logp is None:
            logp = np.log((lv.model + lv.human) / (n_m + n_h))
        else:
            logp = token_logp[lv.last] + (below.logp[lv.prefix] if below is not None else 0.0)
        if lv.model.size > 1:
            alpha, alpha_total = prior(normalized(logp), cfg.alpha0, cfg.alpha_min)
            delta, _, z = log_odds(lv.model, lv.human, n_m, n_h, alpha, alpha_total)
        else:                                    # one gram type: nothing to compare it with
            delta = z = np.zeros(lv.model.size)
        candidate = (lv.model >= cfg.min_count) & (z >= cfg.min_z)
        if lv.n > cfg.max_n:
            suffix = levels[lv.n - 2].ids[lv.first + 1]
            candidate &= below.candidate[lv.prefix] & below.candidate[suffix]
        out.append(_Scores(
            delta, z, logp, candidate,
            function=function_key[lv.last] & (below.function[lv.prefix] if below is not None else True),
            first_token=below.first_token[lv.prefix] if below is not None else lv.last))
    return out


def _select(stream: Stream, levels: list[Level], scores: list[_Scores], cfg: DiscoverConfig) -> list[tuple[int, int]]:
    """(order, gram id) of the listed phrases, by z descending."""
    attached = np.fromiter((k in ATTACHED for k in stream.keys), bool, len(stream.keys))
    opening = np.fromiter((k == "(" for k in stream.keys), bool, len(stream.keys))
    listed: dict[tuple[int, int], float] = {}
    for lv, sc in zip(levels, scores):
        ok = sc.candidate & (lv.model_docs >= cfg.min_docs) & (sc.delta >= cfg.min_log_odds)
        ok &= ~sc.function | (sc.delta >= cfg.function_log_odds)
        if lv.n > 1:
            ok &= ~attached[sc.first_token] & ~opening[lv.last]
        for g in np.flatnonzero(ok):
            listed[(lv.n, int(g))] = float(sc.z[g])
    dropped = _redundant(levels, listed, cfg.redundancy)
    kept = sorted((k for k in listed if k not in dropped), key=lambda k: (-listed[k], k))
    return kept[:cfg.top]


def _redundant(levels: list[Level], listed: dict[tuple[int, int], float], share: float) -> set:
    """Listed grams inside a listed longer gram that holds at least `share` of their model count."""
    dropped = set()
    for n, g in listed:
        lv = levels[n - 1]
        start, count = int(lv.first[g]), int(lv.model[g])
        for k in range(1, n):
            for j in range(n - k + 1):
                sub = (k, int(levels[k - 1].ids[start + j]))
                if sub in listed and count >= share * levels[k - 1].model[sub[1]]:
                    dropped.add(sub)
    return dropped


def _phrase(stream: Stream, levels, scores, n: int, g: int, pos, model: list[Text], words) -> Phrase:
    """The listed gram g of order n, its model positions `pos`, as a Phrase."""
    lv, sc = levels[n - 1], scores[n - 1]
    sources = Counter(model[int(stream.doc[p])].source for p in pos)
    first = int(lv.first[g])
    text = model[int(stream.doc[first])].text
    return Phrase(
        phrase=written_form(stream, n, pos), n=n, z=float(sc.z[g]), log_odds=float(sc.delta[g]),
        model_count=int(lv.model[g]), human_count=int(lv.human[g]),
        model_per_1k=1000.0 * int(lv.model[g]) / max(words[0], 1),
        human_per_1k=1000.0 * int(lv.human[g]) / max(words[1], 1),
        model_docs=int(lv.model_docs[g]), human_docs=int(lv.human_docs[g]),
        sources=dict(sources.most_common()), example=_snippet(text, *char_span(stream, text, first, n)))


def _snippet(text: str, start: int, end: int, context: int = 60) -> str:
    """The occurrence with up to `context` characters either side, whitespace collapsed."""
    lo, hi = max(0, start - context), min(len(text), end + context)
    return ("…" if lo else "") + " ".join(text[lo:hi].split()) + ("…" if hi < len(text) else "")
