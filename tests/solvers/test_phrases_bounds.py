"""Phrase lists read bounded (issue 38, items 6, 8, 9 and 10): deduplication linear (200,000
phrases hung every command reading them), NUL / ESC / DEL and lone surrogates refused naming the
line or entry, discover's JSON nested 100,000 deep our error, a FIFO refused; random files raise
only PhraseError."""
from __future__ import annotations

import json
import re
import time
import unicodedata

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.solvers.phrases import PhraseError, load_phrases, parse_phrases
from tests.special_files import KINDS, WHY, special
from tests.strategies import TEXT_PIECES, json_values, tricky_text


def _ok(phrases) -> bool:
    """Phrases any writer can write: unique, whitespace collapsed, no control character or surrogate."""
    return len(set(phrases)) == len(phrases) and all(
        p and p == " ".join(p.split()) and not any(unicodedata.category(c) in ("Cc", "Cs") for c in p)
        for p in phrases)


def test_200000_phrases_are_read_in_linear_time(tmp_path):
    """2.6 MB of phrases, under the 64 MiB cap: `phrase in out` over a list was O(n^2)."""
    f = tmp_path / "many.txt"
    f.write_text("".join(f"say word{k:06d}\n" for k in range(200_000)))
    t0 = time.perf_counter()
    assert len(load_phrases(f)) == 200_000
    found = tmp_path / "many.json"
    found.write_text(json.dumps({"phrases": [{"phrase": f"say word{k % 150_000:06d}"} for k in range(200_000)]}))
    assert len(load_phrases(found)) == 150_000
    assert time.perf_counter() - t0 < 4


def test_a_duplicate_names_both_lines(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("a b\nc d\n  a   b \n")
    with pytest.raises(PhraseError, match=r"p\.txt: line 3: phrase 'a b' is listed twice \(first on line 1\)"):
        load_phrases(f)


@pytest.mark.parametrize("char, what", [("\x00", "a control character"), ("\x1b", "a control character"),
                                        ("\x7f", "a control character"), ("\x9b", "a control character"),
                                        ("\ud800", "a lone surrogate")])
def test_control_characters_and_lone_surrogates_are_refused(tmp_path, char, what):
    """NUL / ESC phrases compiled into rules (a C reader stops at NUL; ESC drives a terminal); a lone
    surrogate (JSON's "\\ud800") crashed preflight and `shape compile --phrases` on encoding."""
    if char != "\ud800":                                    # UTF-8 text cannot hold a surrogate
        f = tmp_path / "p.txt"
        f.write_text(f"fine one\nyou{char} can use\n", encoding="utf-8")
        with pytest.raises(PhraseError, match=rf"p\.txt: line 2: .* holds {what}"):
            load_phrases(f)
    g = tmp_path / "found.json"
    g.write_text(json.dumps({"phrases": [{"phrase": "fine one"}, {"phrase": f"you{char} can use"}]}))
    with pytest.raises(PhraseError, match=rf"found\.json: phrases\[1\]\.phrase: .* holds {what}"):
        load_phrases(g)
    g.write_text(json.dumps({"phrases": [{"phrase": "fine one", "ban_phrase": f"fine{char} one"}]}))
    with pytest.raises(PhraseError, match=rf"found\.json: phrases\[0\]\.ban_phrase: .* holds {what}"):
        load_phrases(g)


def test_deeply_nested_json_is_our_error(tmp_path):
    """A `--phrases` JSON nested 100,000 deep: RecursionError."""
    f = tmp_path / "deep.json"
    f.write_text('{"phrases": ' + "[" * 100_000 + "]" * 100_000 + "}")
    with pytest.raises(PhraseError, match=r"deep\.json: json: not valid JSON \(nested too deeply\)"):
        load_phrases(f)


@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_refused(tmp_path, kind):
    bad = special(tmp_path / "p.txt", kind)
    with pytest.raises(PhraseError, match=r"p\.txt: phrases: .*" + re.escape(WHY[kind])):
        load_phrases(bad)


def test_a_file_not_utf8_names_the_byte(tmp_path):
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine one\n\xff\xfe\n")
    with pytest.raises(PhraseError, match=r"bad\.txt: phrases: not UTF-8 text \(invalid start byte at byte 9\)"):
        load_phrases(bad)


@settings(max_examples=150, deadline=None)
@given(lines=st.lists(tricky_text, max_size=6))
@example(lines=["a\x00 b"])
def test_random_lines_give_phrases_or_our_error(lines):
    try:
        got = parse_phrases(lines, "p.txt")
    except PhraseError as exc:
        assert "p.txt" in str(exc)
        str(exc).encode("utf-8")
    else:
        assert _ok(got)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=st.one_of(json_values, st.fixed_dictionaries({"phrases": json_values}),
                     st.fixed_dictionaries({"phrases": st.lists(st.fixed_dictionaries(
                         {"phrase": json_values | tricky_text}, optional={"ban_phrase": json_values | tricky_text}),
                         max_size=4)})),
       top=st.none() | st.integers(1, 3))
@example(doc={"phrases": [{"phrase": "a \ud800 b"}]}, top=None)
def test_random_discover_json_gives_phrases_or_our_error(tmp_path, doc, top):
    f = tmp_path / "found.json"
    f.write_text(json.dumps(doc))
    try:
        got = load_phrases(f, top)
    except PhraseError as exc:
        assert str(f) in str(exc)
        str(exc).encode("utf-8")
    else:
        assert _ok(got) and (top is None or len(got) <= top)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=64) | st.lists(st.sampled_from(TEXT_PIECES), max_size=8).map(
    lambda xs: "\n".join(xs).encode("utf-8", "surrogatepass")))
def test_random_bytes_give_phrases_or_our_error(tmp_path, data):
    f = tmp_path / "p.txt"
    f.write_bytes(data)
    try:
        got = load_phrases(f)
    except PhraseError as exc:
        assert str(f) in str(exc)
    else:
        assert _ok(got)
