"""Mining: phrases as text -> FTPO positions and collateral uses through the shared matcher.

The matcher itself is tested in test_phrases.py; here: the bars' `slop_positions` sees exactly the
mined positions, text occurrences are counted beside them, and on the bundled fixture mining finds
exactly what the fixture planted."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exactedit.dumps import DocInfo
from exactedit.solvers.tail.scores import DocMeta, RowScores, slop_positions
from exactedit.solvers.phrases import load_phrases
from exactedit.solvers.l47.mining import mine
from exactedit.solvers.tail.model import TokenTable
from tests.solvers.l47 import synth

FIXTURE = Path(__file__).resolve().parents[3] / "fixtures" / "default"


@pytest.fixture(scope="module")
def table():
    tokens, types = synth.vocab()
    return TokenTable(tuple(tokens), tuple(types), "bpe")


@pytest.fixture(scope="module")
def ids():
    return synth.Ids()


class _D:
    """A minimal dump (tokens, next, docs) for mining."""

    def __init__(self, tokens, docs):
        self.tokens = np.asarray(tokens, dtype=np.int32)
        self.next = np.append(self.tokens[1:], -1).astype(np.int32)
        for d in docs[:-1]:
            self.next[d.stop - 1] = -1
        self.docs = docs

    def doc_index(self):
        out = np.zeros(len(self.tokens), np.int32)
        for i, d in enumerate(self.docs):
            out[d.first_row:d.stop] = i
        return out


def test_bars_see_exactly_the_mined_positions(table, ids):
    text = ("we should test it end to end. keep the end of it.\nEnd to end, it is better. do it now rather "
            "than later, more than an hour. right away, far away.")
    toks = ids.text(text)
    dumps = {"x": _D(toks, [DocInfo("a", 0, 20, "", ""), DocInfo("b", 20, len(toks) - 20, "", "")])}
    m = mine(dumps, synth.PHRASES, table)
    tm = m.trace("x")
    d = dumps["x"]
    T = len(toks)
    z = np.zeros(T)
    s = RowScores(d.tokens, d.next, np.zeros(T, np.uint8), d.doc_index(), z, z, z, z.astype(np.int32),
                  z.astype(np.int32), (), np.zeros((T, 0)), np.zeros((T, 0)),
                  docs=(DocMeta("a", "x", "train"), DocMeta("b", "x", "train")))
    slop = slop_positions(s, m.tuples)
    assert list(np.flatnonzero(slop >= 0)) == list(tm.rows) and tm.rows.size == 4
    assert [m.tuple_phrase[t] for t in slop[tm.rows]] == list(tm.phrase)
    words = {table.piece(w): wi for wi, w in enumerate(m.words)}
    assert set(words) == {" end", " than", " away"}
    legit = {(int(r), table.piece(int(m.words[w]))) for r, w in zip(tm.coll_rows, tm.coll_word)}
    assert {w for _, w in legit} == {" end", " than", " away"} and len(legit) == 4  # the end, more than, far away, " end" opening the phrase
    assert not set(tm.rows) & {r for r, _ in legit}
    assert tm.occurrences == (2, 1, 1)
    assert m.phrase_counts() == [{"phrase": "end to end", "occurrences": 2, "contexts": 2},
                                 {"phrase": "rather than", "occurrences": 1, "contexts": 1},
                                 {"phrase": "right away", "occurrences": 1, "contexts": 1}]


@pytest.mark.skipif(not (FIXTURE / "planted.json").is_file(),
                    reason="the bundled fixture (fixtures/default, built by `python -m tests.fixturegen`) is not there yet")
def test_fixture_planted_positions():
    from exactedit.dumps import read_dump
    from exactedit.quant import gguf
    from exactedit.solvers.tail.model import load_tail

    planted = json.loads((FIXTURE / "planted.json").read_text())
    phrases = load_phrases(FIXTURE / "phrases.txt")
    with gguf.open(FIXTURE / "model.gguf") as g:
        tail = load_tail(g)
    names = sorted({e["dump"] for e in planted})
    dumps = {n: read_dump(FIXTURE / "dumps" / n) for n in names}
    m = mine(dumps, phrases, tail.tokens)
    for n in names:
        tm = m.trace(n)
        want = sorted((e["row"], e["label"]) for e in planted if e["dump"] == n and e["kind"] == "slop")
        assert sorted((int(r), phrases[p]) for r, p in zip(tm.rows, tm.phrase)) == want, n
        legit = sorted(e["row"] for e in planted if e["dump"] == n and e["kind"] == "legit")
        assert sorted(int(r) for r in tm.coll_rows) == legit, n


def _two_docs(ids):
    text = ("we should test it end to end. keep the end of it.\nEnd to end, it is better. do it now rather "
            "than later, more than an hour. right away, far away.")
    toks = ids.text(text)
    return {"x": _D(toks, [DocInfo("a", 0, 20, "", ""), DocInfo("b", 20, len(toks) - 20, "", "")])}


def test_given_tuples_reproduce_the_matcher(table, ids):
    """mine(tuples=its own tuples, words=its own words) finds what the matcher found: the same
    positions, phrases, tuple ids, legitimate uses and words (a protocol written from a mining
    gives a solve the same targets)."""
    dumps = _two_docs(ids)
    m = mine(dumps, synth.PHRASES, table)
    g = mine(dumps, synth.PHRASES, table, tuples=m.tuples, words=m.words)
    assert g.tuples == m.tuples and g.words == m.words and g.tuple_phrase == m.tuple_phrase
    assert g.word_phrases == m.word_phrases and g.canonical == m.canonical
    a, b = m.trace("x"), g.trace("x")
    for f in ("rows", "phrase", "tuple_id", "doc", "coll_rows", "coll_word"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.occurrences == b.occurrences


def test_given_tuples_are_the_tuples_in_their_order(table, ids):
    """Given a subset of the tuples (in a protocol's order), only those are positions, the rest
    of their rows are legitimate uses of the word, and the words default to the tuples' finals."""
    dumps = _two_docs(ids)
    m = mine(dumps, synth.PHRASES, table)
    keep = tuple(t for t in m.tuples if m.tuple_phrase[m.tuples.index(t)] != 2)[::-1]   # no "right away"
    g = mine(dumps, synth.PHRASES, table, tuples=keep)
    assert g.tuples == keep and g.words == tuple(sorted({t[-1] for t in keep}))
    tm = g.trace("x")
    assert [g.tuples[i] for i in tm.tuple_id] == [m.tuples[i] for i in m.trace("x").tuple_id if m.tuple_phrase[i] != 2]
    assert 2 not in set(tm.phrase)
    d = dumps["x"]
    z = np.zeros(d.tokens.size)
    s = RowScores(d.tokens, d.next, np.zeros(d.tokens.size, np.uint8), d.doc_index(), z, z, z, z.astype(np.int32),
                  z.astype(np.int32), (), np.zeros((d.tokens.size, 0)), np.zeros((d.tokens.size, 0)),
                  docs=(DocMeta("a", "x", "train"), DocMeta("b", "x", "train")))
    assert list(np.flatnonzero(slop_positions(s, keep) >= 0)) == list(tm.rows)


def test_a_given_tuple_must_spell_a_phrase(table, ids):
    from exactedit.solvers.phrases import PhraseError

    dumps = _two_docs(ids)
    with pytest.raises(PhraseError, match=r"tuples\[0\].*no form of the phrases"):
        mine(dumps, synth.PHRASES, table, tuples=[ids(" end", " of")])
    with pytest.raises(PhraseError, match=r"tuples\[0\]"):               # " test" is no boundary: not a form
        mine(dumps, synth.PHRASES, table, tuples=[ids(" test", " end", " to", " end")])
    with pytest.raises(PhraseError, match="listed twice"):
        mine(dumps, synth.PHRASES, table, tuples=[ids(" rather", " than"), ids(" rather", " than")])
