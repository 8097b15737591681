"""The loops' own input files read bounded (issue 38, items 6 and 10): one-per-line files (--prompts,
--rate-prompts, --watch, --same-sense) and plain texts (--texts) are regular files of a capped
size, UTF-8; a FIFO, a link to /dev/zero or a symlink loop is refused by name, never waited on or
read until memory runs out; a --texts directory holding no .txt is an error, not "no texts";
random bytes give lines or InputError."""
from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.files import MAX_TEXT_BYTES
from exactedit.runs.loop import inputs
from exactedit.runs.loop.inputs import InputError, lines, text_files
from tests.special_files import KINDS, WHY, special
from tests.strategies import TEXT_PIECES


@pytest.mark.parametrize("kind", KINDS)
def test_special_files_as_prompts_are_refused_by_name(tmp_path, kind):
    bad = special(tmp_path / "prompts.txt", kind)
    with pytest.raises(InputError, match=re.escape(f"{bad}: lines: ") + ".*" + re.escape(WHY[kind])):
        lines(bad)


def test_prompts_not_utf8_name_the_file_and_byte(tmp_path):
    """A non-UTF-8 --prompts was a UnicodeDecodeError traceback."""
    f = tmp_path / "prompts.txt"
    f.write_bytes(b"first prompt\nsecond \xff prompt\n")
    with pytest.raises(InputError, match=r"prompts\.txt: lines: not UTF-8 text \(invalid start byte at byte 20\)"):
        lines(f)


def test_prompts_are_capped(tmp_path, monkeypatch):
    f = tmp_path / "prompts.txt"
    f.write_text("a prompt\n" * 20)
    monkeypatch.setattr(inputs, "MAX_LINES_BYTES", 100)
    with pytest.raises(InputError, match=r"prompts\.txt: lines: 180 bytes, over the limit of 100"):
        lines(f)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=48) | st.lists(st.sampled_from(TEXT_PIECES) | st.text(max_size=4), max_size=8).map(
    lambda xs: "".join(xs).encode("utf-8", "surrogatepass")))
@example(data=b"\xef\xbb\xbfa\r\nb\rc\n\n# no\n  d  ")
def test_lines_are_what_open_reads_or_our_error(tmp_path, data):
    """Random bytes: the lines text-mode open() gives (universal newlines; a leading BOM is no
    text), or InputError naming the file."""
    f = tmp_path / "p.txt"
    f.write_bytes(data)
    try:
        got = lines(f)
    except InputError as exc:
        assert str(f) in str(exc)
        return
    with open(f, encoding="utf-8-sig") as fh:
        want = tuple(x.strip() for x in fh if x.strip() and not x.lstrip().startswith("#"))
    assert got == want


@pytest.mark.parametrize("kind", KINDS)
def test_special_files_as_texts_are_refused_by_name(tmp_path, kind):
    """--texts FILE or a directory holding one: a FIFO hung the inputs' hashing, /dev/zero was read
    whole; each is refused before the run starts."""
    d = tmp_path / "texts"
    d.mkdir()
    (d / "a.txt").write_text("a fine text")
    bad = special(d / "b.txt", kind)
    for paths in ([str(d)], [str(bad)]):
        with pytest.raises(InputError, match=re.escape(f"{bad}: --texts: ") + ".*" + re.escape(WHY[kind])):
            text_files(paths, None)


def test_texts_are_capped(tmp_path):
    """A --texts file is read whole and tokenized: one over MAX_TEXT_BYTES (a 3 GB file was read
    whole) is refused by its size, before a byte is read."""
    f = tmp_path / "huge.txt"
    with open(f, "wb") as fh:
        fh.truncate(MAX_TEXT_BYTES + 1)                     # sparse: no disk used
    with pytest.raises(InputError, match=rf"huge\.txt: --texts: {MAX_TEXT_BYTES + 1} bytes, over the limit"):
        text_files([str(f)], None)


def test_texts_together_are_capped(tmp_path):
    """Files each under the cap, many of them: a directory of 1,000 capped files was 16 GB read and
    tokenized. Refused at the file that passes the total, naming it."""
    from exactedit.runs.loop.inputs import MAX_TEXTS_BYTES

    d = tmp_path / "texts"
    d.mkdir()
    n = MAX_TEXTS_BYTES // MAX_TEXT_BYTES + 1
    for i in range(n):
        with open(d / f"t{i:02d}.txt", "wb") as fh:
            fh.truncate(MAX_TEXT_BYTES)                     # sparse: no disk used
    with pytest.raises(InputError, match=rf"t{n - 1:02d}\.txt: --texts: the texts up to this file hold "
                                         rf"{n * MAX_TEXT_BYTES} bytes, over the limit of {MAX_TEXTS_BYTES}"):
        text_files([str(d)], None)
    (d / f"t{n - 1:02d}.txt").unlink()
    assert len(text_files([str(d)], None)) == n - 1


def test_a_texts_directory_of_no_txt_is_an_error(tmp_path):
    """It was silently "no texts"."""
    d = tmp_path / "notes"
    d.mkdir()
    (d / "a.md").write_text("not a .txt")
    with pytest.raises(InputError, match=r"notes: --texts: a directory holding no \.txt files"):
        text_files([str(d)], None)
    (d / "b.txt").write_text("one")
    assert text_files([str(d)], None) == (d / "b.txt",)


def test_the_loops_configs_refuse_them_too(tmp_path):
    from exactedit.runs.antislop.config import AntislopConfig
    from exactedit.runs.persona.config import PersonaConfig

    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holding no .txt"):
        AntislopConfig(model="/m.gguf", texts=(str(tmp_path / "empty"),)).text_files()
    f = tmp_path / "prompts.txt"
    f.write_bytes(b"\xff")
    with pytest.raises(InputError, match=r"prompts\.txt: lines: not UTF-8"):
        PersonaConfig(model="/m.gguf", prompts=str(f)).lines("prompts")
