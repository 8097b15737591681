"""Style or topic: where a phrase is used across the prompts, and what words it is made of.

    prompt_groups(stream, texts) -> Groups              the model's texts grouped by the prompt they answer
    usage(groups, stream, positions, n, function) -> Usage   the features below and the phrase's kind
    function_like(keys, freqs) -> bool [K]             function words, discourse markers, the top band

Slop is spread over unrelated prompts ("Here's an example" in 30 of 48 replies, on every subject);
topic clusters in the replies to the prompts about it, and its words are the prompts' words ("in
Python", "a list", "the file"). Per phrase, over the model's texts grouped by prompt (texts whose
prompt is unknown are each a group of their own; a group's size is its words):

- `prompts`, `prompt_share`: the groups whose texts use the phrase, and their share of all groups;
- `dispersion`: Juilland's D over the groups, 1 - V / sqrt(G - 1), V the coefficient of variation of
  the phrase's rate per group (0: all in one group, 1: the same rate everywhere). D is reported; it
  is low for any rare phrase (a phrase used 5 times over 48 groups has D near 0.57 placed at random),
  so the rule uses `spread`;
- `spread`: `prompts` over the groups a phrase of its count would reach placed at random, word by
  word: sum over groups of 1 - (1 - size share)^count. About 1 for a phrase used anywhere (above 1
  when once per reply), well below 1 for one that stays with a few prompts;
- `echo`: of its uses in texts whose prompt is known, the share whose prompt names one of its content
  words (lowercase, a plural's final "s" / "es" / "ies" folded); None when no use has a prompt or it
  has no content words;
- `unrelated_per_1k`: its rate per 1,000 words in the texts whose prompt does not name its content
  words (texts of unknown prompt included); None when every text's prompt names one;
- `function_share`: the share of its words that are function words or discourse markers (the lists
  below) or in the language's top frequency band (wordfreq: at least once per 1,000 words); the
  others are its content words;
- `word_spread`, `word_echo`: the least spread and the largest echo of its content words, each word
  over all its own uses (more of them than the phrase has: "interest invoice" three times cannot
  show where it clusters, "invoice" forty times can).

`kind` (the rule, in this order), on the largest echo and the least spread of the phrase and its
content words:
- style: no content words ("you can", "In this", "it's"), whatever the spread;
- topic: echo >= ECHO_TOPIC (half the uses answer prompts naming the words) or spread < SPREAD_TOPIC
  (fewer than half the groups chance would give it);
- style: echo below ECHO_STYLE (or unknown) and spread >= SPREAD_STYLE;
- mixed: the rest (some of both).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from exactedit.evals.discover.tokens import is_punct, sentences

#: English function words
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
#: English discourse markers and the register's small words: they frame what is said, not its subject
DISCOURSE_MARKERS = frozenset("""
however additionally furthermore moreover overall indeed certainly basically essentially ultimately
importantly notably simply actually really therefore thus hence instead finally firstly secondly lastly
meanwhile nevertheless nonetheless otherwise rather specifically generally typically usually often
sure absolutely definitely great well ok okay yes hello hi thanks thank please let note
""".split())
#: a word at least this frequent in the language (wordfreq; zipf 6) counts as a function word
TOP_BAND = 1e-3
ECHO_TOPIC = 0.5
ECHO_STYLE = 0.2
SPREAD_TOPIC = 0.5
SPREAD_STYLE = 0.75
KINDS = ("style", "mixed", "topic")


def function_like(keys: Sequence[str], freqs: np.ndarray) -> np.ndarray:
    """Per key: punctuation, a function word or discourse marker, or a word of the top band."""
    out = np.empty(len(keys), bool)
    for i, k in enumerate(keys):
        low = k.lower()
        out[i] = (is_punct(k) or low in FUNCTION_WORDS or low in DISCOURSE_MARKERS
                  or bool(np.nan_to_num(freqs[i]) >= TOP_BAND))
    return out


def fold(word: str) -> str:
    """A word as a prompt is searched for it: lowercase, a possessive and a plural's ending dropped."""
    w = word.lower()
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 4 and w.endswith(("ches", "shes", "sses", "xes", "zes")):
        return w[:-2]
    if len(w) > 3 and w.endswith("s") and not w.endswith(("ss", "us", "is")):
        return w[:-1]
    return w


@dataclass(frozen=True)
class Groups:
    """The model's texts grouped by the prompt they answer, and each key's uses per group."""

    of_doc: np.ndarray          # int64 [D]: the group of each model text
    words: np.ndarray           # float64 [G]: word tokens per group
    prompted: np.ndarray        # bool [G]: the group's prompt is known
    named: dict                 # folded word -> int64 array of the groups whose prompt names it
    key_start: np.ndarray       # int64 [K + 1]: key k's (group, count) pairs are [key_start[k], key_start[k + 1])
    key_group: np.ndarray       # int64: the groups, by key
    key_count: np.ndarray       # int64: the key's uses in that group

    @property
    def count(self) -> int:
        return int(self.words.size)

    def of_key(self, k: int) -> np.ndarray:
        """Key k's uses per group (float64 [G])."""
        out = np.zeros(self.count)
        s, e = self.key_start[k], self.key_start[k + 1]
        out[self.key_group[s:e]] = self.key_count[s:e]
        return out


