"""The resumable stages of `exactedit antislop` (runs/loop/stages.py), without an engine:
a stage with the same inputs and intact outputs is not redone; changed inputs, a missing or altered
output, or a crash mid-stage make the next run redo it; a directory that is not a run's is refused."""
from __future__ import annotations

import json

import pytest

from exactedit.runs.loop.stages import StageError, Stages, key_of

STATE = "run.json"


def _writer(out, calls, name="a.txt", text="A"):
    def fn():
        calls.append(name)
        (out / name).write_text(text)
        return {"wrote": name, "text": text}
    return fn


def test_a_stage_runs_once_then_resumes_with_the_same_record(tmp_path):
    out, calls = tmp_path / "run", []
    s = Stages(out, 1, state_file="run.json")
    rec = s.run("a", {"x": 1}, ["a.txt"], _writer(out, calls))
    assert rec == {"wrote": "a.txt", "text": "A"} and calls == ["a.txt"] and s.ran == ["a"]
    again = Stages(out, 1, state_file="run.json")
    assert again.run("a", {"x": 1}, ["a.txt"], _writer(out, calls)) == rec
    assert calls == ["a.txt"] and again.resumed == ["a"] and again.ran == []


@pytest.mark.parametrize("change", ["inputs", "altered", "missing", "extra"])
def test_changed_inputs_or_outputs_redo_the_stage(tmp_path, change):
    out, calls = tmp_path / "run", []
    Stages(out, 1, state_file="run.json").run("a", {"x": 1}, ["d"], lambda: (calls.append(1), (out / "d").mkdir(),
                                                      (out / "d" / "f").write_text("1"), {})[-1])
    inputs = {"x": 2} if change == "inputs" else {"x": 1}
    if change == "altered":
        (out / "d" / "f").write_text("2")
    elif change == "missing":
        (out / "d" / "f").unlink()
    elif change == "extra":
        (out / "d" / "g").write_text("left by someone")
    s = Stages(out, 1, state_file="run.json")
    s.run("a", inputs, ["d"], lambda: (calls.append(2), (out / "d").mkdir(), (out / "d" / "f").write_text("1"), {})[-1])
    assert calls == [1, 2] and s.ran == ["a"]
    assert sorted(p.name for p in (out / "d").iterdir()) == ["f"]        # the stale outputs were cleared first


def test_a_crash_mid_stage_leaves_no_entry_and_the_next_run_redoes_it(tmp_path):
    out, calls = tmp_path / "run", []
    Stages(out, 1, state_file="run.json").run("a", {}, ["a.txt"], _writer(out, calls))

    def crash():
        (out / "b.txt").write_text("half")
        raise RuntimeError("killed")

    s = Stages(out, 2, state_file="run.json")
    s.run("a", {}, ["a.txt"], _writer(out, calls))
    with pytest.raises(RuntimeError):
        s.run("b", {}, ["b.txt"], crash)
    state = json.loads((out / STATE).read_text())
    assert set(state["stages"]) == {"a"}
    s2 = Stages(out, 2, state_file="run.json")
    s2.run("a", {}, ["a.txt"], _writer(out, calls))
    s2.run("b", {}, ["b.txt"], _writer(out, calls, "b.txt", "B"))
    assert s2.resumed == ["a"] and s2.ran == ["b"] and (out / "b.txt").read_text() == "B"


def test_a_directory_that_is_not_a_run_is_refused_and_left_alone(tmp_path):
    (tmp_path / "mine.txt").write_text("the user's")
    with pytest.raises(StageError, match="not a run's directory"):
        Stages(tmp_path, 1, state_file="run.json")
    assert (tmp_path / "mine.txt").read_text() == "the user's"


@pytest.mark.parametrize("text,match", [("{", "unreadable"), ('{"version": 9, "stages": {}}', "version"),
                                        ('[1]', "version")])
def test_a_bad_state_file_is_refused(tmp_path, text, match):
    (tmp_path / STATE).write_text(text)
    with pytest.raises(StageError, match=match):
        Stages(tmp_path, 1, state_file="run.json")


def test_keys_are_canonical():
    assert key_of("a", {"x": 1, "y": [1, 2]}) == key_of("a", {"y": [1, 2], "x": 1}) != key_of("b", {"x": 1, "y": [1, 2]})
    assert key_of("a", {"x": 1}) != key_of("a", {"x": 1.5})
