"""`engine dump --chat` files read bounded (issue 38, items 6, 8 and 10): a special file refused by
name, a line nested 100,000 deep and a lone surrogate in a role or content (it crashed the dump's
hashing and the tokenizer with UnicodeEncodeError) are EngineErrors naming the line; random lines
give conversations any writer can encode, or our error."""
from __future__ import annotations

import json
import re

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from exactedit.native.llamacpp.chat import read_chat_jsonl
from exactedit.native.llamacpp.engine import EngineError
from tests.special_files import KINDS, WHY, special
from tests.strategies import json_values


def _strings(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from _strings(x)


@pytest.mark.parametrize("line, why", [
    ([{"role": "user\ud800", "content": "hi"}], r"a lone surrogate in 'user\\ud800'"),
    ([{"role": "user", "content": [{"type": "text", "text": "\udc80"}]}], "a lone surrogate"),
    ([{"role": "user", "content": "hi", "\ud800": 1}], "a lone surrogate"),
])
def test_a_lone_surrogate_names_the_line(tmp_path, line, why):
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps([{"role": "user", "content": "fine"}]) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(EngineError, match=rf"c\.jsonl: line 2: {why}"):
        read_chat_jsonl(f)


@pytest.mark.parametrize("line, why", [
    ([{"role": ["x"], "content": "hi"}], r"messages\[0\]: expected \{\"role\": str, \"content\": str\}"),
    ([{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}], r"messages\[0\]: expected"),
    ([{"role": "user", "content": "hi"}, 5], r"messages\[1\]: expected .*got 5"),
    ([{"role": "narrator", "content": "hi"}], r"messages\[0\]\.role: expected one of"),
])
def test_a_message_the_template_would_refuse_names_the_file_and_line(tmp_path, line, why):
    """Adversarial pass: a role that is a list was refused as the model's error ("model.gguf:
    messages[0]: ..."), after the model's chat was read; now the chat file's line is named."""
    f = tmp_path / "c.jsonl"
    f.write_text(json.dumps([{"role": "user", "content": "fine"}]) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(EngineError, match=rf"c\.jsonl: line 2: {why}"):
        read_chat_jsonl(f, "--chat")


def test_deep_nesting_names_the_line(tmp_path):
    f = tmp_path / "c.jsonl"
    f.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(EngineError, match=r"c\.jsonl: line 1: not JSON \(nested too deeply\)"):
        read_chat_jsonl(f)


@pytest.mark.parametrize("kind", KINDS)
def test_special_files_are_refused(tmp_path, kind):
    bad = special(tmp_path / "c.jsonl", kind)
    with pytest.raises(EngineError, match=r"c\.jsonl: chat: .*" + re.escape(WHY[kind])):
        read_chat_jsonl(bad)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(lines=st.lists(json_values, min_size=1, max_size=3))
@example(lines=[[{"role": "\ud800", "content": "x"}]])
def test_random_lines_give_conversations_or_our_error(tmp_path, lines):
    f = tmp_path / "c.jsonl"
    f.write_text("".join(json.dumps(x) + "\n" for x in lines))
    try:
        convs = read_chat_jsonl(f)
    except EngineError as exc:
        assert str(f) in str(exc)
        str(exc).encode("utf-8")
    else:
        assert convs and all(isinstance(c, list) and c for c in convs)
        for s in _strings(convs):
            s.encode("utf-8")
