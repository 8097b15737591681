"""The text `exactedit serve` may stream (runs/serve/stream.py): token pieces in, text out, held
back while it could still be the start of a stop string or is an incomplete UTF-8 character, cut
before the first stop string; what is sent, in all, is the final reply's text."""
from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactedit.runs.serve.stream import TextStream


def test_text_stream_holds_a_possible_stop_and_releases_it_when_it_is_not_one():
    s = TextStream(["END"])
    assert s.push(b"abc E") == "abc " and s.push(b"N") == "" and s.push(b"x") == "ENx" and s.finish() == ""
    s = TextStream(["END"])
    assert s.push(b"abE") == "ab" and s.push(b"ND tail") == "" and s.stopped and s.text == "ab"
    assert s.push(b"more") == "" and s.finish() == ""


def test_text_stream_never_splits_a_character():
    s = TextStream()
    snow = "é☃".encode()
    assert s.push(snow[:1]) == "" and s.push(snow[1:3]) == "é" and s.push(snow[3:]) == "☃"
    assert s.push(b"\xe2") == "" and s.finish() == "\ufffd"          # a character cut at the end: replaced


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab☃é!", max_size=40), junk=st.binary(max_size=3),
       cuts=st.lists(st.integers(0, 160), max_size=12),
       stops=st.lists(st.text(alphabet="ab☃!\ufffd", min_size=1, max_size=4), max_size=3))
@example(text="aab", junk=b"", cuts=[1, 2], stops=["ab"])
@example(text="abab!", junk=b"", cuts=[3], stops=["bab", "b!"])
@example(text="a☃", junk=b"\xe2\x98", cuts=[2, 4], stops=["b"])
@example(text="!aa", junk=b"", cuts=[2], stops=["a", "!aa"])
def test_text_stream_sends_exactly_the_text_cut_at_the_first_stop(text, junk, cuts, stops):
    """Pieces cut anywhere (inside a character too), bytes that are not UTF-8 after them: what is
    sent is the decoded text ("replace") cut before the first stop string found after a piece
    arrives (as a server checks after each token: a stop that would complete later, like "!aa"
    after "!a" has completed "a", is never reached), or all of it."""
    import codecs

    data = text.encode() + junk
    pieces = [data[a:b] for a, b in zip([0, *sorted(cuts)], [*sorted(cuts), len(data)])]
    s, sent = TextStream(stops), ""
    for p in pieces:
        sent += s.push(p)
    sent += s.finish()
    dec, seen, want = codecs.getincrementaldecoder("utf-8")("replace"), "", None
    for p in [*pieces, None]:
        seen += dec.decode(p) if p is not None else dec.decode(b"", final=True)
        found = [i for i in (seen.find(x) for x in stops if x) if i >= 0]
        if found:
            want = seen[:min(found)]
            break
    assert sent == (seen if want is None else want) == s.text and s.stopped == (want is not None)
