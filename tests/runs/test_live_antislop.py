"""`exactedit antislop` end to end on a GGUF given as a path, with no bundled data: SmolLM2-135M
(its last ffn_down is Q4_1), tiny sizes so that it fits CI. The user's files are written here:
prompts, held-out rate prompts, a phrase list. What must hold at any size: edited.gguf and
rules.json shipped side by side, the edit verified live bitwise, the rates in four arms on the
same prompts and seeds, the cost on ordinary text, and the run resumable: the same command again
redoes nothing and reports the same, a changed setting redoes only the stages that read it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import oracles
from tests.runs.demo_checks import check_four_arms, check_verifies_live_bitwise, checked_report

pytestmark = [pytest.mark.live, pytest.mark.slow]

PROMPTS = ["Explain what a variable is in programming.", "How do I make a cup of tea?", "What is photosynthesis?",
           "Give me tips for learning a new language.", "Why is the sky blue?", "How do I sort a list in Python?",
           "What are the benefits of regular exercise?", "Describe how a bicycle works.",
           "What is the difference between weather and climate?", "How can I save money each month?",
           "Explain what a function is in mathematics.", "What should I pack for a weekend trip?",
           "How do vaccines work?", "What is a good way to start writing a story?",
           "Explain how a computer stores numbers.", "What makes a good team leader?"]
RATE_PROMPTS = ["What are some healthy breakfast ideas?", "How does a refrigerator keep food cold?",
                "Explain what a loop is in programming.", "What are good habits for studying?"]
PHRASES = ["such as", "Here are some", "can be"]


def _args(d, out, *extra):
    return ["antislop", "--model", str(d / "model.gguf"), "--prompts", str(d / "prompts.txt"),
            "--rate-prompts", str(d / "rates.txt"), "--phrases", str(d / "phrases.txt"), "--samples", "1",
            "--rate-samples", "1", "--max-new", "64", "--corpus-tokens", "600", "--out", str(out), "--json", *extra]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    oracles.live_model("smollm")   # missing extra: a skip, or a failure in CI (tests/oracles.py)
    from click.testing import CliRunner

    from exactedit.cli import main
    from exactedit.native.llamacpp.models import locate
    from exactedit.runs.antislop.pipeline import AntislopResult

    d = tmp_path_factory.mktemp("antislop")
    (d / "model.gguf").symlink_to(locate("smollm"))          # a path, not a public name
    (d / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    (d / "rates.txt").write_text("\n".join(RATE_PROMPTS) + "\n")
    (d / "phrases.txt").write_text("# the user's list\n" + "\n".join(PHRASES) + "\n")
    res = CliRunner().invoke(main, _args(d, d / "out"), catch_exceptions=False)
    assert res.exit_code == 0, res.output
    report = json.loads((d / "out" / "report.json").read_text())
    state = json.loads((d / "out" / "antislop.json").read_text())
    result = AntislopResult(d / "out", str(d / "model.gguf"), {k: v["record"] for k, v in state["stages"].items()},
                            report, "", {k: Path(v) for k, v in report["files"].items()})
    return d, result, res.output


def test_ships_weights_and_rules_side_by_side_verified_bitwise(run):
    d, result, _ = run
    check_verifies_live_bitwise(result)
    report = checked_report(result)
    assert (d / "out" / "edited.gguf").stat().st_size == (d / "model.gguf").stat().st_size
    rules = json.loads((d / "out" / "rules.json").read_text())
    assert [p["text"] for r in rules["rules"] if r["kind"] == "prefix-penalty" for p in r["phrases"]] == PHRASES
    assert report["preflight"]["edited_type"] == "Q4_1" and report["preflight"]["template"] == "gguf"
    assert report["stages"]["resumed"] == [] and len(report["stages"]["ran"]) == 8


def test_rates_in_four_arms_and_the_cost(run):
    _, result, _ = run
    check_four_arms(result, PHRASES, len(RATE_PROMPTS))
    md = result.files["md"].read_text()
    assert "## cost on ordinary text" in md and "MATTR" in md and "weights + rules" in md


def test_the_same_command_resumes_everything_and_a_new_setting_redoes_what_reads_it(run):
    from click.testing import CliRunner

    from exactedit.cli import main

    d, result, first = run
    again = CliRunner().invoke(main, _args(d, d / "out"), catch_exceptions=False)
    assert again.exit_code == 0, again.output
    report = json.loads((d / "out" / "report.json").read_text())
    assert report["stages"]["ran"] == [] and len(report["stages"]["resumed"]) == 8
    assert report["arms"] == result.report["arms"] and report["shipped"] == result.report["shipped"]
    bias = CliRunner().invoke(main, _args(d, d / "out", "--rules-bias", "3"), catch_exceptions=False)
    assert bias.exit_code == 0, bias.output
    report = json.loads((d / "out" / "report.json").read_text())
    assert report["stages"]["ran"] == ["rules", "rates", "cost"]
    assert report["shipped"]["edited.gguf"] == result.report["shipped"]["edited.gguf"]
    assert report["shipped"]["rules.json"] != result.report["shipped"]["rules.json"]


def test_what_it_cannot_do_is_refused_before_any_generation(run, tmp_path):
    from click.testing import CliRunner

    from exactedit.cli import main

    d, _, _ = run
    (tmp_path / "phrases.txt").write_text("such as\ntruly a kaleidoscope\n")
    args = _args(d, tmp_path / "out")
    args[args.index("--phrases") + 1] = str(tmp_path / "phrases.txt")
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0 and "kaleidoscope" in res.output, res.output
    assert not (tmp_path / "out" / "data").exists()               # refused before the data stage
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("the user's")
    res = CliRunner().invoke(main, _args(d, tmp_path / "taken"))
    assert res.exit_code != 0 and "not a run's directory" in res.output, res.output
    assert (tmp_path / "taken" / "notes.txt").read_text() == "the user's"
