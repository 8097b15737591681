"""discover's inputs bounded in memory and time (issue 38, items 5, 6, 8 and 10): a .json list parsed
one record at a time, the records and characters of a side capped, the harness's tags stripped in
linear time, only regular files read (a FIFO, a device, a symlink loop refused by name), a lone
surrogate an error naming the file, a content part whose `type` is a list no traceback; random
records and mutated files raise only DiscoverError."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.evals.discover.sources import (HARNESS_TAGS, LIMITS, DiscoverError, Limits, human_texts, model_texts,
                                              strip_harness)
from tests.special_files import KINDS, WHY, special
from tests.strategies import TEXT_PIECES, records, tricky_text

# the regex the harness's tags were stripped with: the reference strip_harness must equal (it is
# quadratic on a line of openings, so only small texts are compared)
OLD_HARNESS = re.compile(rf"<({'|'.join(HARNESS_TAGS)})>.*?</\1>|^\[Request interrupted by user[^\]\n]*\]$",
                         re.DOTALL | re.MULTILINE)


def jsonl(path, recs):
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def _usable(texts) -> bool:
    """Every text, tag and prompt can be written out (no lone surrogate)."""
    for t in texts:
        for s in (t.text, t.source, t.where, t.prompt or ""):
            s.encode("utf-8")
    return bool(texts) and all(t.text.strip() for t in texts)


# ---- memory and time --------------------------------------------------------------------------

RSS = """
import resource, sys
from exactedit.evals.discover.sources import DiscoverError, Limits, model_texts
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    model_texts([sys.argv[1]], limits=Limits(records=200_000, line_bytes=1 << 20))
except DiscoverError as exc:
    print("error:", exc)
