"""The one phrase matcher (solvers/phrases.py): the walk-back matcher against the definition
spelled out by brute force on random token streams; named cases (capitalized, after a newline or
punctuation, with and without the leading space); prefixes, continuations, text occurrences."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.dumps import DocInfo
from exactedit.solvers.phrases import (PhraseError, ban_text,
    PhraseMatcher, TokenBytes, ends_at_boundary, load_phrases, parse_phrases, phrase_forms, split_last_word,
    starts_word, text_occurrences, tokenizations,
)
from exactedit.solvers.tail.model import TokenTable
from tests.solvers.l47 import synth


@pytest.fixture(scope="module")
def table():
    tokens, types = synth.vocab()
    return TokenTable(tuple(tokens), tuple(types), "bpe")


@pytest.fixture(scope="module")
def ids():
    return synth.Ids()


def test_load_phrases(tmp_path):
    p = tmp_path / "p.txt"
    p.write_text("# banned\n\nend to end\n  rather   than  \n")
    assert load_phrases(p) == ("end to end", "rather than")
    p.write_text("end to end\nend to end\n")
    with pytest.raises(PhraseError, match="listed twice"):
        load_phrases(p)
    with pytest.raises(PhraseError, match="no phrases"):
        parse_phrases(["# nothing"])
    with pytest.raises(PhraseError, match="cannot read"):
        load_phrases(tmp_path / "missing.txt")


def test_load_phrases_from_discover_json(tmp_path):
    import json

    p = tmp_path / "found.json"
    entries = [{"phrase": "delve"}, {"phrase": "Here's an example:", "ban_phrase": "Here's an"},
               {"phrase": "you can use"}, {"phrase": "you can use ."}, {"phrase": "it's worth noting that"}]
    p.write_text(json.dumps({"phrases": entries}))
    # one word skipped (no prefix), the measured ban point taken, trailing punctuation dropped, duplicates once
    assert load_phrases(p) == ("Here's an", "you can use", "it's worth noting that")
    assert load_phrases(p, top=2) == ("Here's an", "you can use")
    p.write_text(json.dumps({"phrases": [{"phrase": "delve"}]}))
    with pytest.raises(PhraseError, match="no usable phrase"):
        load_phrases(p)
    p.write_text(json.dumps({"phrases": [{"z": 3}]}))
    with pytest.raises(PhraseError, match=r"phrases\[0\]\.phrase"):
        load_phrases(p)
    p.write_text('{"phrases": [')
    with pytest.raises(PhraseError, match="not valid JSON"):
        load_phrases(p)
    t = tmp_path / "p.txt"
    t.write_text("a b\nc d\ne f\n")
    assert load_phrases(t, top=2) == ("a b", "c d")


@pytest.mark.parametrize("text, ban", [("Here's an example:", "Here's an example"), ("delve", None),
                                       ("you can use.", "you can use"), ("don't", None), ("end — to", "end — to"),
                                       ("In summary ,", "In summary"), ("it's", None)])
def test_ban_text(text, ban):
    assert ban_text(text) == ban


def test_forms_and_words():
    assert phrase_forms("end to end", True) == ("end to end", "End to end")
    assert phrase_forms("end to end", False) == ("end to end",)
    assert phrase_forms("'s fine", True) == ("'s fine",)
    assert split_last_word("you can use") == ("you can", " use") and split_last_word("Certainly") is None
    assert [ends_at_boundary(b) for b in (b" ", b"\n", b".", b"(", b'"', b"a", b"9", b"_", b"", b"\xc3")] == \
        [True] * 5 + [False] * 5
    assert ends_at_boundary("—".encode()) and not ends_at_boundary("é".encode())
    assert starts_word(b" use it", b" use") and starts_word(b" use", b" use") and not starts_word(b" user", b" use")


def test_text_occurrences():
    text = "Here's an example.\nhere's an example, (here's an example) Here's an examples. there's an example"
    assert text_occurrences(text, ["here's an example", "an example"]) == [3, 4]
    assert text_occurrences(text, ["here's an example"], capitalized=False) == [2]


def test_tokenizations_lists_every_segmentation(table):
    tb = TokenBytes(table)
    got = {tuple(table.piece(i) for i in t) for t in tokenizations(b" end", tb)}
    assert got == {(" end",), (" ", "end"), (" e", "nd"), (" ", "e", "nd")}


def _boundary(b: bytes) -> bool:
    s = b.decode("utf-8", errors="replace")
    return bool(s) and s[-1] != "\ufffd" and not (s[-1].isalnum() or s[-1] == "_")


def reference_find(tokens, next_, docs, phrases, tb, capitalized=True):
    """Every context by brute force over windows: the window's text (next token included) ends
    with a form; the form starts inside the window's first token, after a boundary character in
    that token or at its start after a text token ending in one (which then joins the tuple); the
    next token lies inside the form. The longest tuple wins."""
    forms = [(pi, f.encode()) for pi, p in enumerate(phrases) for f in phrase_forms(p, capitalized)]
    out = []
    for d in docs:
        for r in range(d.first_row, d.stop):
            y = int(next_[r])
            if y < 0 or not tb(y):
                continue
            best = None
            for lo in range(r, d.first_row - 1, -1):
                window = [int(x) for x in tokens[lo:r + 1]] + [y]
                bs = [tb(x) for x in window]
                if not all(bs):
                    break
                joined = b"".join(bs)
                for pi, body in forms:
                    off = len(joined) - len(body)
                    if not joined.endswith(body) or off < 0 or off >= len(bs[0]) or len(bs[-1]) >= len(body):
                        continue
                    if off > 0:
                        ok, tup = _boundary(bs[0][:off]), tuple(window)
                    else:
                        ok = lo - 1 >= d.first_row and _boundary(tb(int(tokens[lo - 1])))
                        tup = (int(tokens[lo - 1]),) + tuple(window) if ok else ()
                    if ok and (best is None or len(tup) > len(best[1])):
                        best = (pi, tup)
            if best is not None:
                out.append((r, best[0], best[1]))
    return out


ALPHABET = (" end", " to", "end", "End", " e", "nd", "e", " ", "\n", '"', ' "', " the", " rather", "Rather",
            " than", " right", "Right", " away", "aw", "ay", " weekend", "week", "<|im_end|>", ".", ",")


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(ALPHABET), min_size=2, max_size=40), st.integers(0, 39))
@example([".", "End", " to", " end"], 1)
@example(["week", "end", " to", " end"], 1)
def test_matcher_agrees_with_the_definition(pieces, cut):
    tokens, types = synth.vocab()
    tb = TokenBytes(TokenTable(tuple(tokens), tuple(types), "bpe"))
    seq = np.asarray(synth.Ids()(*pieces), dtype=np.int64)
    cut = min(max(cut, 1), len(seq) - 1)
    docs = [DocInfo("a", 0, cut, "s", "c"), DocInfo("b", cut, len(seq) - cut, "s", "c")]
    nxt = np.append(seq[1:], -1)
    nxt[cut - 1] = -1
    assert PhraseMatcher(synth.PHRASES, tb, True).find(seq, nxt, docs) == reference_find(seq, nxt, docs, synth.PHRASES, tb)


@pytest.mark.parametrize("pieces,row,tup", [
    ((" we", " end", " to", " end"), 2, (" end", " to", " end")),
    ((" we", " e", "nd", " to", " end"), 3, (" e", "nd", " to", " end")),
    ((".", "\n", "End", " to", " end"), 3, ("\n", "End", " to", " end")),
    ((" the", ' "', "rather", " than"), 2, (' "', "rather", " than")),
    ((" it", " ", "end", " to", " end"), 3, (" ", "end", " to", " end")),
    ((" it", ".", "End", " to", " end"), 3, (".", "End", " to", " end")),      # after punctuation
    ((" it", ",", "rather", " than"), 2, (",", "rather", " than")),
    ((" do", " right", "aw", "ay"), None, None),           # " rightaway" is not the phrase
    ((" the", "week", "end", " to", " end"), None, None),  # mid-word
    (("<|im_end|>", "end", " to", " end"), None, None),    # after a special token
    ((" right", " now"), None, None),
], ids=["merged", "split-first-word", "newline-capital", "quote", "space-token", "period", "comma", "glued",
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


def test_prefixes_and_continuations(table, ids):
    m = PhraseMatcher(synth.PHRASES, TokenBytes(table), True)
    seq = np.asarray(ids("\n", "Rather", " than", " right", " now", ".", " right", " away", ".", "end", " to",
                         " the"), dtype=np.int64)
    got = {t: m.prefix_at(seq, t, 0) for t in range(len(seq)) if m.prefix_at(seq, t, 0)}
    assert got == {1: (1,), 3: (2,), 6: (2,), 10: (0,)}
    tb = TokenBytes(table)
    follow = {t: m.continues(tb.text(seq[t + 1:]), got[t][0]) for t in got}
    assert follow == {1: True, 3: False, 6: True, 10: False}
    assert not m.continues(b" weekend", 0) and m.continues(b" end", 0)
