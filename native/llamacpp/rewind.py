"""Rewind: a banned phrase, or a variant of it, caught in the text as it is written; generation rolls
back to the token where the phrase starts and resamples there with that token banned (the phrase-ban
engines' way: koboldcpp, exllama, ik_llama.cpp). The generation loop (native/llamacpp/generate.py,
batched.py) drives it with `--rules-mode rewind`; everything here is pure bookkeeping, no engine.

What counts as the phrase (`key`): a text matches a phrase where the two are equal after each
character is folded: whitespace dropped (so "an  example", "an\\nexample" and the joined
"anexample" are all "an example"), and so are hyphens and dashes ("you-can-use", "can\u2014use") and
markdown's emphasis and code marks inside or around it ("**Here's** an *example*", "`you can use`"),
discover's quote normalization (evals/discover/tokens.py
`normalize`: curly quotes and apostrophes straight, "Here’s"), then lowercased ("AN EXAMPLE").
Boundaries as the shared matcher's (solvers.phrases): a phrase whose first character is a letter,
digit or underscore starts at a word boundary (the character before is none of those, or the
reply's start), one whose last is ends at one (the character after is none, or the reply's end):
"bayou can use" and "you can user" are not "you can use". A match is found the moment it is
decided: at its end boundary's character (or its last character, for a phrase ending in
punctuation), or at the reply's end.

`PhraseScan` is the matcher over a character stream; `scan(text, config)` every match in a text.
`Rewinder` is one reply's state: token pieces (bytes) in; `push(token, open_text, ended)` says
where to roll back to (a token count) or None; `banned()` the tokens banned at the next position;
`committed` how many tokens can no longer be rolled back (what a stream may send: text is held
back only while it could still become a phrase: at most the longest phrase's characters, whitespace
aside, and the one after it).

A ban belongs to its position and the prefix before it: rolling back to token j bans out[j] at j
and forgets every ban past j (their prefixes are gone). Bounds (`RewindConfig`): at most `retries`
bans at one position and `total` rollbacks in one reply; past them the phrase is kept, as the
penalty mode would have kept it (its prefix penalty is live in both modes), and recorded as kept.
A match counts only where its first token was sampled in open text (the rules' trigger state,
solvers.shaping.triggers: not in think, tool calls, code or a structured reply).
"""
from __future__ import annotations

import bisect
import codecs
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

from exactedit.evals.discover.tokens import normalize as discover_normalize
from exactedit.solvers.phrases import is_word_char

__all__ = ["RULES_MODES", "SKIPPED", "PhraseScan", "RewindConfig", "RewindEvent", "Rewinder", "fold", "phrase_key", "scan",
           "summarize_rewinds"]

RULES_MODES = ("penalty", "rewind")
RETRIES, TOTAL = 4, 32      # bans at one position; rollbacks in one reply


# characters a variant may put between (or around) the phrase's: hyphen-minus, the Unicode hyphens
# and dashes, markdown's emphasis and code marks (not "_": a word character, identifiers use it)
SKIPPED = "-\u2010\u2011\u2012\u2013\u2014\u2015*`"


def fold(ch: str) -> str:
    """One character's key: "" for whitespace and the SKIPPED marks, else discover's quote
    normalization, lowercased."""
    return "" if ch.isspace() or ch in SKIPPED else discover_normalize(ch).lower()


def phrase_key(phrase: str) -> str:
    """A phrase's key: its characters folded ("Here’s  an Example" -> "here'sanexample")."""
    return "".join(fold(c) for c in phrase)


class Match(NamedTuple):
    phrase: int      # index into the phrases
    start: int       # the match's first character (an index into the text scanned)
    end: int         # past its last character


