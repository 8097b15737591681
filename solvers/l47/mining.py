"""Target mining for `solve wfld`: banned phrases as text -> FTPO positions and collateral uses.

A phrase (one line of the phrases file, e.g. "end to end") is matched at token level through the
model's token table, in every tokenization it can take after a space, a newline or a quote:
- merged: the context character opens the phrase's first token (" end", " to", " end"), any
  segmentation of " end to end" whose first token is longer than the space;
- bare: a segmentation of "end to end" right after a token that ends in a space, newline or quote
  ("\\n", "end", " to", " end"); the context token then belongs to the matched tuple.
With `capitalized`, the form with a capital first letter ("End to end") is matched as well.

An FTPO position is a row t whose preceding tokens (row t reads token t) are exactly a matched
tuple's prefix, inside one document, and whose next token is the tuple's final token (the
rejected token). Where two tuples match, the longer one wins, as in `evals.scoring.slop_positions`;
with the matched tuples as the bars' phrase list, the bars see exactly these positions.
A phrase's words are the final tokens of its tuples; a word's collateral rows are its legitimate
uses: rows whose next token is the word and that are no FTPO position of any phrase.

`tokenizations` enumerates every segmentation of a text (the reference); `PhraseMatcher` walks
back from each row instead of listing them (the number of segmentations grows exponentially
with the phrase's length in a large vocabulary); a test checks that the two agree.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from exactedit.solvers.l47.config import WfldError

CONTEXT_CHARS = (b" ", b"\n", b'"')
MAX_PHRASE_BYTES = 256


def load_phrases(path) -> tuple[str, ...]:
    """Banned phrases, one per line; blank lines and lines starting with '#' are skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WfldError(path, "phrases", f"cannot read as UTF-8 text ({exc})") from None
    out: list[str] = []
    for no, line in enumerate(text.splitlines(), 1):
        phrase = line.strip()
        if not phrase or phrase.startswith("#"):
            continue
        if len(phrase.encode("utf-8")) > MAX_PHRASE_BYTES:
            raise WfldError(path, f"line {no}", f"phrase longer than {MAX_PHRASE_BYTES} bytes")
        if phrase in out:
            raise WfldError(path, f"line {no}", f"phrase {phrase!r} is listed twice")
        out.append(phrase)
    if not out:
        raise WfldError(path, "phrases", "no phrases (expected one banned phrase per line)")
    return tuple(out)


def phrase_forms(phrase: str, capitalized: bool) -> tuple[str, ...]:
    """The phrase as written, and with its first letter capitalized when asked (if different)."""
    forms = [phrase]
    cap = phrase[:1].upper() + phrase[1:]
    if capitalized and cap != phrase:
        forms.append(cap)
    return tuple(forms)


class TokenBytes:
    """Token id -> the bytes it stands for, special tokens -> b"" (they never match text); and,
    built on first use, the inverse index bytes -> ids over the whole table."""

    def __init__(self, table):
        self.table = table
        self._bytes: dict[int, bytes] = {}
        self._index: dict[bytes, tuple[int, ...]] | None = None
        self.max_len = 0

    def __call__(self, i: int) -> bytes:
        b = self._bytes.get(i)
        if b is None:
            b = b"" if self.table.is_special(i) else self.table.token_bytes(i)
            self._bytes[i] = b
        return b

    def index(self) -> dict[bytes, tuple[int, ...]]:
        if self._index is None:
            found: dict[bytes, list[int]] = {}
            for i in range(len(self.table)):
                b = self(i)
                if b:
                    found.setdefault(b, []).append(i)
            self._index = {b: tuple(ids) for b, ids in found.items()}
            self.max_len = max((len(b) for b in self._index), default=0)
        return self._index


def tokenizations(text: bytes, tb: TokenBytes, limit: int = 100_000) -> tuple[tuple[int, ...], ...]:
    """Every segmentation of `text` into tokens of the table (reference; raises past `limit`)."""
    index = tb.index()
    n = len(text)
    tails: list[list[tuple[int, ...]]] = [[] for _ in range(n + 1)]
    tails[n] = [()]
    for i in range(n - 1, -1, -1):
        for j in range(i + 1, min(n, i + tb.max_len) + 1):
            for tok in index.get(text[i:j], ()):
                tails[i].extend((tok,) + rest for rest in tails[j])
        if len(tails[i]) > limit:
            raise WfldError("tokenizations", repr(text), f"more than {limit} segmentations")
    return tuple(sorted(tails[0]))