def prompt_groups(stream, texts) -> Groups:
    """Group the model's texts (stream's first `model_docs`) by their `prompt` (whitespace
    collapsed); a text of unknown prompt is a group of its own. `named` indexes the prompts' words."""
    ids: dict[str, int] = {}
    of_doc = np.empty(stream.model_docs, np.int64)
    prompts: list[str | None] = []
    for d in range(stream.model_docs):
        p = getattr(texts[d], "prompt", None)
        key = " ".join(p.split()) if isinstance(p, str) and p.strip() else None
        if key is None:
            of_doc[d] = len(prompts)
            prompts.append(None)
        else:
            if key not in ids:
                ids[key] = len(prompts)
                prompts.append(key)
            of_doc[d] = ids[key]
    pos = np.flatnonzero(stream.key[:stream.split] >= 0)
    keys, group = stream.key[pos].astype(np.int64), of_doc[stream.doc[pos]]
    punct = np.fromiter((is_punct(k) for k in stream.keys), bool, len(stream.keys))
    sizes = np.bincount(group[~punct[keys]], minlength=len(prompts)).astype(np.float64)
    pairs, counts = np.unique(keys * len(prompts) + group, return_counts=True)
    named: dict[str, list[int]] = {}
    for g, p in enumerate(prompts):
        if p is not None:
            for w in {fold(t[0]) for s in sentences(p) for t in s if not is_punct(t[0])}:
                named.setdefault(w, []).append(g)
    return Groups(of_doc, sizes, np.array([p is not None for p in prompts], bool),
                  {w: np.asarray(gs, np.int64) for w, gs in named.items()},
                  np.searchsorted(pairs // len(prompts), np.arange(len(stream.keys) + 1)),
                  pairs % len(prompts), counts)


@dataclass(frozen=True)
class Usage:
    prompts: int                   # groups whose texts use it
    prompt_share: float            # of all groups
    dispersion: float | None       # Juilland's D over the groups (None: one group)
    spread: float                  # prompts over those chance placement reaches
    echo: float | None             # share of its prompted uses whose prompt names a content word
    word_spread: float | None      # the least spread of its content words (each over all its uses)
    word_echo: float | None        # the largest echo of its content words
    unrelated_per_1k: float | None  # its rate in texts whose prompt does not name its content words
    function_share: float          # share of its words that are function-like
    kind: str                      # style / mixed / topic


def juilland_d(counts: np.ndarray, sizes: np.ndarray) -> float | None:
    """Juilland's D of counts over parts of the given sizes (parts of size 0 left out)."""
    keep = sizes > 0
    counts, sizes = counts[keep], sizes[keep]
    if counts.size < 2 or counts.sum() == 0:
        return None
    rate = counts / sizes
    v = rate.std() / rate.mean()
    return float(min(max(1.0 - v / np.sqrt(counts.size - 1), 0.0), 1.0))


def expected_groups(count: int, sizes: np.ndarray) -> float:
    """Groups reached by `count` uses placed at random, word by word, over groups of these sizes."""
    share = sizes[sizes > 0] / sizes.sum()
    return float(np.sum(-np.expm1(count * np.log1p(-np.minimum(share, 1.0 - 1e-12)))) if share.size > 1 else 1.0)


def kind_of(function_share: float, echo: float | None, spread: float) -> str:
    """The module doc's rule, on the largest echo and the least spread of the phrase and its words."""
    if function_share >= 1.0:
        return "style"
    if (echo is not None and echo >= ECHO_TOPIC) or spread < SPREAD_TOPIC:
        return "topic"
    if (echo is None or echo < ECHO_STYLE) and spread >= SPREAD_STYLE:
        return "style"
    return "mixed"


def _signals(groups: Groups, per_group: np.ndarray, related: np.ndarray) -> tuple[float, float | None]:
    """(spread, echo) of uses counted per group, `related` the groups whose prompt names its words."""
    spread = np.count_nonzero(per_group) / expected_groups(int(per_group.sum()), groups.words)
    prompted = per_group[groups.prompted].sum()
    return float(spread), (float(per_group[related].sum() / prompted) if prompted > 0 and related.any() else
                           0.0 if prompted > 0 else None)


def _related(groups: Groups, words) -> np.ndarray:
    out = np.zeros(groups.count, bool)
    for w in words:
        out[groups.named.get(w, np.zeros(0, np.int64))] = True
    return out


def usage(groups: Groups, stream, positions: np.ndarray, n: int, function: np.ndarray,
          words_seen: dict | None = None) -> Usage:
    """The features and kind of the gram of n tokens at model `positions` (`function`: per key,
    `function_like`). `words_seen`: the caller's dict of each content word's (spread, echo), filled
    as words are met (phrases share words; the groups are the same for all of them)."""
    per_group = np.bincount(groups.of_doc[stream.doc[positions]], minlength=groups.count).astype(np.float64)
    used = int(np.count_nonzero(per_group))
    first = int(positions[0])
    words = [int(k) for k in stream.key[first:first + n] if not is_punct(stream.keys[int(k)])]
    content = sorted({k for k in words if not function[k]})
    share = sum(bool(function[k]) for k in words) / len(words) if words else 1.0
    related = _related(groups, {fold(stream.keys[k]) for k in content})
    spread, echo = _signals(groups, per_group, related)
    if not content:
        echo = None
    seen = {} if words_seen is None else words_seen
    for k in content:
        if k not in seen:
            seen[k] = _signals(groups, groups.of_key(k), _related(groups, [fold(stream.keys[k])]))
    each = [seen[k] for k in content]
    word_spread = min((s for s, _ in each), default=None)
    word_echo = max((e for _, e in each if e is not None), default=None)
    unrelated_words = groups.words[~related].sum()
    unrelated = 1000.0 * per_group[~related].sum() / unrelated_words if unrelated_words > 0 else None
    echoes = [e for e in (echo, word_echo) if e is not None]
    kind = kind_of(share, max(echoes) if echoes else None, min(spread, word_spread if word_spread is not None else spread))
    return Usage(used, used / groups.count, juilland_d(per_group, groups.words), spread, echo, word_spread, word_echo,
                 unrelated, share, kind)
