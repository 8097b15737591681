"""Reading texts: replies JSON, OpenAI / one-message / ShareGPT / Claude Code transcripts and plain
files, each tagged by source; the user's turns on the human side; malformed, oversized and empty
inputs refused with errors naming the file and the line; byte mutations raise only DiscoverError."""
from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exactedit.evals.discover.sources import DiscoverError, Limits, human_texts, input_files, model_texts


def jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_replies_json_tagged_by_file_and_side_and_filtered_by_side(tmp_path):
    f = tmp_path / "replies.json"
    f.write_text(json.dumps([{"side": "base", "name": "a", "prompt": "p", "text": "base one"},
                             {"side": "edited", "name": "a", "prompt": "p", "text": "edited one"},
                             {"side": "base", "model": "qwen", "text": "base two"},
                             {"text": "no side"}, {"side": "base", "text": "   "}]))
    got = model_texts([f])
    assert [(t.text, t.source) for t in got] == [("base one", "replies.json:base"), ("edited one", "replies.json:edited"),
                                                 ("base two", "qwen:base"), ("no side", "replies.json")]
    assert got[1].where == f"{f}[1]"
    assert [t.text for t in model_texts([f], sides=["base"])] == ["base one", "base two", "no side"]
    f.write_text(json.dumps([{"side": "edited", "text": "x"}]))
    with pytest.raises(DiscoverError, match=r"replies\.json: turns: 0 usable model texts.*side 'edited' \(not asked\)"):
        model_texts([f], sides=["base"])


def test_openai_conversations_and_one_message_per_line(tmp_path):
    conv = jsonl(tmp_path / "chat.jsonl", [
        {"model": "gpt-x", "messages": [{"role": "system", "content": "be nice"}, {"role": "user", "content": "hi there"},
                                        {"role": "assistant", "content": [{"type": "text", "text": "Hello!"},
                                                                          {"type": "image_url", "image_url": "u"},
                                                                          {"type": "output_text", "text": "More."}]}]},
        {"messages": [{"role": "user", "content": [{"type": "input_text", "text": "again"}]},
                      {"role": "assistant", "content": None}, {"role": "tool", "content": "result"},
                      {"role": "assistant", "content": "Sure."}]}])
    got = model_texts([conv])
    assert [(t.text, t.source, t.where) for t in got] == [("Hello!\n\nMore.", "gpt-x", f"{conv}:1"),
                                                          ("Sure.", "chat.jsonl", f"{conv}:2")]
    assert [(t.text, t.source) for t in human_texts([conv])] == [("hi there", "chat.jsonl"), ("again", "chat.jsonl")]
    one = jsonl(tmp_path / "msgs.jsonl", [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer",
                                                                                   "provider": "acme"}])
    assert [(t.text, t.source) for t in model_texts([one])] == [("answer", "acme")]
    assert [t.text for t in human_texts([one])] == ["question"]


def test_sharegpt(tmp_path):
    f = jsonl(tmp_path / "sg.jsonl", [{"conversations": [{"from": "human", "value": "q"}, {"from": "gpt", "value": "a"}]}])
    assert [t.text for t in model_texts([f])] == ["a"] and [t.text for t in human_texts([f])] == ["q"]


CLAUDE_CODE = [
    {"type": "summary", "summary": "A session", "leafUuid": "x"},
    {"type": "user", "message": {"role": "user", "content": "Please fix the parser."}},
    {"type": "assistant", "message": {"model": "claude-z", "role": "assistant", "content": [
        {"type": "thinking", "thinking": "secret plan"}, {"type": "text", "text": "I'll look at it."},
        {"type": "tool_use", "id": "t1", "name": "Read", "input": {}}]}},
    {"type": "user", "message": {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                                               "content": "file text"}]}},
    {"type": "user", "isMeta": True, "message": {"role": "user", "content": "Caveat: local commands"}},
    {"type": "user", "message": {"role": "user", "content": "<command-name>/clear</command-name>\n"
                                                           "<system-reminder>be brief</system-reminder>Now the tests."}},
    {"type": "assistant", "message": {"model": "<synthetic>", "content": [{"type": "text", "text": "API Error"}]}},
    {"type": "assistant", "message": {"model": "claude-z", "content": [{"type": "text", "text": "Done."}]}},
    {"type": "system", "content": "hook ran", "message": {"content": "x"}},
]