@dataclass(frozen=True)
class RewindConfig:
    """The phrases a rewind catches (their variants too, module doc) and its bounds."""

    phrases: tuple[str, ...]
    retries: int = RETRIES
    total: int = TOTAL
    keys: dict = field(init=False, repr=False, compare=False)       # key -> phrase indices
    edges: dict = field(init=False, repr=False, compare=False)      # key -> (needs a start, an end boundary)
    grows: dict = field(init=False, repr=False, compare=False)      # bounded start? -> keys' prefixes
    proper: dict = field(init=False, repr=False, compare=False)     # bounded start? -> proper prefixes

    def __post_init__(self):
        phrases = tuple(str(p) for p in self.phrases)
        object.__setattr__(self, "phrases", phrases)
        if not phrases:
            raise ValueError("rewind: no phrases to catch")
        for name in ("retries", "total"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"rewind {name}: expected an integer >= 0, got {v!r}")
        keys: dict[str, list[int]] = {}
        for i, p in enumerate(phrases):
            k = phrase_key(p)
            if not k:
                raise ValueError(f"rewind: phrase {p!r} has no text")
            keys.setdefault(k, []).append(i)
        edges = {k: (is_word_char(k[0]), is_word_char(k[-1])) for k in keys}
        # a candidate starting at a word boundary may grow into any key, one starting inside a word
        # only into a key whose first character is no word character
        reach = {True: list(keys), False: [k for k in keys if not edges[k][0]]}
        object.__setattr__(self, "keys", {k: tuple(v) for k, v in keys.items()})
        object.__setattr__(self, "edges", edges)
        object.__setattr__(self, "grows", {b: frozenset(k[:n] for k in ks for n in range(1, len(k) + 1))
                                           for b, ks in reach.items()})
        object.__setattr__(self, "proper", {b: frozenset(k[:n] for k in ks for n in range(1, len(k)))
                                            for b, ks in reach.items()})


class PhraseScan:
    """The matcher over a stream of characters: `push(ch, may_start)` returns the matches decided at
    that character, `finish()` those decided by the text's end. `live` is the first character of the
    earliest candidate still undecided (None: none): the text from there may still become a match.
    A candidate is [start, key so far, starts at a word boundary, end of its last character, its
    key decided]; one is kept while it may still match (a longer key, or its end boundary to come)."""

    def __init__(self, config: RewindConfig):
        self.cfg = config
        self.n = 0                    # characters pushed
        self.prev_word = False        # the last character was a letter, digit or underscore
        self.cands: list[list] = []

    @property
    def live(self) -> int | None:
        return self.cands[0][0] if self.cands else None

    def _alive(self, c: list) -> bool:
        return (c[1] in self.cfg.keys and not c[4]) or c[1] in self.cfg.proper[c[2]]

    def _emit(self, c: list, out: list) -> None:
        out.extend(Match(p, c[0], c[3]) for p in self.cfg.keys[c[1]])

    def _grow(self, c: list, ext: str, end: int, out: list) -> list:
        c = [c[0], ext, c[2], end, False]
        if ext in self.cfg.keys and not self.cfg.edges[ext][1]:     # ends in punctuation: decided now
            c[4] = True
            self._emit(c, out)
        return c

    def push(self, ch: str, may_start: bool = True) -> list[Match]:
        cfg, f, word, k = self.cfg, fold(ch), is_word_char(ch), self.n
        out: list[Match] = []
        kept = []
        for c in self.cands:
            if c[1] in cfg.keys and not c[4]:          # a whole key at its end: a boundary, or a longer word
                c[4] = True
                if not word:
                    self._emit(c, out)
            if not f:                                  # whitespace or a mark: the candidate carries on unchanged
                kept.append(c)
            elif c[1] + f in cfg.grows[c[2]]:
                kept.append(self._grow(c, c[1] + f, k + 1, out))
        bounded = k == 0 or not self.prev_word
        if f and may_start and f in cfg.grows[bounded]:
            kept.append(self._grow([k, "", bounded, k, False], f, k + 1, out))
        self.cands = [c for c in kept if self._alive(c)]          # in order of their start
        self.prev_word = word
        self.n = k + 1
        return out

    def finish(self) -> list[Match]:
        """The matches the text's end decides (a whole key waiting for its end boundary)."""
        out: list[Match] = []
        for c in self.cands:
            if c[1] in self.cfg.keys and not c[4]:
                c[4] = True
                self._emit(c, out)
        self.cands = []
        return out


def scan(text: str, config: RewindConfig) -> list[Match]:
    """Every match of `config`'s phrases (and their variants) in `text`, in the order decided."""
    s = PhraseScan(config)
    out: list[Match] = []
    for ch in text:
        out += s.push(ch)
    return out + s.finish()


class RewindEvent(NamedTuple):
    """A phrase caught in a reply: rolled back to token `step` (its first token), `token` banned
    there, `dropped` tokens taken back (sampled again: the rollback's cost); or, past the bounds,
    `kept` (the phrase stayed, `token` its first token, nothing dropped)."""

    phrase: str
    step: int
    token: int
    kept: bool
    dropped: int = 0


