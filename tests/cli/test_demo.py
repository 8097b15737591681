"""`exactedit demo` on the bundled fixture: both bundles, the wfld bars, the one-shot blind
sign-off, and its command line in DIR/blind.cmd refused on a second run."""
from __future__ import annotations

import json
import shlex

import pytest
from click.testing import CliRunner

from exactedit import cli


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    out = tmp_path_factory.mktemp("demo") / "out"
    r = CliRunner().invoke(cli.main, ["demo", "--out", str(out)])
    assert r.exit_code == 0, r.output
    return out, r.output


def test_demo_leaves_both_bundles_and_the_bars(demo):
    out, text = demo
    head = json.loads((out / "head" / "manifest.json").read_text())
    wfld = json.loads((out / "wfld" / "manifest.json").read_text())
    assert head and wfld
    report = json.loads((out / "wfld" / "report.json").read_text())
    assert report["bars"], "the wfld report lists its bars"
    for bar in report["bars"]:
        assert {"name", "value", "threshold", "pass"} <= set(bar)
    assert "SIGN-OFF:" in text and "== solve wfld" in text


def test_blind_command_is_recorded_and_a_rerun_is_refused(demo):
    out, _ = demo
    args = shlex.split((out / "blind.cmd").read_text())
    assert args[:3] == ["exactedit", "eval", "blind"]
    assert (out / "blind" / "signoff.json").exists()
    r = CliRunner().invoke(cli.main, args[1:])
    assert r.exit_code != 0
    assert "already had its blind run" in r.output


def test_demo_refuses_a_non_empty_output(demo):
    out, _ = demo
    r = CliRunner().invoke(cli.main, ["demo", "--out", str(out)])
    assert r.exit_code != 0 and "not empty" in r.output


def test_every_output_anchors_the_ledger(demo):
    """Both bundles, the dev report and the sign-off record the ledger head; all are backed."""
    out, _ = demo
    for b in ("head", "wfld"):
        assert json.loads((out / b / "manifest.json").read_text())["ledger_head"]["seq"] > 0
    r = CliRunner().invoke(cli.main, ["eval", "ledger", "--verify", "--against", str(out),
                                      "--workspace", str(out / "ws"), "--json"])
    assert r.exit_code == 0, r.output
    v = json.loads(r.output)
    assert v["ok"] and {"bundle", "dev report", "sign-off"} <= {a["what"] for a in v["anchors"]}


@pytest.mark.parametrize("args, says", [
    (["--persona"], "--persona needs --model"),
    (["--persona", "--model", "qwen", "--phrases", __file__], "--phrases: the anti-slop loop's options do not apply"),
])
def test_demo_persona_refuses_what_it_cannot_use(tmp_path, args, says):
    r = CliRunner().invoke(cli.main, ["demo", "--out", str(tmp_path / "o"), *args])
    assert r.exit_code == 2 and says in r.output
    assert not (tmp_path / "o").exists()


def test_persona_refuses_both_system_flags(tmp_path):
    (tmp_path / "s.txt").write_text("Be a pirate.")
    (tmp_path / "p.txt").write_text("a\n")
    r = CliRunner().invoke(cli.main, ["persona", "--model", str(tmp_path / "s.txt"), "--system", "x", "--system-file",
                                      str(tmp_path / "s.txt"), "--style", "kaomoji", "--prompts", str(tmp_path / "p.txt"),
                                      "--rate-prompts", str(tmp_path / "p.txt"), "--out", str(tmp_path / "o")])
    assert r.exit_code == 2 and "--system or --system-file, not both" in r.output
