"""The stage ledger's state and directory (runs/loop/stages.py), without an engine (issue 38, 1-3):
a redone stage removes every file its old run wrote (apply's edited.gguf *and* its manifest); the
records are covered by the entries' sha256, so a hand-edited or malformed state is refused with a
StageError naming the stage, never a traceback; one run per directory, the holder named; nothing
stale: a redone stage removes the run's report files, so a run failing after it leaves no report of
the old state; and random mutations of a state file raise only the project's errors and never
change a returned record."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from exactedit.errors import ExacteditError
from exactedit.runs.loop.stages import StageError, StagedRun, Stages, entry_sha256

STATE = "run.json"


def _state(out: Path) -> dict:
    return json.loads((out / STATE).read_text())


def _write_state(out: Path, state: dict) -> None:
    (out / STATE).write_text(json.dumps(state, indent=1))


# 1. a redone stage removes every file it wrote

def _with_side_file(out: Path, text: str):
    """A stage like apply: writes a.txt and, undeclared, a.txt.side, refusing a side file that exists."""
    def fn():
        if (out / "a.txt.side").exists():
            raise FileExistsError(out / "a.txt.side")
        (out / "a.txt").write_text(text)
        (out / "a.txt.side").write_text(f"describes {text}")
        return {"text": text}
    return fn


def test_a_redone_stage_removes_the_files_it_wrote_beyond_its_declared_outputs(tmp_path):
    out = tmp_path / "run"
    Stages(out, 1, state_file=STATE).run("a", {"x": 1}, ["a.txt"], _with_side_file(out, "one"))
    assert set(_state(out)["stages"]["a"]["outputs"]) == {"a.txt", "a.txt.side"}
    s = Stages(out, 1, state_file=STATE)
    assert s.run("a", {"x": 2}, ["a.txt"], _with_side_file(out, "two")) == {"text": "two"}
    assert s.ran == ["a"] and (out / "a.txt.side").read_text() == "describes two"
    (out / "a.txt.side").write_text("damaged")            # a recorded side file altered: redone, not resumed
    s = Stages(out, 1, state_file=STATE)
    s.run("a", {"x": 2}, ["a.txt"], _with_side_file(out, "two"))
    assert s.ran == ["a"] and (out / "a.txt.side").read_text() == "describes two"


def _bundle(out: Path, model, seed: int) -> dict:
    from exactedit.quant import quantize
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    rng = np.random.default_rng(seed)
    raw = quantize(rng.standard_normal((2, 256)).astype(np.float32), "Q6_K")
    edit = TensorEdit("output.weight", "rows", "Q6_K", (300, 256), raw, np.array([5, 100]))
    write_bundle(out / "wfld", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                 config={"seed": seed}, edits=[edit])
    return {"bundle": str(out / "wfld")}


def _solve_and_apply(out: Path, model, seed: int) -> dict:
    """A staged run's solve (a bundle from `seed`) and its apply stage, the lock released after."""
    r = StagedRun(out, model.path, None, (), None)
    r.start(2, "test", STATE)
    try:
        solved = r.run("solve", {"seed": seed}, ["wfld"], lambda: _bundle(out, model, seed))
        return r.apply_stage(solved["bundle"])
    finally:
        r.close()


@pytest.mark.parametrize("change", ["a new solve", "a damaged edited.gguf"])
def test_apply_redone_rewrites_edited_gguf_and_its_manifest(tmp_path, change):
    """The repro: apply recorded edited.gguf but not its manifest, so a redone apply refused
    "manifest: exists" on every later run."""
    from exactedit.quant.gguf.write import synthetic_model

    model = synthetic_model(tmp_path / "m.gguf", tail="rmsnorm", vocab=300, n=256, h=64)
    out = tmp_path / "run"
    first = _solve_and_apply(out, model, 1)
    if change == "a damaged edited.gguf":
        with open(out / "edited.gguf", "r+b") as fh:
            fh.seek(-1, os.SEEK_END)
            fh.write(b"\xff")
    again = _solve_and_apply(out, model, 2 if change == "a new solve" else 1)
    manifest = json.loads((out / "edited.gguf.manifest.json").read_text())
    assert (again["sha256"] != first["sha256"]) == (change == "a new solve")
    assert again["sha256"] in json.dumps(manifest)
    assert set(_state(out)["stages"]["apply"]["outputs"]) == {"edited.gguf", "edited.gguf.manifest.json"}


