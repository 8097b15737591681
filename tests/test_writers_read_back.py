"""A run never writes a file its own reader would refuse (issue 38): each writer checks the cap its
reader bounds the file by, and refuses (naming the file and the field) before anything is written,
so that what is on disk is the last file that reads back. Caps are lowered here so that the files
stay small; on the old code each writer wrote the file and only the next reader refused it.

    writer                          reader (cap)
    runs/loop/stages Stages._save   read_state (MAX_STATE_BYTES)
    evals/scoring write_report      read_report (MAX_REPORT_BYTES)
    solvers/shaping write_compiled  read_compiled (MAX_BYTES, MAX_VOCAB)
    dumps write_dump                load_manifest (MANIFEST_MAX_BYTES)
    dumps write_tokens              read_tokens (MAX_TOKENS)
    evals/protocol write_protocol   load_protocol (UTF-8 TOML: a path of non-UTF-8 bytes)
"""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from exactedit.dumps import DocInfo, DumpFormatError, read_dump, write_dump


# ---- the stage ledger's state file ---------------------------------------------------------------
def test_a_state_the_ledger_would_refuse_is_not_written_and_the_stage_is_redone(tmp_path, monkeypatch):
    from exactedit.runs.loop import stages
    from exactedit.runs.loop.stages import StageError, Stages, read_state

    monkeypatch.setattr(stages, "MAX_STATE_BYTES", 4000)
    out = tmp_path / "run"
    with Stages(out, 2, state_file="s.json") as s:
        s.run("small", {"x": 1}, [], lambda: {"n": 1})
        with pytest.raises(StageError, match=r"s\.json: \d+ bytes with stage 'big''s entry, over the 4000"):
            s.run("big", {"x": 2}, [], lambda: {"words": ["word"] * 1000})
        assert set(s.state["stages"]) == {"small"}
    state = read_state(out / "s.json", {"s.json"})          # what is on disk still reads back
    assert set(state["stages"]) == {"small"}
    monkeypatch.setattr(stages, "MAX_STATE_BYTES", 64 << 20)
    with Stages(out, 2, state_file="s.json") as s:          # the next run redoes the stage and keeps it
        s.run("small", {"x": 1}, [], lambda: {"n": 1})
        s.run("big", {"x": 2}, [], lambda: {"words": ["word"] * 1000})
        assert s.resumed == ["small"] and s.ran == ["big"]


# ---- a bar report ----------------------------------------------------------------------------------
def test_a_report_read_report_would_refuse_is_not_written(tmp_path, monkeypatch):
    from exactedit.evals.scoring import report as module
    from exactedit.evals.scoring.bars import BarRow
    from exactedit.evals.scoring.report import BarReport, ReportError, read_report, write_report

    rows = tuple(BarRow(f"k{i}", "c", "a bar", 0.5, 0.5, ">=", True, 3) for i in range(40))
    monkeypatch.setattr(module, "MAX_REPORT_BYTES", 2000)
    with pytest.raises(ReportError, match=r"dev-report\.json: file: \d+ bytes, over the limit of 2000"):
        write_report(BarReport("score", "dev", rows, "pass"), tmp_path, "dev-report", png=False)
    assert os.listdir(tmp_path) == []
    written = write_report(BarReport("score", "dev", rows[:2], "pass"), tmp_path, "dev-report", png=False)
    assert read_report(written.paths["json"])[0].rows == rows[:2]


# ---- compiled shaping rules ------------------------------------------------------------------------
def test_compiled_rules_read_compiled_would_refuse_are_not_written(tmp_path, monkeypatch):
    from exactedit.solvers.shaping import compiled as module
    from exactedit.solvers.shaping.compiled import ShapingRulesError, read_compiled, write_compiled
    from tests.shaping_world import compiled

    rules = compiled(tmp_path)
    size = len(json.dumps(rules.to_dict(), separators=(",", ":"))) + 1
    monkeypatch.setattr(module, "MAX_BYTES", size - 1)
    with pytest.raises(ShapingRulesError, match=rf"r\.json: file: {size} bytes; compiled rules are at most {size - 1}"):
        write_compiled(rules, tmp_path / "r.json")
    assert not (tmp_path / "r.json").exists()
    monkeypatch.setattr(module, "MAX_BYTES", size)
    monkeypatch.setattr(module, "MAX_VOCAB", rules.vocab.size - 1)
    with pytest.raises(ShapingRulesError, match=rf"r\.json: model\.vocab: expected 1\.\.{rules.vocab.size - 1}"):
        write_compiled(rules, tmp_path / "r.json")
    monkeypatch.setattr(module, "MAX_VOCAB", rules.vocab.size)
    write_compiled(rules, tmp_path / "r.json")
    assert read_compiled(tmp_path / "r.json").to_dict() == rules.to_dict()