print("grew", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base)
"""


def test_a_json_list_of_empty_objects_is_parsed_in_bounded_memory(tmp_path):
    """8 million `{}` (24 MB): json.loads built every one of them (a 200 MiB file took 3.9 GB, then
    14 GB here); streamed, the peak is the file's bytes and text and one window, and the record cap
    stops the read."""
    f = tmp_path / "empty.json"
    f.write_bytes(b"[" + b"{}," * (8_000_000 - 1) + b"{}]")
    size = f.stat().st_size
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", RSS, str(f)], capture_output=True, text=True, timeout=120).stdout
    assert "pass 200000 records in all" in out, out
    grew = int(out.split("grew")[1]) * 1024
    assert grew < 3 * size, f"peak RSS grew {grew >> 20} MiB on a {size >> 20} MiB file"
    assert time.perf_counter() - t0 < 20


def test_many_tiny_records_stop_at_the_record_limit(tmp_path):
    """250,000 one-line records (a JSONL of `{}` and a .json list of them): the side's record count is
    capped, so reading stops early with an error naming the file and the record."""
    lines = tmp_path / "tiny.jsonl"
    lines.write_text("{}\n" * 250_000)
    listed = tmp_path / "tiny.json"
    listed.write_text("[" + ",".join(['{"text": "a b"}'] * 250_000) + "]")
    for f, field in ((lines, "line 20001"), (listed, "[20000]")):
        t0 = time.perf_counter()
        with pytest.raises(DiscoverError, match=rf"{f.name}: {re.escape(field)}: the model texts pass 20000 records"):
            model_texts([f], limits=Limits(records=20_000))
        assert time.perf_counter() - t0 < 3
    assert LIMITS.records <= 1_000_000          # the default: a few seconds of reading at most


def test_a_big_text_file_is_refused_at_the_character_limit(tmp_path):
    """A 52 MB .txt took over a minute to count; the side's characters are capped (discover counts
    about a million a second), and the file is refused at once, by name."""
    f = tmp_path / "big.txt"
    f.write_bytes(b"the model wrote this. " * 2_400_000)         # 52.8 MB
    t0 = time.perf_counter()
    with pytest.raises(DiscoverError, match=r"big\.txt: size: the human texts pass \d+ characters"):
        human_texts([f])
    assert time.perf_counter() - t0 < 3
    assert LIMITS.chars <= 20_000_000


def test_a_json_record_longer_than_the_limit_is_refused_before_it_is_built(tmp_path):
    f = tmp_path / "one.json"
    f.write_text(json.dumps([{"text": "short"}, {"messages": [{}] * 2000}, {"text": "x"}]))
    with pytest.raises(DiscoverError, match=r"one\.json: json: not valid JSON within 1000 characters of record \[1\]"):
        model_texts([f], limits=Limits(line_bytes=1000))
    g = tmp_path / "single.json"
    g.write_text(json.dumps({"messages": [{"role": "assistant", "content": "y" * 3000}]}))
    with pytest.raises(DiscoverError, match=r"single\.json: the record: longer than 2000 characters"):
        model_texts([g], limits=Limits(line_bytes=2000))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(st.text(min_size=1, max_size=40).filter(str.strip), min_size=1, max_size=80),
       limit=st.integers(500, 900), spaces=st.sampled_from(["", " ", "\n  "]))
def test_a_json_list_is_read_as_json_loads_reads_it(tmp_path, texts, limit, spaces):
    """Record by record through a window of 2 * limit characters (slid as it goes), the records are
    json.loads' own, in order: the window never cuts a record it reads (each is at most 492
    characters: 40 escaped characters of 12)."""
    f = tmp_path / "r.json"
    f.write_text(spaces + "[" + spaces + ("," + spaces).join(json.dumps({"text": t}) for t in texts) + spaces + "]"
                 + spaces)
    got = model_texts([f], limits=Limits(line_bytes=limit))
    assert [t.text for t in got] == texts
    assert [t.where for t in got] == [f"{f}[{k}]" for k in range(len(texts))]


@pytest.mark.parametrize("text, why", [
    ('[{"text": "a"},]', "a comma before"), ('[{"text": "a"} {"text": "b"}]', "expected ',' or ']'"),
    ('[{"text": "a"}] x', "extra data"), ('[{"text": "a"}', "expected ',' or ']'"), ("", "Expecting value"),
    ('{"text": "a"} {}', "extra data"), ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
])
def test_malformed_json_lists_are_our_error(tmp_path, text, why):
    f = tmp_path / "bad.json"
    f.write_text(text)
    with pytest.raises(DiscoverError, match=rf"bad\.json: json: .*{re.escape(why)}"):
        model_texts([f])


# ---- the harness's tags, in linear time ---------------------------------------------------------

def test_a_line_of_openings_is_stripped_in_linear_time(tmp_path):
    """A 3.4 MB Claude Code line of `<system-reminder>` openings: the regex rescanned to the end at
    every opening (8,000 of them took it about 30 s); strip_harness is one pass."""
    t0 = time.perf_counter()
    line = "<system-reminder>" * 200_000                                   # 3.4 MB
    assert strip_harness(line) == line
    assert strip_harness(line + "</system-reminder>after") == "after"
    f = jsonl(tmp_path / "session.jsonl", [{"type": "user", "message": {"content": "<system-reminder>" * 8000 + "hi"}}])
    assert [t.text for t in human_texts([f])] == ["<system-reminder>" * 8000 + "hi"]
    assert time.perf_counter() - t0 < 3


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(TEXT_PIECES + tuple(f"<{t}>" for t in HARNESS_TAGS)
                                + tuple(f"</{t}>" for t in HARNESS_TAGS)) | st.text(max_size=2), max_size=14)
       .map("".join))
@example("<system-reminder>a<command-name>b</system-reminder>c</command-name>")
@example("x\n[Request interrupted by user]\n<bash-stdout>\n</bash-stdout>")
def test_strip_harness_is_the_regex(text):
    assert strip_harness(text) == OLD_HARNESS.sub("", text)


# ---- special files ------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_refused_by_name(tmp_path, kind):
    """A FIFO, a link to /dev/zero or a symlink loop named like a text, in a directory or given
    itself: read whole, the FIFO hung, /dev/zero ran out of memory and the loop was a RuntimeError."""
    (tmp_path / "a.txt").write_text("a fine text")
    bad = special(tmp_path / "b.txt", kind)
    for read in (model_texts, human_texts):
        with pytest.raises(DiscoverError, match=re.escape(f"{bad}: file: ") + ".*" + re.escape(WHY[kind])):
            read([tmp_path])
        with pytest.raises(DiscoverError, match=re.escape(f"{bad}: path: ") + ".*" + re.escape(WHY[kind])):
            read([bad])


# ---- lone surrogates, odd content parts ---------------------------------------------------------

@pytest.mark.parametrize("rec, field", [
    ({"text": "a lone \ud800 here"}, "line 2"),
    ({"role": "assistant", "content": [{"type": "text", "text": "x\udfff"}]}, "line 2"),
    ({"text": "fine", "model": "m\ud800"}, "line 2"),
    ({"text": "fine", "prompt": "p\ud800"}, "line 2"),
])
def test_a_lone_surrogate_is_an_error_naming_the_file_and_line(tmp_path, rec, field):
    """Valid JSON ("\\ud800") that no UTF-8 writer can encode: it crashed discover's output."""
    f = jsonl(tmp_path / "s.jsonl", [{"text": "fine"}, rec])
    with pytest.raises(DiscoverError, match=rf"s\.jsonl: {field}: the \w+ holds a lone surrogate"):
        model_texts([f])
    g = tmp_path / "s.json"
    g.write_text(json.dumps([{"text": "fine"}, rec]))
    with pytest.raises(DiscoverError, match=r"s\.json: \[1\]: the \w+ holds a lone surrogate"):
        model_texts([g])