# 2. the records are covered by the entries' sha256; a state that does not verify is refused

def _verdict(out: Path):
    def fn():
        (out / "verify.json").write_text('{"passed": false}')
        return {"passed": False, "rows": [1, 2]}
    return fn


def _finished(out: Path) -> dict:
    s = Stages(out, 1, state_file=STATE)
    s.run("verify", {"x": 1}, ["verify.json"], _verdict(out))
    return _state(out)


def _set(path: list, value):
    def edit(state):
        node = state
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
    return edit


def _drop(path: list):
    def edit(state):
        node = state
        for k in path[:-1]:
            node = node[k]
        del node[path[-1]]
    return edit


EDITS = {
    "the verdict flipped": _set(["stages", "verify", "record", "passed"], True),
    "the record removed": _drop(["stages", "verify", "record"]),
    "the record replaced": _set(["stages", "verify", "record"], "passed"),
    "its sha256 removed": _drop(["stages", "verify", "sha256"]),
    "an output's sha256 changed": _set(["stages", "verify", "outputs", "verify.json"], "0" * 64),
    "outputs not an object": _set(["stages", "verify", "outputs"], "verify.json"),
    "the entry not an object": _set(["stages", "verify"], 5),
    "the key not a string": _set(["stages", "verify", "key"], 3),
    "seconds not a number": _set(["stages", "verify", "seconds"], "1 s"),
    "an unknown field": _set(["stages", "verify", "note"], "hi"),
}


@pytest.mark.parametrize("what", sorted(EDITS))
def test_an_edited_entry_is_refused_naming_its_stage(tmp_path, what):
    out = tmp_path / "run"
    state = _finished(out)
    EDITS[what](state)
    _write_state(out, state)
    with pytest.raises(StageError, match="stage 'verify'"):
        Stages(out, 1, state_file=STATE).run("verify", {"x": 1}, ["verify.json"], _verdict(out))


def test_a_record_nested_too_deep_is_refused_not_a_recursion_error(tmp_path):
    out = tmp_path / "run"
    _finished(out)
    text = (out / STATE).read_text().replace('"rows": [', '"rows": ' + "[" * 100_000 + "]" * 99_999 + ", [")
    (out / STATE).write_text(text)
    with pytest.raises(StageError, match="nested too deep"):
        Stages(out, 1, state_file=STATE)


def test_a_forged_entry_naming_a_file_outside_the_run_is_refused_and_nothing_removed(tmp_path):
    """Even with its sha256 recomputed, an entry that would have a redo remove a file outside DIR."""
    out = tmp_path / "run"
    victim = tmp_path / "victim.txt"
    victim.write_text("the user's")
    state = _finished(out)
    for rel in ("../victim.txt", str(victim), "./verify.json", "run.json"):
        entry = state["stages"]["verify"]
        entry["outputs"] = {rel: "0" * 64}
        entry["sha256"] = entry_sha256("verify", entry)
        _write_state(out, state)
        with pytest.raises(StageError, match="stage 'verify'.*not a file inside"):
            Stages(out, 1, state_file=STATE).run("verify", {"x": 2}, ["verify.json"], _verdict(out))
    assert victim.read_text() == "the user's"


def test_a_version_1_state_is_refused_as_an_earlier_runs(tmp_path):
    (tmp_path / STATE).write_text('{"version": 1, "stages": {}}')
    with pytest.raises(StageError, match="earlier exactedit"):
        Stages(tmp_path, 1, state_file=STATE)


def test_returned_records_are_copies(tmp_path):
    """A caller changing a record it was given cannot change what the state holds (and its sha256)."""
    out = tmp_path / "run"
    s = Stages(out, 2, state_file=STATE)
    s.run("verify", {"x": 1}, ["verify.json"], _verdict(out))["passed"] = True
    s.run("b", {}, [], dict)                               # saves the state again
    again = Stages(out, 2, state_file=STATE)
    assert again.run("verify", {"x": 1}, ["verify.json"], _verdict(out))["passed"] is False
    assert again.resumed == ["verify"]


