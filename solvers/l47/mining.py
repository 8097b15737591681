"""Target mining for `solve wfld`: banned phrases as text -> FTPO positions and collateral uses.

Phrases are matched by the toolkit's one phrase matcher (solvers/phrases.py, shared with
`exactedit mine` and the phrase rates of free generation): the phrase as written and capitalized,
starting at a word boundary (after a space, a newline, punctuation or a quote), the boundary
character inside the first token or in a context token before it.

An FTPO position is a row t whose preceding tokens (row t reads token t) are exactly a matched
tuple's prefix, inside one document, and whose next token is the tuple's final token (the
rejected token). Where two tuples match, the longer one wins, as in `solvers.tail.scores.slop_positions`;
with the matched tuples as the bars' phrase list, the bars see exactly these positions.

Given `tuples` (a protocol's phrase list, as ids), nothing is matched again: those are the tuples
(each must be a form the matcher finds for one of the phrases), the positions are the bars' own
(`slop_positions` of the tuples) and the words are the given ones, so a solve and an `eval score`
of the same protocol see the same tuples, positions and words.
A phrase's words are the final tokens of its tuples; a word's collateral rows are its legitimate
uses: rows whose next token is the word and that are no FTPO position of any phrase. Beside the
positions, each trace records how often each phrase occurs in its decoded text (whole words, the
same forms), so a report can say how many of the text's occurrences were found prefix-exact.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from exactedit.solvers.phrases import PhraseError, PhraseMatcher, TokenBytes, canonical, text_occurrences
from exactedit.solvers.tail.scores import slop_positions


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
    occurrences: tuple[int, ...] = ()   # per phrase: whole-word occurrences in the decoded text


@dataclass(frozen=True, eq=False)
class Mining:
    phrases: tuple[str, ...]
    tuples: tuple[tuple[int, ...], ...]     # every matched tuple, sorted (or as given): the bars' phrase list
    tuple_phrase: tuple[int, ...]
    words: tuple[int, ...]                  # final tokens of the phrases (collateral words)
    word_phrases: tuple[tuple[int, ...], ...]
    canonical: tuple[tuple[int, ...] | None, ...]   # per phrase: fewest-token form after a space
    traces: Mapping[str, TraceMining]

    def trace(self, name: str) -> TraceMining:
        return self.traces[name]

    def counts(self) -> dict[str, dict[str, int]]:
        return {name: {"ftpo": int(tm.rows.size), "collateral": int(tm.coll_rows.size),
                       "occurrences": int(sum(tm.occurrences))}
                for name, tm in self.traces.items()}

    def phrase_counts(self) -> list[dict]:
        """Per phrase: occurrences in the decoded text of all traces, and contexts found."""
        out = []
        for pi, p in enumerate(self.phrases):
            occ = sum(tm.occurrences[pi] for tm in self.traces.values() if tm.occurrences)
            ctx = sum(int(np.sum(tm.phrase == pi)) for tm in self.traces.values())
            out.append({"phrase": p, "occurrences": int(occ), "contexts": ctx})
        return out


def mine(dumps: Mapping[str, object], phrases: Sequence[str], table, *, capitalized: bool = True,
         tuples: Sequence[Sequence[int]] | None = None, words: Sequence[int] | None = None) -> Mining:
    """FTPO positions and collateral uses of `phrases` in each dump (name -> dumps.Dump). With
    `tuples` (and `words`, default their final tokens), the positions of those tuples (see the
    module doc); a tuple that spells none of the phrases raises PhraseError."""
    tb = TokenBytes(table)
    matcher = PhraseMatcher(phrases, tb, capitalized)
    tuple_phrase: dict[tuple[int, ...], int] = {}
    if tuples is None:
        found = {name: matcher.find(np.asarray(d.tokens), np.asarray(d.next), d.docs) for name, d in dumps.items()}
        for hits in found.values():
            for _, pi, tup in hits:
                tuple_phrase.setdefault(tup, pi)
    else:
        tuple_phrase = _given_phrases(tuples, matcher)
        found = {name: _tuple_hits(d, tuple_phrase) for name, d in dumps.items()}
    canon = tuple(canonical(b" " + p.encode("utf-8"), tb) for p in phrases)
    word_phr: dict[int, set[int]] = {}
    for tup, pi in tuple_phrase.items():
        word_phr.setdefault(tup[-1], set()).add(pi)
    for pi, c in enumerate(canon):
        if c is not None and len(c) >= 2:
            word_phr.setdefault(c[-1], set()).add(pi)
    if tuples is None:
        words = tuple(sorted(word_phr))
        tuples = tuple(sorted(tuple_phrase))
    else:
        words = tuple(sorted({int(w) for w in (words if words is not None else (t[-1] for t in tuple_phrase))}))
        tuples = tuple(tuple_phrase)
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
        toks = np.asarray(d.tokens)
        occ = np.zeros(len(phrases), dtype=np.int64)
        for doc in d.docs:
            text = tb.text(toks[doc.first_row:doc.stop]).decode("utf-8", errors="replace")
            occ += text_occurrences(text, phrases, capitalized)
        traces[name] = TraceMining(name, rows, np.array([p for _, p, _ in hits], dtype=np.int64),
                                   np.array([tid[t] for _, _, t in hits], dtype=np.int64),
                                   doc_index[rows] if rows.size else np.zeros(0, np.int64), coll, widx,
                                   tuple(int(x) for x in occ))
    return Mining(tuple(phrases), tuples, tuple(tuple_phrase[t] for t in tuples), words,
                  tuple(tuple(sorted(word_phr.get(w, ()))) for w in words), canon, traces)


def _given_phrases(tuples, matcher: PhraseMatcher) -> dict[tuple[int, ...], int]:
    """tuple -> the phrase it spells (in the given order), as the matcher would match it."""
    out: dict[tuple[int, ...], int] = {}
    for i, tup in enumerate(tuples):
        tup = tuple(int(t) for t in tup)
        hit = matcher.match_row(tup[:-1], len(tup) - 2, tup[-1], 0) if len(tup) >= 2 else None
        if hit is None or hit[1] != tup:
            raise PhraseError("tuples", f"tuples[{i}]", f"{list(tup)} ({matcher.tb.text(tup)!r}) is no form of the "
                              f"phrases {list(matcher.phrases)} at a word boundary")
        if tup in out:
            raise PhraseError("tuples", f"tuples[{i}]", f"{list(tup)} is listed twice")
        out[tup] = hit[0]
    return out


class _Rows:
    """A dump's rows as `slop_positions` reads them."""

    def __init__(self, d):
        self.tokens = np.asarray(d.tokens, dtype=np.int64)
        self.next = np.asarray(d.next, dtype=np.int64)
        self.doc = np.asarray(d.doc_index(), dtype=np.int64)
        self.rows = int(self.tokens.size)


def _tuple_hits(d, given: dict) -> list[tuple[int, int, tuple[int, ...]]]:
    """[(row, phrase, tuple)] where a given tuple's prefix ends and its final token follows (the
    longest wins), as the bars find them."""
    tups = list(given)
    slop = slop_positions(_Rows(d), tups)
    return [(int(r), given[tups[slop[r]]], tups[slop[r]]) for r in np.flatnonzero(slop >= 0)]