def canonical(text: bytes, tb: TokenBytes) -> tuple[int, ...] | None:
    """The segmentation with the fewest tokens (ties: the longest first token), or None."""
    index = tb.index()
    n = len(text)
    best: list[tuple[int, ...] | None] = [None] * (n + 1)
    best[n] = ()
    for i in range(n - 1, -1, -1):
        for j in range(min(n, i + tb.max_len), i, -1):
            ids = index.get(text[i:j])
            if ids and best[j] is not None and (best[i] is None or 1 + len(best[j]) < len(best[i])):
                best[i] = (ids[0],) + best[j]
    return best[0]


@dataclass(frozen=True)
class Variant:
    """One text a phrase is matched as: `merged` (the context char opens the first token) or bare."""

    phrase: int
    text: bytes
    merged: bool


def variants(phrases: Sequence[str], capitalized: bool) -> tuple[Variant, ...]:
    out = []
    for pi, phrase in enumerate(phrases):
        for form in phrase_forms(phrase, capitalized):
            body = form.encode("utf-8")
            out.append(Variant(pi, body, False))
            out.extend(Variant(pi, c + body, True) for c in CONTEXT_CHARS)
    return tuple(out)


class PhraseMatcher:
    """Finds FTPO positions by walking back from each row over the variants' bytes."""

    def __init__(self, phrases: Sequence[str], tb: TokenBytes, capitalized: bool):
        self.phrases, self.tb = tuple(phrases), tb
        self.variants = variants(phrases, capitalized)

    def match_row(self, tokens: np.ndarray, t: int, next_tok: int, start: int
                  ) -> tuple[int, tuple[int, ...]] | None:
        """(phrase, tuple) of the longest tuple matching at row t (document rows from `start`)."""
        if next_tok < 0:
            return None
        yb = self.tb(int(next_tok))
        if not yb:
            return None
        best = None
        for v in self.variants:
            if len(v.text) <= len(yb) or not v.text.endswith(yb):
                continue
            seq = self._walk(tokens, t, start, v.text[:-len(yb)], v)
            if seq is not None and (best is None or len(seq) + 1 > len(best[1])):
                best = (v.phrase, tuple(int(x) for x in seq[::-1]) + (int(next_tok),))
        return best

    def _walk(self, tokens, t, start, rem: bytes, v: Variant) -> list[int] | None:
        seq: list[int] = []
        i = t
        while rem:
            if i < start:
                return None
            b = self.tb(int(tokens[i]))
            if not b or not rem.endswith(b):
                return None
            rem = rem[:-len(b)]
            seq.append(int(tokens[i]))
            i -= 1
        if v.merged:
            return seq if len(self.tb(seq[-1])) > 1 else None  # first token longer than the context char
        if i < start or not self.tb(int(tokens[i])).endswith(CONTEXT_CHARS):
            return None
        seq.append(int(tokens[i]))                           # the context token joins the tuple
        return seq

    def find(self, tokens, next_, docs) -> list[tuple[int, int, tuple[int, ...]]]:
        """[(row, phrase, tuple)] over `docs` (objects with first_row and stop)."""
        tokens, next_ = np.asarray(tokens), np.asarray(next_)
        out = []
        finals = {v.text[-1:] for v in self.variants}
        for d in docs:
            for t in range(d.first_row, d.stop):
                y = int(next_[t])
                if y < 0 or self.tb(y)[-1:] not in finals:
                    continue
                hit = self.match_row(tokens, t, y, d.first_row)
                if hit is not None:
                    out.append((t, hit[0], hit[1]))
        return out


@dataclass(frozen=True, eq=False)
class TraceMining:
    """What mining found in one trace: FTPO rows (with phrase and tuple index) and legitimate
    uses of the phrases' words (with the word's index)."""

    name: str
    rows: np.ndarray         # int64 [P] FTPO rows
    phrase: np.ndarray       # int64 [P]
    tuple_id: np.ndarray     # int64 [P] index into Mining.tuples
    doc: np.ndarray          # int64 [P] index into the dump's docs
    coll_rows: np.ndarray    # int64 [Q] legitimate uses of a word
    coll_word: np.ndarray    # int64 [Q] index into Mining.words