def test_a_content_part_whose_type_is_a_list_is_skipped(tmp_path):
    """`{"type": [...]}` was looked up in a frozenset: TypeError (unhashable list)."""
    f = jsonl(tmp_path / "c.jsonl", [{"role": "assistant", "content": [{"type": ["text"], "text": "no"},
                                                                       {"type": {"a": 1}, "text": "no"},
                                                                       {"type": "text", "text": "yes"}]},
                                     {"type": "assistant", "message": {"content": [{"type": ["text"], "text": "n"}]}},
                                     {"role": ["assistant"], "content": "no"}])
    assert [t.text for t in model_texts([f])] == ["yes"]


# ---- random records, mutated files: only our error -----------------------------------------------

@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(recs=st.lists(records, min_size=1, max_size=4), as_list=st.booleans())
@example(recs=[{"role": "assistant", "content": [{"type": ["text"], "text": "x"}]}], as_list=False)
@example(recs=[{"text": "\ud800"}], as_list=True)
def test_random_records_give_texts_or_our_error(tmp_path, recs, as_list):
    f = tmp_path / ("r.json" if as_list else "r.jsonl")
    f.write_text(json.dumps(recs) if as_list else "".join(json.dumps(r) + "\n" for r in recs))
    for read in (model_texts, human_texts):
        try:
            got = read([f])
        except DiscoverError as exc:
            assert str(f) in str(exc)
            str(exc).encode("utf-8")                     # the message itself can be printed
        else:
            assert _usable(got)


VALID_JSON = json.dumps([{"text": "one reply"}, {"messages": [{"role": "user", "content": "hi"},
                                                              {"role": "assistant", "content": "hello"}]},
                         {"side": "base", "text": "two"}]).encode()


@given(st.lists(st.tuples(st.integers(0, len(VALID_JSON) - 1), st.integers(0, 255)), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_json_lists_raise_only_our_error(tmp_path, edits):
    data = bytearray(VALID_JSON)
    for at, byte in edits:
        data[at] = byte
    f = tmp_path / "m.json"
    f.write_bytes(bytes(data))
    for read in (model_texts, human_texts):
        try:
            got = read([f], limits=Limits(line_bytes=64))
        except DiscoverError as exc:
            assert str(f) in str(exc)
        else:
            assert _usable(got)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=tricky_text)
def test_plain_text_files_of_any_text_give_one_text_or_our_error(tmp_path, text):
    f = tmp_path / "t.txt"
    f.write_bytes(text.encode("utf-8", errors="replace"))
    try:
        got = human_texts([f])
    except DiscoverError as exc:
        assert str(f) in str(exc)
    else:
        assert _usable(got)