# 3. one run per directory

def _model_file(tmp_path: Path) -> Path:
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF not really a model")
    return path


def test_a_second_run_of_the_same_out_is_refused_naming_the_holder(tmp_path):
    model, out = _model_file(tmp_path), tmp_path / "run"
    first = StagedRun(out, model, None, (), None)
    first.start(1, "exactedit antislop --out first", STATE)
    second = StagedRun(out, model, None, (), None)
    with pytest.raises(StageError, match=rf"pid {os.getpid()}, started .*'exactedit antislop --out first'"):
        second.start(1, "exactedit antislop --out second", STATE)
    first.close()
    with second:
        second.start(1, "exactedit antislop --out second", STATE)
    with pytest.raises(RuntimeError), StagedRun(out, model, None, (), None) as third:
        third.start(1, "third", STATE)
        raise RuntimeError("a run that dies")
    with StagedRun(out, model, None, (), None) as fourth:     # released when the run raised
        fourth.start(1, "fourth", STATE)
    assert not (out / (STATE + ".lock")).exists()


def test_a_live_holder_in_another_process_is_named_and_a_killed_ones_lock_does_not_block(tmp_path):
    out = tmp_path / "run"
    code = ("import sys; from exactedit.runs.loop.stages import Stages; "
            "s = Stages(sys.argv[1], 1, command='holder --out x', state_file='run.json', lock=True); "
            "print('held', flush=True); sys.stdin.read()")
    holder = subprocess.Popen([sys.executable, "-c", code, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(StageError, match=rf"another run .*pid {holder.pid}, .*'holder --out x'"):
            Stages(out, 1, command="mine", state_file=STATE, lock=True)
    finally:
        holder.kill()                                       # SIGKILL: its lock file stays behind
        holder.wait()
    assert (out / (STATE + ".lock")).exists()
    with Stages(out, 1, command="mine", state_file=STATE, lock=True) as s:
        assert s.run("a", {}, [], dict) == {}


def test_a_run_killed_before_its_first_stage_is_still_a_runs_directory(tmp_path):
    """A new directory gets its state at once: a kill before the first stage (the lock file, a file
    the run wrote, left behind) does not make it "not a run's directory"."""
    out = tmp_path / "run"
    Stages(out, 1, state_file=STATE, lock=True)            # never closed: as if killed
    (out / "phrases.txt").write_text("a phrase\n")
    with Stages(out, 1, state_file=STATE, lock=True) as s:
        s.run("a", {}, [], dict)
    only_lock = tmp_path / "fresh"
    only_lock.mkdir()
    (only_lock / (STATE + ".lock")).write_text("")
    Stages(only_lock, 1, state_file=STATE).close()


# 4. nothing stale: a redone stage removes the run's report files

FINALS = ("report.md", "report.json", "chart.png")


def _report(out: Path, says: str) -> None:
    """What a run writes after its last stage, from the records: in no stage's outputs."""
    for name in FINALS:
        (out / name).write_text(f"report of {says}")


def test_a_redone_stage_removes_the_report_so_a_failed_run_leaves_none_of_the_old_state(tmp_path):
    """The repro: a rerun with new rate prompts redid `rates`, then failed in `cost`; report.md and
    report.json still showed the old run's rates and verdict beside the new rates.json."""
    out = tmp_path / "run"

    def stage(name, text, fail=False):
        def fn():
            if fail:
                raise RuntimeError(f"{name} failed")
            (out / f"{name}.txt").write_text(text)
            return {"text": text}
        return fn

    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:
        s.run("a", {"x": 1}, ["a.txt"], stage("a", "one"))
        s.run("b", {"x": 1}, ["b.txt"], stage("b", "one"))
        _report(out, "one")
    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:     # all resumed: the report stands
        s.run("a", {"x": 1}, ["a.txt"], stage("a", "one"))
        s.run("b", {"x": 1}, ["b.txt"], stage("b", "one"))
        assert s.resumed == ["a", "b"] and all((out / f).is_file() for f in FINALS)
    with pytest.raises(RuntimeError, match="b failed"), Stages(out, 2, state_file=STATE, lock=True,
                                                               finals=FINALS) as s:
        s.run("a", {"x": 1}, ["a.txt"], stage("a", "one"))
        assert all((out / f).is_file() for f in FINALS)                    # resumed: nothing removed yet
        s.run("b", {"x": 2}, ["b.txt"], stage("b", "two", fail=True))
    assert not any((out / f).exists() for f in FINALS)
    assert (out / "a.txt").read_text() == "one" and not (out / "b.txt").exists()
    assert set(_state(out)["stages"]) == {"a"}
    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:     # the next run finishes and reports
        s.run("a", {"x": 1}, ["a.txt"], stage("a", "one"))
        s.run("b", {"x": 2}, ["b.txt"], stage("b", "two"))
        _report(out, "two")
    assert s.resumed == ["a"] and s.ran == ["b"]
    assert not any(f in _state(out)["stages"]["b"]["outputs"] for f in FINALS)      # no stage's outputs


def test_a_stage_now_skipped_removes_what_it_wrote_when_it_ran(tmp_path):
    """The repro: a persona run shipped an edit (apply wrote edited.gguf and its manifest, verify
    verify.json); a rerun whose redone solve shipped none skipped apply and verify, and left the
    deleted edit's edited.gguf, manifest and verify.json, and their entries, beside a report of no
    edit. Antislop's corpus stage, turned off by --corpus-tokens 0, left corpus/ the same way."""
    out = tmp_path / "run"

    def solve(says):
        (out / "solve.txt").write_text(says)
        return {"shipped": says}

    def apply():
        (out / "edited.gguf").write_bytes(b"edit one")
        (out / "edited.gguf.manifest.json").write_text("{}")
        (out / "corpus" / "dev").mkdir(parents=True)
        (out / "corpus" / "dev" / "rows.npy").write_bytes(b"rows")
        return {"edited": "edited.gguf"}

    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:
        s.run("solve", {"steps": 300}, ["solve.txt"], lambda: solve("ships"))
        s.run("apply", {}, ["edited.gguf"], apply)
        _report(out, "one edit")
    (out / "keep").mkdir()                                                  # not the stage's: left alone
    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:
        s.run("solve", {"steps": 40}, ["solve.txt"], lambda: solve("none"))
        s.skip("apply")
        assert s.done == 2 and s.ran == ["solve"]
    assert sorted(p.name for p in out.iterdir()) == sorted(["keep", "solve.txt", STATE])
    assert set(_state(out)["stages"]) == {"solve"}
    with Stages(out, 2, state_file=STATE, lock=True, finals=FINALS) as s:    # skipping again: nothing to do
        s.skip("apply")
    assert set(_state(out)["stages"]) == {"solve"}


def test_the_loops_hand_their_report_files_to_the_ledger(tmp_path, monkeypatch):
    """antislop and persona: what write_reports writes is removed when a stage is redone."""
    from exactedit.quant.gguf.write import synthetic_model
    from exactedit.runs.antislop.config import AntislopConfig
    from exactedit.runs.antislop.pipeline import _Run as AntislopRun
    from exactedit.runs.antislop.report import REPORTS as ANTISLOP_REPORTS
    from exactedit.runs.persona.config import PersonaConfig
    from exactedit.runs.persona.pipeline import _Run as PersonaRun
    from exactedit.runs.persona.report import REPORTS as PERSONA_REPORTS
    from tests.cli.test_untrusted_inputs import CHATML, VOCAB

    seen = []

    def start(self, total, command, state_file, finals=()):
        seen.append((state_file, tuple(finals)))
        raise _Started

    class _Started(Exception):
        pass

    monkeypatch.setattr(StagedRun, "start", start)
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * 29, np.int32),
            "tokenizer.chat_template": CHATML}
    model = str(synthetic_model(tmp_path / "m.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path)
    (tmp_path / "phrases.txt").write_text("you can use\n")
    (tmp_path / "prompts.txt").write_text("".join(f"prompt {i}\n" for i in range(8)))
    (tmp_path / "rates.txt").write_text("a held-out prompt\n")
    files = {k: str(tmp_path / f) for k, f in (("prompts", "prompts.txt"), ("rate_prompts", "rates.txt"))}
    with pytest.raises(_Started):
        AntislopRun(AntislopConfig(model=model, phrases=str(tmp_path / "phrases.txt"), **files), tmp_path / "a",
                    None, "test")
    with pytest.raises(_Started):
        PersonaRun(PersonaConfig(model=model, system="Be a pirate.", style="kaomoji", **files), tmp_path / "p",
                   None, "test")
    assert seen == [("antislop.json", ANTISLOP_REPORTS), ("persona.json", PERSONA_REPORTS)]
    assert {"report.md", "report.json"} <= set(ANTISLOP_REPORTS) & set(PERSONA_REPORTS)


# random mutations of a state file: only the project's errors, never a changed record

def _stage_fns(out: Path) -> list:
    def a():
        (out / "a.txt").write_text("A")
        (out / "a.txt.side").write_text("side of A")         # undeclared: recorded all the same
        return {"a": 1, "nested": {"x": [1.5, None, "\u00e9"]}}

    def b():
        (out / "b").mkdir()
        (out / "b" / "f").write_text("B")
        return {"passed": False}

    return [("a", {"x": 1}, ["a.txt"], a), ("b", {"a": "rec"}, ["b"], b), ("c", {}, [], lambda: [1, "two"])]


def _run_all(out: Path) -> dict:
    with Stages(out, 3, state_file=STATE, lock=True) as s:
        return {name: s.run(name, inputs, outputs, fn) for name, inputs, outputs, fn in _stage_fns(out)}


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("template") / "run"
    return out, _run_all(out), (out / STATE).read_bytes()


def _nodes(obj, path=()):
    yield path
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nodes(v, path + (k,))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _nodes(v, path + (i,))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(st.text(max_size=5), kids, max_size=3),
                    max_leaves=8)


OPS = st.tuples(st.sampled_from(["replace", "insert", "cut", "truncate"]), st.integers(0, 2**20),
                st.binary(min_size=1, max_size=4))
MUTATIONS = (st.tuples(st.just("bytes"), st.lists(OPS, min_size=1, max_size=4))
             | st.tuples(st.just("json"), st.integers(0, 2**20), st.booleans(), JSON))


def mutate(state: bytes, mutation: tuple) -> bytes:
    """The state's bytes changed by `mutation`: ("bytes", ops) replaces, inserts or cuts bytes at
    offsets (modulo the length); ("json", n, drop, value) removes, or replaces by `value`, the n-th
    value of the parsed state (modulo their count); ("raw", data) is `data` whole."""
    kind, *args = mutation
    if kind == "raw":
        return args[0]
    if kind == "bytes":
        data = bytearray(state)
        for op, at, payload in args[0]:
            at %= len(data) + 1
            if op == "truncate":
                del data[at:]
            elif op == "cut":
                del data[at:at + len(payload)]
            else:
                data[at:at + (op == "replace")] = payload
        return bytes(data)
    n, drop, value = args
    obj = json.loads(state)
    paths = [p for p in _nodes(obj) if p]
    path = paths[n % len(paths)]
    parent = obj
    for k in path[:-1]:
        parent = parent[k]
    if drop:
        del parent[path[-1]]
    else:
        parent[path[-1]] = value
    return json.dumps(obj, indent=1).encode()


@settings(max_examples=150, deadline=None)
@given(mutation=MUTATIONS)
@example(mutation=("raw", b'{"version": 2, "stages": {"a": ' + b"[" * 50_000 + b"]" * 50_000 + b"}}"))
@example(mutation=("raw", b'{"version": 1, "stages": {}}'))
@example(mutation=("raw", b'{"version": true, "stages": {}}'))
@example(mutation=("raw", b'{"version": 2, "stages": {"a": {"outputs": "x"}}}'))
@example(mutation=("json", 0, True, None))
def test_a_mutated_state_raises_only_our_errors_and_never_changes_a_record(finished_run, mutation):
    template, records, state = finished_run
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run"
        shutil.copytree(template, out)
        (out / STATE).write_bytes(mutate(state, mutation))
        try:
            again = _run_all(out)
        except ExacteditError:
            return
        assert again == records
        assert (out / "a.txt").read_text() == "A" and (out / "b" / "f").read_text() == "B"
