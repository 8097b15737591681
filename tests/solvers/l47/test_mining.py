"""Mining: phrases as text -> token tuples through the token table, FTPO positions, collateral uses.

The walk-back matcher is compared with the reference that lists every tokenization of every
context form (`tokenizations`) on random token streams; the bars' `slop_positions` sees exactly
the mined positions; on the bundled fixture, mining finds exactly what the fixture planted."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.dumps import DocInfo
from exactedit.solvers.tail.scores import DocMeta, RowScores, slop_positions
from exactedit.solvers.l47.config import WfldError
from exactedit.solvers.l47.mining import (
    CONTEXT_CHARS, PhraseMatcher, TokenBytes, load_phrases, mine, natural_alternatives, phrase_forms,
    tokenizations,
)
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


def test_load_phrases(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("# banned\n\nend to end\n  rather than  \n")
    assert load_phrases(p) == ("end to end", "rather than")
    p.write_text("end to end\nend to end\n")
    with pytest.raises(WfldError, match="listed twice"):
        load_phrases(p)
    p.write_text("# nothing\n")
    with pytest.raises(WfldError, match="no phrases"):
        load_phrases(p)
    with pytest.raises(WfldError, match="cannot read"):
        load_phrases(tmp_path / "missing.txt")


def test_phrase_forms():
    assert phrase_forms("end to end", True) == ("end to end", "End to end")
    assert phrase_forms("end to end", False) == ("end to end",)
    assert phrase_forms("'s fine", True) == ("'s fine",)


def test_tokenizations_lists_every_segmentation(table):
    tb = TokenBytes(table)
    got = {tuple(table.piece(i) for i in t) for t in tokenizations(b" end", tb)}
    assert got == {(" end",), (" ", "end"), (" e", "nd"), (" ", "e", "nd")}


def reference_find(tokens, next_, docs, phrases, tb, capitalized=True):
    """Every FTPO position by listing all tuples of all forms (the definition, spelled out)."""
    merged, bare = {}, {}
    for pi, p in enumerate(phrases):
        for f in phrase_forms(p, capitalized):
            body = f.encode()
            for t in tokenizations(body, tb):
                bare.setdefault(t, pi)
            for c in CONTEXT_CHARS:
                for t in tokenizations(c + body, tb):
                    if len(tb(t[0])) > 1:
                        merged.setdefault(t, pi)
    out = []
    for d in docs:
        for r in range(d.first_row, d.stop):
            best = None
            for tup, pi in list(merged.items()) + list(bare.items()):
                k = len(tup) - 1
                lo = r - k + 1
                if next_[r] != tup[-1] or lo < d.first_row or list(tokens[lo:r + 1]) != list(tup[:-1]):
                    continue
                if tup not in merged:  # a bare form: the token before must end in a context char
                    if lo - 1 < d.first_row or not tb(int(tokens[lo - 1])).endswith(CONTEXT_CHARS):
                        continue
                    tup = (int(tokens[lo - 1]),) + tup
                if best is None or len(tup) > len(best[1]):
                    best = (pi, tuple(int(x) for x in tup))
            if best is not None:
                out.append((r, best[0], best[1]))
    return out


ALPHABET = (" end", " to", "end", "End", " e", "nd", "e", " ", "\n", '"', ' "', " the", " rather", "Rather",
            " than", " right", "Right", " away", "aw", "ay", " weekend", "week", "<|im_end|>", ".")


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), min_size=2, max_size=40), st.integers(0, 39))
def test_matcher_agrees_with_the_reference(pieces, cut):
    tokens, types = synth.vocab()
    table = TokenTable(tuple(tokens), tuple(types), "bpe")
    tb = TokenBytes(table)
    ids = np.asarray(synth.Ids()(*pieces), dtype=np.int64)
    cut = min(max(cut, 1), len(ids) - 1)
    docs = [DocInfo("a", 0, cut, "s", "c"), DocInfo("b", cut, len(ids) - cut, "s", "c")]
    nxt = np.append(ids[1:], -1)
    nxt[cut - 1] = -1
    got = PhraseMatcher(synth.PHRASES, tb, True).find(ids, nxt, docs)
    assert got == reference_find(ids, nxt, docs, synth.PHRASES, tb)


@pytest.mark.parametrize("pieces,row,tup", [
    ((" we", " end", " to", " end"), 2, (" end", " to", " end")),
    ((" we", " e", "nd", " to", " end"), 3, (" e", "nd", " to", " end")),
    ((".", "\n", "End", " to", " end"), 3, ("\n", "End", " to", " end")),
    ((" the", ' "', "rather", " than"), 2, (' "', "rather", " than")),
    ((" it", " ", "end", " to", " end"), 3, (" ", "end", " to", " end")),
    ((" do", " right", "aw", "ay"), None, None),           # " rightaway" is not the phrase
    ((" the", "week", "end", " to", " end"), None, None),  # mid-word: not after a space/newline/quote
    (("<|im_end|>", "end", " to", " end"), None, None),    # after a special token
    ((" right", " now"), None, None),
], ids=["merged", "split-first-word", "newline-capital", "quote", "space-token", "glued",
        "mid-word", "after-special", "prefix-only"])
def test_positions(table, ids, pieces, row, tup):
    seq = np.asarray(ids(*pieces), dtype=np.int64)
    nxt = np.append(seq[1:], -1)
    got = PhraseMatcher(synth.PHRASES, TokenBytes(table), True).find(seq, nxt, [DocInfo("d", 0, len(seq), "", "")])
    if row is None:
        assert got == []
    else:
        assert got == [(row, 0 if "end" in tup[-1] else 1 if "than" in tup[-1] else 2, tuple(ids(*tup)))]


def test_positions_stop_at_document_starts(table, ids):
    seq = np.asarray(ids(" it", " rather", " than"), dtype=np.int64)
    nxt = np.array([seq[1], -1, -1])
    docs = [DocInfo("a", 0, 2, "", ""), DocInfo("b", 2, 1, "", "")]
    assert PhraseMatcher(synth.PHRASES, TokenBytes(table), True).find(seq, nxt, docs) == []
    nxt = np.array([seq[1], seq[2], -1])
    docs = [DocInfo("a", 0, 1, "", ""), DocInfo("b", 1, 2, "", "")]
    assert PhraseMatcher(synth.PHRASES, TokenBytes(table), True).find(seq, nxt, docs) == [(1, 1, tuple(seq[1:]))]


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


def test_natural_alternatives():
    top = np.array([[5, 9, 1, 7, 3], [2, 4, 6, 8, 0]])
    assert natural_alternatives(top, np.array([9, 4]), specials=[1], k=2).tolist() == [[5, 7], [2, 6]]
    with pytest.raises(WfldError, match="alternatives"):
        natural_alternatives(top, np.array([9, 4]), specials=[1, 5, 7, 3], k=2)


@pytest.mark.skipif(not (FIXTURE / "planted.json").is_file(),
                    reason="the bundled fixture (fixtures/default, built by `exactedit fixture make`) is not there yet")
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