class Rewinder:
    """One reply's rewind state (module doc). `piece(token) -> bytes` is the token's text as the
    reply shows it (the engine's `piece`). The caller samples, then `push(token, open_text, ended)`:
    `open_text` whether the row that sampled it was open text (where the rules may fire), `ended`
    whether the reply ends after it (a stop token or its last allowed token). A returned int `j`
    means: keep the first j tokens and sample token j again, with `banned()` banned."""

    def __init__(self, config: RewindConfig, piece: Callable[[int], bytes]):
        self.cfg, self.piece = config, piece
        self.tokens: list[int] = []
        self.opens: list[bool] = []
        self.pieces: list[bytes] = []
        self.ends: list[int] = []               # the byte offset past each token
        self.bans: dict[int, list[int]] = {}    # position -> tokens banned there (for its prefix)
        self.events: list[RewindEvent] = []
        self.rollbacks = 0
        self.ended = False
        self._restart()

    def _restart(self) -> None:
        self.scan = PhraseScan(self.cfg)
        self.decoder = codecs.getincrementaldecoder("utf-8")("surrogateescape")   # one char per bad byte
        self.decoded = 0                        # bytes decoded into characters
        self.char_at: list[int] = []            # each character's first byte

    def _feed(self, data: bytes, final: bool = False) -> list[Match]:
        out: list[Match] = []
        for ch in self.decoder.decode(data, final):
            b = self.decoded
            self.char_at.append(b)
            self.decoded += len(ch.encode("utf-8", "surrogateescape"))
            out += self.scan.push(ch, self.opens[bisect.bisect_right(self.ends, b)])
        return out + self.scan.finish() if final else out

    def token_of(self, char: int) -> int:
        """The token holding character `char`'s first byte."""
        return bisect.bisect_right(self.ends, self.char_at[char])

    def push(self, token: int, open_text: bool = True, ended: bool = False) -> int | None:
        data = self.piece(int(token))
        self.tokens.append(int(token))
        self.opens.append(bool(open_text))
        self.pieces.append(data)
        self.ends.append((self.ends[-1] if self.ends else 0) + len(data))
        found = self._feed(data, final=ended)
        self.ended = ended
        for m in sorted(found, key=lambda m: m.start):
            j = self.token_of(m.start)
            phrase = self.cfg.phrases[m.phrase]
            if len(self.bans.get(j, ())) >= self.cfg.retries or self.rollbacks >= self.cfg.total:
                self.events.append(RewindEvent(phrase, j, self.tokens[j], True))
                continue
            dropped = len(self.tokens) - j
            self._rollback(j)
            self.events.append(RewindEvent(phrase, j, self.bans[j][-1], False, dropped))
            return j
        return None

    def _rollback(self, j: int) -> None:
        self.rollbacks += 1
        self.ended = False
        for i in [i for i in self.bans if i > j]:
            del self.bans[i]
        self.bans.setdefault(j, []).append(self.tokens[j])
        self.events = [e for e in self.events if not (e.kept and e.step >= j)]     # their text is gone
        for seq in (self.tokens, self.opens, self.pieces, self.ends):
            del seq[j:]
        self._restart()
        self._feed(b"".join(self.pieces))       # the kept text rescanned (its matches were kept ones)

    def banned(self) -> tuple[int, ...]:
        """The tokens banned at the next position (given the tokens kept before it)."""
        return tuple(self.bans.get(len(self.tokens), ()))

    @property
    def committed(self) -> int:
        """How many tokens can no longer be rolled back: those wholly before the first character
        that may still start a match (or the first byte not yet a character)."""
        if self.ended:
            return len(self.tokens)
        live = self.scan.live
        byte = self.char_at[live] if live is not None else self.decoded
        return bisect.bisect_right(self.ends, byte)


def summarize_rewinds(replies: Sequence[Sequence[RewindEvent]]) -> dict:
    """Per phrase, over replies: rollbacks made and phrases kept past the bounds; replies rewound and
    the tokens the rollbacks took back."""
    phrases: dict[str, int] = {}
    kept: dict[str, int] = {}
    for events in replies:
        for e in events:
            side = kept if e.kept else phrases
            side[e.phrase] = side.get(e.phrase, 0) + 1
    return {"rewinds": sum(phrases.values()), "kept": sum(kept.values()),
            "replies_rewound": sum(any(not e.kept for e in ev) for ev in replies),
            "dropped_tokens": sum(e.dropped for ev in replies for e in ev),
            "phrases": dict(sorted(phrases.items())), "kept_phrases": dict(sorted(kept.items()))}