def test_claude_code_sessions(tmp_path):
    f = jsonl(tmp_path / "session.jsonl", CLAUDE_CODE)
    assert [(t.text, t.source) for t in model_texts([f])] == [("I'll look at it.", "claude-z"), ("Done.", "claude-z")]
    assert [t.text.strip() for t in human_texts([f])] == ["Please fix the parser.", "Now the tests."]


def test_a_session_of_zero_usable_turns_is_an_error_naming_the_file(tmp_path):
    f = jsonl(tmp_path / "only-summary.jsonl", [CLAUDE_CODE[0], CLAUDE_CODE[0]])
    with pytest.raises(DiscoverError, match=r"only-summary\.jsonl: turns: 0 usable model texts .*2 'summary' lines"):
        model_texts([f])
    tools = jsonl(tmp_path / "tools.jsonl", [CLAUDE_CODE[2], CLAUDE_CODE[3]])
    with pytest.raises(DiscoverError, match=r"tools\.jsonl: turns: 0 usable human texts"):
        human_texts([tools])
    odd = jsonl(tmp_path / "odd.jsonl", [{"foo": 1}])
    with pytest.raises(DiscoverError, match="1 records of no known shape"):
        model_texts([odd])


def test_plain_files_and_directories(tmp_path):
    d = tmp_path / "notes"
    (d / "sub").mkdir(parents=True)
    (d / "a.txt").write_text("first note")
    (d / "sub" / "b.md").write_text("# second\nnote")
    (d / "skip.py").write_text("x = 1")
    (d / ".hidden").mkdir()
    (d / ".hidden" / "c.txt").write_text("hidden")
    (d / ".d.txt").write_text("hidden too")
    got = human_texts([d, d / "a.txt"])                                   # a file named twice is read once
    assert [(t.text, t.source) for t in got] == [("first note", "a.txt"), ("# second\nnote", "b.md")]
    assert input_files(str(d / "a.txt")) == [d / "a.txt"]
    with pytest.raises(DiscoverError, match=r"skip\.py: file: unsupported file type"):
        human_texts([d / "skip.py"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(DiscoverError, match="empty: directory: holds no"):
        human_texts([tmp_path / "empty"])
    (tmp_path / "blank.txt").write_text(" \n\t")
    with pytest.raises(DiscoverError, match=r"blank\.txt: text: empty"):
        model_texts([tmp_path / "blank.txt"])


@pytest.mark.parametrize("lines, field, why", [
    (['{"role": "user", "content": "ok"}', '{"role": "assistant", "content": "fine"}', '{"role": "assis'],
     "line 3", "not valid JSON"),
    (['{"role": "assistant", "content": "fine"}', "[1, 2]"], "line 2", "expected a JSON object, got list"),
    (['{"role": "assistant", "content": "fine"}', "", '"just a string"'], "line 3", "expected a JSON object"),
    (["[" * 100_000 + "]" * 100_000], "line 1", "JSON nested too deeply"),
])
def test_malformed_lines_name_the_file_and_line(tmp_path, lines, field, why):
    f = tmp_path / "bad.jsonl"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(DiscoverError, match=rf"bad\.jsonl: {field}: ({why})"):
        model_texts([f])


def test_bad_bytes_and_bad_json_files(tmp_path):
    f = tmp_path / "bin.jsonl"
    f.write_bytes(b'{"role": "assistant", "content": "ok"}\n{"role": "assistant", "content": "\xff"}\n')
    with pytest.raises(DiscoverError, match=r"bin\.jsonl: line 2: not UTF-8"):
        model_texts([f])
    g = tmp_path / "top.json"
    g.write_text('"a string"')
    with pytest.raises(DiscoverError, match=r"top\.json: json: expected a list of records"):
        model_texts([g])
    g.write_text('[{"text": "ok"}, 3]')
    with pytest.raises(DiscoverError, match=r"top\.json: \[1\]: expected a JSON object, got int"):
        model_texts([g])
    g.write_text('[{"text": "ok"},\n {"text": ]')
    with pytest.raises(DiscoverError, match=r"top\.json: json: not valid JSON"):
        model_texts([g])
    g.write_bytes(b'\xef\xbb\xbf{"messages": [{"role": "assistant", "content": "one record"}]}')   # a BOM
    assert [t.text for t in model_texts([g])] == ["one record"]


def test_limits_on_file_size_line_length_and_characters(tmp_path):
    f = jsonl(tmp_path / "big.jsonl", [{"role": "assistant", "content": "x" * 50}, {"role": "assistant", "content": "y"}])
    with pytest.raises(DiscoverError, match=r"big\.jsonl: size: \d+ bytes, over the limit of 40"):
        model_texts([f], limits=Limits(file_bytes=40))
    with pytest.raises(DiscoverError, match=r"big\.jsonl: line 1: longer than 60 bytes"):
        model_texts([f], limits=Limits(line_bytes=60))
    assert len(model_texts([f], limits=Limits(line_bytes=87))) == 2
    (tmp_path / "a.txt").write_text("a" * 30)
    (tmp_path / "b.txt").write_text("b" * 30)
    with pytest.raises(DiscoverError, match=r"b\.txt: size: the human texts pass 50 characters"):
        human_texts([tmp_path / "a.txt", tmp_path / "b.txt"], limits=Limits(chars=50))


VALID = "".join(json.dumps(r) + "\n" for r in CLAUDE_CODE).encode()


@given(st.lists(st.tuples(st.integers(0, len(VALID) - 1), st.integers(0, 255)), min_size=1, max_size=8))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_mutated_bytes_raise_only_our_error(tmp_path, edits):
    data = bytearray(VALID)
    for at, byte in edits:
        data[at] = byte
    f = tmp_path / "m.jsonl"
    f.write_bytes(bytes(data))
    for read in (model_texts, human_texts):
        try:
            got = read([f])
        except DiscoverError as exc:
            assert str(f) in str(exc)
        else:
            assert got and all(t.text.strip() for t in got)


def test_a_directory_walk_skips_and_reports_files_with_no_usable_text(tmp_path):
    """A walked file with no usable turn (a session of summaries, tool calls only, an empty note) is
    skipped and listed; named, it is still an error; a walk finding no usable file at all is one."""
    d = tmp_path / "sessions"
    d.mkdir()
    jsonl(d / "a.jsonl", CLAUDE_CODE)
    jsonl(d / "b-summary.jsonl", [CLAUDE_CODE[0], CLAUDE_CODE[0]])
    jsonl(d / "c-tools.jsonl", [CLAUDE_CODE[2], CLAUDE_CODE[3]])
    (d / "d-empty.md").write_text("  \n")
    got = model_texts([d])
    assert [t.text for t in got] == ["I'll look at it.", "Done.", "I'll look at it."]
    assert [(s["file"], s["why"][:23]) for s in got.skipped] == [
        (str(d / "b-summary.jsonl"), "0 usable model texts (a"), (str(d / "d-empty.md"), "empty: no text to count")]
    human = human_texts([d])
    assert [s["file"] for s in human.skipped] == [str(d / "b-summary.jsonl"), str(d / "c-tools.jsonl"),
                                                  str(d / "d-empty.md")]
    with pytest.raises(DiscoverError, match=r"b-summary\.jsonl: turns: 0 usable model texts"):
        model_texts([d / "b-summary.jsonl"])                    # named: an error, as before
    with pytest.raises(DiscoverError, match=r"d-empty\.md: text: empty"):
        model_texts([d, d / "d-empty.md"])                      # named and walked: named
    e = tmp_path / "nothing"
    e.mkdir()
    jsonl(e / "s.jsonl", [CLAUDE_CODE[0]])
    (e / "t.txt").write_text("")
    with pytest.raises(DiscoverError, match=r"no file holds usable model text \(2 skipped; the first: 0 usable"):
        model_texts([e])


def test_skipped_files_reach_the_result_and_the_table(tmp_path):
    from exactedit.evals.discover import discover, render_discovery

    d = tmp_path / "m"
    d.mkdir()
    (d / "a.txt").write_text("We delve into the data and delve into the rest. " * 4)
    (d / "b.txt").write_text("Then we delve into it once more, as we delve into things. " * 4)
    jsonl(d / "c.jsonl", [CLAUDE_CODE[0]])
    (tmp_path / "h.txt").write_text("I walked to the shop and bought some bread for the week.")
    r = discover(model_texts([d]), human_texts([tmp_path / "h.txt"]))
    assert r.skipped == ({"side": "model", "file": str(d / "c.jsonl"),
                          "why": "0 usable model texts (assistant turns or reply texts); read 1 'summary' lines"},)
    assert r.to_dict()["skipped"] == [dict(r.skipped[0])]
    assert f"note: skipped {d / 'c.jsonl'} (model side): 0 usable" in render_discovery(r)
