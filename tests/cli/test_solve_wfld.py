"""`exactedit solve wfld` wiring: flags -> WfldConfig, a bundle on the fixture, clean errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from exactedit.cli import main

F = Path(__file__).resolve().parents[2] / "fixtures" / "default"
pytestmark = pytest.mark.skipif(not (F / "model.gguf").is_file(), reason="the bundled fixture is not built yet")


def _args(out, *extra):
    d = F / "dumps"
    return ["solve", "wfld", "--model", str(F / "model.gguf"), "--phrases", str(F / "phrases.txt"),
            "--train", str(d / "train"), "--heldout", str(d / "test"), "--collateral", str(d / "collateral"),
            "--anchors", str(d / "anchors"), "--out", str(out), *extra]


def test_solve_wfld_json(tmp_path):
    r = CliRunner().invoke(main, _args(tmp_path / "b", "--json", "--gn-iters", "2",
                                       "--phrase-margin", "right away=0.8"))
    assert r.exit_code == 0, r.output
    obj = json.loads(r.stdout)
    assert obj["config"]["gn_iters"] == 2 and obj["config"]["phrase_margins"] == [["right away", 0.8]]
    assert {"name", "value", "threshold", "pass"} <= set(obj["bars"][0])
    assert (Path(obj["bundle"]["path"]) / "manifest.json").is_file()
    assert json.loads((tmp_path / "b" / "report.json").read_text())["verdict"] == obj["verdict"]


@pytest.mark.parametrize("extra,message", [
    (("--delta-cho", "0"), "delta_cho must be > 0"),
    (("--phrase-margin", "right away"), "PHRASE=NATS"),
    (("--phrase-margin", "no such phrase=1"), "phrase_margins"),
    (("--special", "<nope>", "--turn-end", "<nope>"), "not special tokens"),
])
def test_solve_wfld_errors_are_one_line(tmp_path, extra, message):
    r = CliRunner().invoke(main, _args(tmp_path / "b", *extra))
    assert r.exit_code != 0 and message in r.output and "Traceback" not in r.output
