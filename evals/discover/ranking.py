"""The phrases a model over-uses, on two kinds of evidence: against the user's own writing and
against written language at large; each phrase classed style, topic or mixed.

    discover(model_texts, human_texts, config=None, *, progress=None, **fields) -> Discovery
    discover_paths(model_paths, human_paths, config=None, *, sides=None, limits=LIMITS, progress=None)

Every n-gram of order 1..max_n the model wrote is scored twice:
- against the user (logodds.py): the log-odds ratio delta with an informative Dirichlet prior
  (`config.background`: "wordfreq", the language's word frequencies, the product over a gram's
  tokens normalized per order; or "human", the pooled counts of both corpora) and its z. The
  user's evidence holds when z >= min_z and delta >= min_log_odds (about twice the user's rate: a
  large corpus makes a 10% difference significant, which is no slop);
- against the language (language.py): the model's rate over the rate of the gram's rarest word in
  wordfreq's list for `lang` (an upper bound of the gram's rate there), and the one-sided Poisson
  lower bound of that ratio at `confidence`. The language's evidence holds when the bound is at
  least min_ratio, the gram is a phrase, not an over-used one with an ordinary neighbour (its cohesion: each
  end token's rate right after the rest of the gram, over the token's own rate in the language, at
  least min_ratio: "delve into the" is, "and delve into" is not; the rate's Poisson lower bound taken
  at 1 - (1 - confidence) / T, T the grams of the order seen min_count times, since all of them are
  tested at once and a few of thousands of chance pairs, "squats so" three times, pass alone), and the
  user's own observed rate is at most the model's over exp(min_log_odds) (a phrase the user writes
  as often is theirs too, however rare in the language; with little text of the user's, delta is
  the prior's, not theirs, so the observed rate is what is compared). min_ratio None: no language
  evidence (as for two samples of one model).
A gram of function words and punctuation only ("of the", ", and", "—") needs function_log_odds
(about 4x) in place of min_log_odds on both. A candidate has min_count uses and one of the two
evidences; longer phrases grow by extension: an n-gram past max_n (up to max_len) is a candidate when
both its (n-1)-gram sub-grams are candidates and it is one itself.

What is listed, of the candidates:
- grams in at least min_docs of the model's texts (one reply saying a thing ten times is no habit);
- no gram of two tokens or more that starts with punctuation attached to the word before it
  (, . ; : ! ? … )) or ends with "(";
- redundancy: a gram is dropped when a listed longer gram containing it has at least `redundancy`
  (0.9) of its model count: nearly every use of "it's worth noting" is inside "it's worth noting
  that", so only the longer is listed; "delve into" used alone half the time stays beside
  "delve into the".
Each listed phrase gets its kind (kinds.py: style, mixed, topic), its `score`, the larger of its
two lower bounds (the user's: exp(delta - q sqrt(var)), q the normal quantile at `confidence`; the
language's ratio bound): how many times more the model writes it than the reference, at least, and
its `excess`, model_count (1 - 1/score): the uses the reference does not account for at that bound.
The list is the style phrases by excess (ties by score), then the mixed, then the topic ones, the
first `top` of it. Excess, not the ratio, ranks: a word used 3 times that English almost never
writes ("iterates", x3,900) is a smaller habit than "you can use" written 17 times at 6x English's
bound; what a ban takes out of the replies is the excess uses.
An empty list comes with the gram that came closest and what it misses (`closest`).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from exactedit.evals.discover.closest import closest
from exactedit.evals.discover.kinds import FUNCTION_WORDS, KINDS, function_like, prompt_groups, usage
from exactedit.evals.discover.language import check_lang, poisson_lower, rarest, word_freqs
from exactedit.evals.discover.logodds import log_odds, normalized, prior, wordfreq_token_logp
from exactedit.evals.discover.ngrams import (Level, Stream, char_span, count_grams, encode, occurrences,
                                             written_form)
from exactedit.evals.discover.sources import LIMITS, DiscoverError, Limits, Text, human_texts, model_texts
from exactedit.evals.discover.tokens import is_punct

BACKGROUNDS = ("wordfreq", "human")
#: punctuation that belongs to the word before it: no phrase of two tokens or more starts with one
ATTACHED = frozenset({",", ".", ";", ":", "!", "?", "…", ")"})
#: skipped files named one by one in the notes (all of them in `skipped`)
SKIPPED_NOTES = 5
__all__ = ["ATTACHED", "BACKGROUNDS", "FUNCTION_WORDS", "DiscoverConfig", "Discovery", "Phrase", "discover",
           "discover_paths"]


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
    min_z: float = 3.0                 # the user's evidence: z at least this
    min_log_odds: float = 0.7          # listed: delta at least this (about 2x the human rate)
    function_log_odds: float = 1.4     # function words / punctuation only: delta at least this (~4x)
    min_docs: int = 2                  # listed: in at least this many of the model's texts
    redundancy: float = 0.9            # a sub-gram goes when a listed super-gram has this share of its count
    lang: str = "en"                   # wordfreq's language: the prior's words and the second reference
    min_ratio: float | None = 5.0      # the language's evidence: the ratio's lower bound at least this (None: off)
    confidence: float = 0.95           # of the lower bounds (the ratio's Poisson bound, the user's log-odds)

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
        if self.min_ratio is not None and not (self.min_ratio > 0 and math.isfinite(self.min_ratio)):
            raise ValueError(f"min_ratio must be a finite number > 0 (or None), got {self.min_ratio}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must lie in (0, 1), got {self.confidence}")
        check_lang(self.lang)


@dataclass(frozen=True)
class Phrase:
    phrase: str                 # the most frequent written form in the model's text
    n: int                      # tokens (words and punctuation)
    kind: str                   # style / mixed / topic (kinds.py)
    evidence: str               # which reference it is over-used against: "both", "user" or "language"
    score: float                # the larger lower bound: at least this many times the reference's rate
    excess: float               # model_count (1 - 1/score): uses beyond the reference's at that bound (the rank)
    z: float                    # against the user: the log-odds z
    log_odds: float             # delta: the posterior log-odds ratio, model over human
    user_ratio_low: float       # exp(delta - q sqrt(var)): the lower bound of the odds ratio
    lang_per_1k: float | None   # against the language: its rarest word's rate per 1,000 words (None: punctuation)
    lang_ratio: float | None    # the model's rate over that
    lang_ratio_low: float | None  # its one-sided Poisson lower bound at `confidence`
    cohesion: float | None      # its weaker end token's rate after the rest, over its own (bound; None: 1 token)
    model_count: int
    human_count: int
    model_per_1k: float         # per 1,000 word tokens of the model's text
    human_per_1k: float
    model_docs: int             # model texts holding it
    human_docs: int
    prompts: int                # prompt groups whose texts use it (kinds.py)
    prompt_share: float
    dispersion: float | None    # Juilland's D over the prompt groups
    spread: float               # prompts over what chance placement reaches
    echo: float | None          # share of its uses whose prompt names one of its content words
    word_spread: float | None   # the least spread of its content words, each over all its uses
    word_echo: float | None     # the largest echo of its content words
    unrelated_per_1k: float | None  # its rate in the texts whose prompt does not name them
    function_share: float       # share of its words that are function words or discourse markers
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
    listed: dict[str, int] = field(default_factory=dict)   # phrases passing the rules per kind, before `top`
    prompts: int = 0                                        # prompt groups of the model's texts
    closest: dict | None = None                             # with no phrase: the nearest gram, what it misses
    skipped: tuple[dict, ...] = field(default=())           # files of a walked directory with no usable text

    def to_dict(self) -> dict:
        return {"phrases": [asdict(p) for p in self.phrases], "model": asdict(self.model),
                "human": asdict(self.human), "settings": asdict(self.config), "listed": dict(self.listed),
                "prompts": self.prompts, "closest": self.closest, "skipped": [dict(s) for s in self.skipped],
                "notes": list(self.notes)}

    def to_json(self) -> str:
        """The JSON text of `to_dict` (what `exactedit discover --out` writes)."""
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False, allow_nan=False) + "\n"


@dataclass(frozen=True)
class _Scores:
    """Per gram of one order: both evidences, the background log-probability and the statuses."""

    delta: np.ndarray
    z: np.ndarray
    user_low: np.ndarray        # exp(delta - q sqrt(var))
    lang: np.ndarray            # the rarest word's frequency (NaN: punctuation only)
    lang_low: np.ndarray        # the ratio's lower bound (0 where no language rate)
    cohesion: np.ndarray        # min over the two end tokens of p(end | rest)'s lower bound over p(end) (inf: 1 token)
    logp: np.ndarray            # unnormalized log background (wordfreq: sum of token log p)
    function: np.ndarray        # function words and punctuation only
    first_token: np.ndarray     # key id of the first token
    floor: np.ndarray           # the log-odds the model's rate must have over the user's (function words: more)
    yours: np.ndarray           # the user's observed rate is at most the model's / exp(floor)
    user: np.ndarray            # the user's evidence: z >= min_z and delta >= floor
    language: np.ndarray        # the language's evidence: bound and cohesion >= min_ratio, and `yours`
    candidate: np.ndarray       # min_count and an evidence (and, past max_n, both sub-grams candidates)

    def score(self, at=slice(None)):
        """The larger of the two lower bounds."""
        return np.maximum(self.user_low[at], self.lang_low[at])


def excess(count, score):
    """The uses of `count` a reference `score` times rarer does not account for: count (1 - 1/score),
    0 where score <= 1 (the ranking key)."""
    count, score = np.asarray(count, np.float64), np.asarray(score, np.float64)
    with np.errstate(divide="ignore"):
        return np.where(score > 1.0, count * (1.0 - 1.0 / score), 0.0)


def discover(model_texts: Sequence[Text | str], human_texts: Sequence[Text | str],
             config: DiscoverConfig | None = None, *, progress: Callable[[int, int], None] | None = None,
             **fields) -> Discovery:
    """The phrases over-used in `model_texts` against `human_texts` and the language (Text or plain
    strings); `fields` override the config's (discover(m, h, top=10, background="human")). Inputs
    read by `model_texts` / `human_texts` carry the files their directory walks skipped."""
    cfg = replace(config or DiscoverConfig(), **fields)
    skipped = [{"side": side, **s} for side, texts in (("model", model_texts), ("human", human_texts))
               for s in getattr(texts, "skipped", ())]
    model, human = _texts(model_texts, "model"), _texts(human_texts, "human")
    stream = encode([t.text for t in model], [t.text for t in human], progress)
    for side, is_model in (("model", True), ("human", False)):
        if stream.words(is_model) == 0:
            raise DiscoverError(f"{side} text", "words", "no words to count (only code, markup or punctuation)")
    levels = count_grams(stream, cfg.max_len)
    freqs = word_freqs(stream.keys, cfg.lang)
    scores = _score_levels(stream, levels, cfg, freqs)
    shapes = [shape_ok(stream, lv, sc) for lv, sc in zip(levels, scores)]
    kept = _select(levels, scores, shapes, cfg)
    words = (stream.words(True), stream.words(False))
    where = {n: occurrences(stream, levels[n - 1], [g for k, g in kept if k == n]) for n in {n for n, _ in kept}}
    groups = prompt_groups(stream, model)
    function = function_like(stream.keys, freqs)
    words_seen: dict = {}
    uses = {k: usage(groups, stream, where[k[0]][k[1]], k[0], function, words_seen) for k in kept}
    score = {k: float(scores[k[0] - 1].score(k[1])) for k in kept}
    rank = {k: (float(excess(levels[k[0] - 1].model[k[1]], score[k])), score[k]) for k in kept}
    order = sorted(kept, key=lambda k: (KINDS.index(uses[k].kind), -rank[k][0], -rank[k][1], k))
    phrases = tuple(_phrase(stream, levels, scores, n, g, where[n][g], uses[(n, g)], model, words, cfg)
                    for n, g in order[:cfg.top])
    notes = []
    if words[1] < 10 * cfg.alpha0:
        notes.append(f"the human text is small ({words[1]} words against alpha0 {cfg.alpha0:g}): the prior pulls "
                     "its rates toward the background; more of your own text gives sharper results")
    notes += [f"skipped {s['file']} ({s['side']} side): {s['why']}" for s in skipped[:SKIPPED_NOTES]]
    if len(skipped) > SKIPPED_NOTES:
        notes.append(f"skipped {len(skipped) - SKIPPED_NOTES} more files with no usable text (`skipped` lists them)")
    near = None if phrases else closest(stream, levels, scores, cfg, words, shapes)
    if near is not None:
        notes.append(near["summary"])
    return Discovery(phrases, _corpus(stream, model, True), _corpus(stream, human, False), cfg, tuple(notes),
                     dict(Counter(uses[k].kind for k in kept)), groups.count, near, tuple(skipped))


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


def _score_levels(stream: Stream, levels: list[Level], cfg: DiscoverConfig, freqs=None) -> list[_Scores]:
    from scipy.stats import norm

    freqs = word_freqs(stream.keys, cfg.lang) if freqs is None else freqs
    function_key = np.fromiter((k.lower() in FUNCTION_WORDS or is_punct(k) for k in stream.keys), bool,
                               len(stream.keys))
    token_logp = wordfreq_token_logp(stream.keys, np.bincount(levels[0].last, levels[0].human,
                                                              minlength=len(stream.keys)), cfg.lang, freqs)
    token_p = np.exp(token_logp)
    q = float(norm.ppf(cfg.confidence))
    model_words, human_words = max(stream.words(True), 1), max(stream.words(False), 1)
    out: list[_Scores] = []
    for lv, lang in zip(levels, rarest(levels, freqs)):
        below = out[-1] if out else None
        n_m, n_h = int(lv.model.sum()), int(lv.human.sum())
        if cfg.background == "human":
            logp = np.log((lv.model + lv.human) / (n_m + n_h))
        else:
            logp = token_logp[lv.last] + (below.logp[lv.prefix] if below is not None else 0.0)
        if lv.model.size > 1:
            alpha, alpha_total = prior(normalized(logp), cfg.alpha0, cfg.alpha_min)
            delta, var, z = log_odds(lv.model, lv.human, n_m, n_h, alpha, alpha_total)
            user_low = np.exp(delta - q * np.sqrt(var))
        else:                                    # one gram type: nothing to compare it with
            delta = z = user_low = np.zeros(lv.model.size)
        with np.errstate(divide="ignore", invalid="ignore"):
            lang_low = np.where(np.isnan(lang), 0.0, poisson_lower(lv.model, model_words, cfg.confidence) / lang)
        first_token = below.first_token[lv.prefix] if below is not None else lv.last
        suffix = levels[lv.n - 2].ids[lv.first + 1] if below is not None else None
        cohesion = np.full(lv.model.size, np.inf)
        if below is not None:                    # each end token after the rest of the gram, over its own rate,
            seen = lv.model > 0                  # at the confidence of all the order's tested grams at once
            tested = max(int(np.count_nonzero(lv.model >= cfg.min_count)), 1)
            level = 1.0 - (1.0 - cfg.confidence) / tested
            for rest, end in ((lv.prefix, lv.last), (suffix, first_token)):
                cond = poisson_lower(lv.model[seen], np.maximum(levels[lv.n - 2].model[rest[seen]], 1), level)
                cohesion[seen] = np.minimum(cohesion[seen], cond / token_p[end[seen]])
        function = function_key[lv.last] & (below.function[lv.prefix] if below is not None else True)
        floor = np.where(function, cfg.function_log_odds, cfg.min_log_odds)
        yours = lv.human * np.exp(floor) * model_words <= lv.model * human_words
        user = (z >= cfg.min_z) & (delta >= floor)
        language = ((lang_low >= cfg.min_ratio) & (cohesion >= cfg.min_ratio) & yours if cfg.min_ratio is not None
                    else np.zeros(lv.model.size, bool))
        candidate = (lv.model >= cfg.min_count) & (user | language)
        if lv.n > cfg.max_n:
            candidate &= below.candidate[lv.prefix] & below.candidate[suffix]
        out.append(_Scores(delta, z, user_low, lang, lang_low, cohesion, logp, function, first_token, floor, yours,
                           user, language, candidate))
    return out


def shape_ok(stream: Stream, lv: Level, sc: _Scores) -> np.ndarray:
    """Grams of two tokens or more neither starting with attached punctuation nor ending with "("."""
    if lv.n == 1:
        return np.ones(lv.model.size, bool)
    attached = np.fromiter((k in ATTACHED for k in stream.keys), bool, len(stream.keys))
    opening = np.fromiter((k == "(" for k in stream.keys), bool, len(stream.keys))
    return ~attached[sc.first_token] & ~opening[lv.last]


def _select(levels: list[Level], scores: list[_Scores], shapes, cfg: DiscoverConfig) -> list[tuple[int, int]]:
    """(order, gram id) of the listed phrases (sorted by key), redundant ones dropped."""
    listed: set[tuple[int, int]] = set()
    for lv, sc, shape in zip(levels, scores, shapes):
        ok = sc.candidate & (lv.model_docs >= cfg.min_docs) & shape
        listed.update((lv.n, int(g)) for g in np.flatnonzero(ok))
    dropped = _redundant(levels, listed, cfg.redundancy)
    return sorted(k for k in listed if k not in dropped)


def _redundant(levels: list[Level], listed: set[tuple[int, int]], share: float) -> set:
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


def _opt(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _phrase(stream: Stream, levels, scores, n: int, g: int, pos, use, model: list[Text], words,
            cfg: DiscoverConfig) -> Phrase:
    """The listed gram g of order n, its model positions `pos` and usage `use`, as a Phrase."""
    lv, sc = levels[n - 1], scores[n - 1]
    sources = Counter(model[int(stream.doc[p])].source for p in pos)
    first = int(lv.first[g])
    text = model[int(stream.doc[first])].text
    user, lang = bool(sc.user[g]), bool(sc.language[g])
    rate = int(lv.model[g]) / max(words[0], 1)
    has_lang = not math.isnan(sc.lang[g])
    score = float(sc.score(g))
    return Phrase(
        phrase=written_form(stream, n, pos), n=n, kind=use.kind,
        evidence="both" if user and lang else "user" if user else "language",
        score=score, excess=float(excess(lv.model[g], score)), z=float(sc.z[g]), log_odds=float(sc.delta[g]),
        user_ratio_low=float(sc.user_low[g]),
        lang_per_1k=1000.0 * float(sc.lang[g]) if has_lang else None,
        lang_ratio=_opt(rate / sc.lang[g]) if has_lang else None,
        lang_ratio_low=_opt(sc.lang_low[g]) if has_lang else None, cohesion=_opt(sc.cohesion[g]),
        model_count=int(lv.model[g]), human_count=int(lv.human[g]),
        model_per_1k=1000.0 * rate, human_per_1k=1000.0 * int(lv.human[g]) / max(words[1], 1),
        model_docs=int(lv.model_docs[g]), human_docs=int(lv.human_docs[g]),
        prompts=use.prompts, prompt_share=use.prompt_share, dispersion=use.dispersion, spread=use.spread,
        echo=use.echo, word_spread=use.word_spread, word_echo=use.word_echo, unrelated_per_1k=use.unrelated_per_1k, function_share=use.function_share,
        sources=dict(sources.most_common()), example=_snippet(text, *char_span(stream, text, first, n)))


def _snippet(text: str, start: int, end: int, context: int = 60) -> str:
    """The occurrence with up to `context` characters either side, whitespace collapsed."""
    lo, hi = max(0, start - context), min(len(text), end + context)
    return ("…" if lo else "") + " ".join(text[lo:hi].split()) + ("…" if hi < len(text) else "")
