"""`exactedit shape export`: each format through the command line, its JSON report, and the clean
refusals (an output that is the rules file, a bad flag, the grammar's cap, rules of another format)."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.solvers.shaping.compiled import write_compiled
from tests.shaping_world import compiled


@pytest.fixture(scope="module")
def rules(tmp_path_factory):
    d = tmp_path_factory.mktemp("cli-export")
    write_compiled(compiled(d), d / "rules.json")
    return d / "rules.json"


def _run(*args):
    return CliRunner().invoke(main, ["shape", "export", *map(str, args)])


@pytest.mark.parametrize("fmt, name, first", [
    ("vllm", "v.json", '{\n "bad_words": [\n  "you can use",'),
    ("hf", "h.json", '{"sequence_bias": [[['),
    ("banned-strings", "b.txt", "you can use\n"),
    ("gbnf", "g.gbnf", "# exactedit shape export --format gbnf"),
])
def test_each_format_writes_and_reports(rules, tmp_path, fmt, name, first):
    res = _run("--rules", rules, "--format", fmt, "--out", tmp_path / name, "--json")
    assert res.exit_code == 0, res.output
    report = json.loads(res.stdout)
    assert report["format"] == fmt and report["phrases"] == 3
    assert report["not_exported"] == ["step0-guard", "persona-case"]
    assert (tmp_path / name).read_text().startswith(first)
    assert report["bytes"] == (tmp_path / name).stat().st_size
    text = _run("--rules", rules, "--format", fmt, "--out", tmp_path / name)
    assert text.exit_code == 0 and "lost against the rule" in text.output


def test_refusals_are_one_clean_line(rules, tmp_path):
    before = rules.read_bytes()
    res = _run("--rules", rules, "--format", "vllm", "--out", rules)
    assert res.exit_code == 1 and "refusing to overwrite an input" in res.output and rules.read_bytes() == before
    res = _run("--rules", rules, "--format", "gbnf", "--out", tmp_path / "g.gbnf", "--max-states", "2")
    assert res.exit_code == 1 and "raise --max-states" in res.output and not (tmp_path / "g.gbnf").exists()
    res = _run("--rules", rules, "--format", "ollama", "--out", tmp_path / "x")
    assert res.exit_code == 2 and "ollama" in res.output
    (tmp_path / "toml.json").write_text("[prefix-penalty]\nphrases = ['you can use']\n")
    res = _run("--rules", tmp_path / "toml.json", "--format", "vllm", "--out", tmp_path / "v.json")
    assert res.exit_code == 1 and "not valid JSON" in res.output and "Traceback" not in res.output


def test_list_flag_overrides_the_suffix(rules, tmp_path):
    res = _run("--rules", rules, "--format", "banned-strings", "--list", "json", "--out", tmp_path / "b.txt")
    assert res.exit_code == 0 and json.loads((tmp_path / "b.txt").read_text()) == ["you can use", "end to end",
                                                                                   "rather than"]