# ---- a dump's manifest -----------------------------------------------------------------------------
def _dump(path, docs: int):
    T = 2 * docs
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50, T)
    fields = {"tokens": tokens, "next": np.r_[tokens[1:], -1], "R": rng.normal(size=(T, 8)),
              "hh": rng.normal(size=(T, 6))}
    return write_dump(path, arch="rmsnorm", layer=3, fields=fields, meta={},
                      docs=[DocInfo(f"doc-{i}", 2 * i, 2, "src", "c", ("chat",)) for i in range(docs)])


def test_a_dump_manifest_the_reader_would_refuse_is_not_written(tmp_path, monkeypatch):
    """Many documents: each is an entry of the manifest (a corpus or a dataset of many windows)."""
    from exactedit.dumps import reader, writer

    _dump(tmp_path / "small", 2)
    size = (tmp_path / "small" / "manifest.json").stat().st_size
    for module in (reader, writer):
        monkeypatch.setattr(module, "MANIFEST_MAX_BYTES", size + 100, raising=False)
    with pytest.raises(DumpFormatError, match=r"big: manifest\.json: \d+ bytes \(40 documents\), over the limit"):
        _dump(tmp_path / "big", 40)
    assert sorted(os.listdir(tmp_path)) == ["small"]
    assert read_dump(tmp_path / "small").rows == 4


def test_a_tokens_file_read_tokens_would_refuse_is_not_written(tmp_path, monkeypatch):
    from exactedit.dumps import contract
    from exactedit.dumps.contract import StrataError, read_tokens, write_tokens

    monkeypatch.setattr(contract, "MAX_TOKENS", 8)
    with pytest.raises(StrataError, match=r"t\.bin: tokens: 9 ids, over the limit of 8"):
        write_tokens(tmp_path / "t.bin", np.arange(9))
    assert not (tmp_path / "t.bin").exists()
    write_tokens(tmp_path / "t.bin", np.arange(8))
    assert read_tokens(tmp_path / "t.bin").tolist() == list(range(8))


# ---- a protocol naming a path that is not UTF-8 ----------------------------------------------------
def test_a_protocol_no_toml_holds_is_refused_naming_the_line(tmp_path):
    """A run's --out of bytes that are not UTF-8 reached the protocol as a lone surrogate: a
    UnicodeEncodeError traceback at the solve stage, after the generation."""
    from pathlib import Path

    from exactedit.evals.protocol.protocol import ProtocolError, Trace, write_protocol

    with pytest.raises(ProtocolError, match=r"p\.toml: file: line \d+ holds a lone surrogate \('\\udcff'\)"):
        write_protocol(tmp_path / "p.toml", "x", [Trace("train", Path("/tmp/a\udcffb/train"), "train")])
    assert not (tmp_path / "p.toml").exists()


def test_discover_refuses_to_write_a_json_phrases_would_not_read_back(tmp_path, monkeypatch):
    from exactedit.evals.discover.report import write_discovery
    from exactedit.solvers import phrases as ph

    monkeypatch.setattr(ph, "MAX_PHRASES_FILE", 200)
    big = {"phrases": [{"phrase": f"phrase {k}"} for k in range(40)]}
    with pytest.raises(ph.PhraseError, match="--top"):
        write_discovery(big, tmp_path / "found.json")
    assert not (tmp_path / "found.json").exists() and not list(tmp_path.iterdir())
    small = {"phrases": [{"phrase": "you can use"}]}
    assert ph.load_phrases(write_discovery(small, tmp_path / "ok.json")) == ("you can use",)