@dataclass(frozen=True, eq=False)
class Mining:
    phrases: tuple[str, ...]
    tuples: tuple[tuple[int, ...], ...]     # every matched tuple, sorted: the bars' phrase list
    tuple_phrase: tuple[int, ...]
    words: tuple[int, ...]                  # final tokens of the phrases (collateral words)
    word_phrases: tuple[tuple[int, ...], ...]
    canonical: tuple[tuple[int, ...] | None, ...]   # per phrase: fewest-token form after a space
    traces: Mapping[str, TraceMining]

    def trace(self, name: str) -> TraceMining:
        return self.traces[name]

    def counts(self) -> dict[str, dict[str, int]]:
        return {name: {"ftpo": int(tm.rows.size), "collateral": int(tm.coll_rows.size)}
                for name, tm in self.traces.items()}


def mine(dumps: Mapping[str, object], phrases: Sequence[str], table, *, capitalized: bool = True) -> Mining:
    """FTPO positions and collateral uses of `phrases` in each dump (name -> dumps.Dump)."""
    tb = TokenBytes(table)
    matcher = PhraseMatcher(phrases, tb, capitalized)
    found = {name: matcher.find(np.asarray(d.tokens), np.asarray(d.next), d.docs) for name, d in dumps.items()}
    tuple_phrase: dict[tuple[int, ...], int] = {}
    for hits in found.values():
        for _, pi, tup in hits:
            tuple_phrase.setdefault(tup, pi)
    canon = tuple(canonical(b" " + p.encode("utf-8"), tb) for p in phrases)
    word_phr: dict[int, set[int]] = {}
    for tup, pi in tuple_phrase.items():
        word_phr.setdefault(tup[-1], set()).add(pi)
    for pi, c in enumerate(canon):
        if c is not None and len(c) >= 2:
            word_phr.setdefault(c[-1], set()).add(pi)
    words = tuple(sorted(word_phr))
    tuples = tuple(sorted(tuple_phrase))
    tid = {t: i for i, t in enumerate(tuples)}
    traces = {}
    for name, d in dumps.items():
        hits = found[name]
        rows = np.array([r for r, _, _ in hits], dtype=np.int64)
        doc_index = np.asarray(d.doc_index(), dtype=np.int64)
        nxt = np.asarray(d.next)
        legit = np.isin(nxt, words)
        legit[rows] = False
        coll = np.flatnonzero(legit)
        widx = np.searchsorted(np.asarray(words, dtype=np.int64), nxt[coll]).astype(np.int64)
        traces[name] = TraceMining(name, rows, np.array([p for _, p, _ in hits], dtype=np.int64),
                                   np.array([tid[t] for _, _, t in hits], dtype=np.int64),
                                   doc_index[rows] if rows.size else np.zeros(0, np.int64), coll, widx)
    return Mining(tuple(phrases), tuples, tuple(tuple_phrase[t] for t in tuples), words,
                  tuple(tuple(sorted(word_phr[w])) for w in words), canon, traces)


def natural_alternatives(topk_ids: np.ndarray, rejected: np.ndarray, specials: Sequence[int],
                         k: int) -> np.ndarray:
    """int64 [P, k]: per position, the k highest-logit tokens (`topk_ids` [P, m], by decreasing
    logit) that are neither the rejected token nor a special token."""
    topk_ids = np.asarray(topk_ids, dtype=np.int64)
    out = np.empty((topk_ids.shape[0], k), dtype=np.int64)
    banned = set(int(s) for s in specials)
    for p, (row, rej) in enumerate(zip(topk_ids, np.asarray(rejected))):
        keep = [int(x) for x in row if int(x) != int(rej) and int(x) not in banned][:k]
        if len(keep) < k:
            raise WfldError("mining", "alternatives", f"position {p}: only {len(keep)} of {k} alternatives "
                            f"in the top {row.size} tokens")
        out[p] = keep
    return out
