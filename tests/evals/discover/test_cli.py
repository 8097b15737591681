"""exactedit discover through click: the table printed, the JSON file (and --json) of the documented
shape, the PNG, the --sides filter, inputs refused as outputs, and bad inputs as one clean error."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.evals.discover.ranking import discover
from exactedit.evals.discover.report import plot_discovery, render_discovery
from tests.evals.discover.synth import corpus

SLOP = {"delve into": 0.05, "it's worth noting that": 0.04}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("discover")
    model, _ = corpus(21, 240, SLOP)
    human, _ = corpus(22, 120)
    replies = [{"side": "base" if i % 2 else "edited", "name": f"p{i}", "prompt": "q", "text": t}
               for i, t in enumerate(model)]
    (root / "replies.json").write_text(json.dumps(replies))
    (root / "mine").mkdir()
    for i, t in enumerate(human):
        (root / "mine" / f"{i:03d}.md").write_text(t)
    return root


def run(*args):
    return CliRunner().invoke(main, ["discover", *map(str, args)])


def test_table_json_file_and_png(inputs, tmp_path):
    out, png = tmp_path / "found.json", tmp_path / "found.png"
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", out, "--png", png,
              "--top", 5)
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert lines[0].startswith("model text: 240 texts") and "human text: 120 texts" in lines[0]
    head = next(i for i, line in enumerate(lines) if line.lstrip().startswith("#"))
    assert lines[head].split() == ["#", "phrase", "kind", "evidence", "excess", "score", "z", "log-odds", "xen>=",
                                   "model", "/1k", "human", "/1k", "prompts", "D", "func", "sources"]
    cells = {line[3:].split("  ")[0].strip() for line in lines[head + 1:]}
    assert {"'delve into'", "\"it's worth noting that\""} <= cells
    assert f"wrote {out} and {png}" in res.stdout
    data = json.loads(out.read_text())
    assert set(data) >= {"phrases", "model", "human", "settings", "notes"} and len(data["phrases"]) <= 5
    assert {p["kind"] for p in data["phrases"]} <= {"style", "mixed", "topic"}
    assert {p["evidence"] for p in data["phrases"]} <= {"both", "user", "language"}
    assert data["model"]["sources"] == {"replies.json:edited": 120, "replies.json:base": 120}
    assert data["settings"]["top"] == 5 and data["settings"]["background"] == "wordfreq"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob("*.tmp"))


def test_json_flag_and_sides(inputs, tmp_path):
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", tmp_path / "o.json",
              "--sides", "base", "--background", "human", "--min-count", 4, "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data == json.loads((tmp_path / "o.json").read_text())
    assert data["model"]["texts"] == 120 and data["model"]["sources"] == {"replies.json:base": 120}
    assert all(set(p["sources"]) == {"replies.json:base"} for p in data["phrases"])
    assert data["settings"]["background"] == "human" and data["settings"]["min_count"] == 4


def test_refuses_to_write_over_an_input(inputs):
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", inputs / "replies.json")
    assert res.exit_code == 1 and "refusing to overwrite an input" in res.output
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", inputs / "x.json",
              "--png", inputs / "mine" / "chart.png")
    assert res.exit_code == 1 and "inside the --human input directory" in res.output
    assert not (inputs / "mine" / "chart.png").exists()


def test_bad_inputs_are_one_clean_error(inputs, tmp_path):
    bad = tmp_path / "chat.jsonl"
    bad.write_text('{"role": "assistant", "content": "fine"}\n{oops\n')
    res = run("--model-text", bad, "--human", inputs / "mine", "--out", tmp_path / "o.json")
    assert res.exit_code == 1 and f"{bad}: line 2: not valid JSON" in res.output and "Traceback" not in res.output
    res = run("--model-text", inputs / "replies.json", "--out", tmp_path / "o.json")
    assert res.exit_code == 2 and "--human" in res.output
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", tmp_path / "o.json",
              "--sides", ",")
    assert res.exit_code == 2 and "--sides" in res.output
    assert not (tmp_path / "o.json").exists()


def test_render_and_plot_an_empty_result(tmp_path):
    d = discover(corpus(23, 40)[0], corpus(24, 40)[0], min_count=1000)
    assert "no phrase is over-used at these settings" in render_discovery(d)
    assert plot_discovery(d, tmp_path / "empty.png").read_bytes()[:4] == b"\x89PNG"


def test_lang_flag_and_a_language_wordfreq_lacks(inputs, tmp_path):
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", tmp_path / "o.json",
              "--lang", "xx")
    assert res.exit_code == 2 and "wordfreq has no word list for language 'xx'" in res.output
    assert not (tmp_path / "o.json").exists()
    res = run("--model-text", inputs / "replies.json", "--human", inputs / "mine", "--out", tmp_path / "o.json",
              "--lang", "fr", "--min-ratio", 50, "--confidence", 0.99, "--json")
    assert res.exit_code == 0, res.output
    settings = json.loads(res.stdout)["settings"]
    assert (settings["lang"], settings["min_ratio"], settings["confidence"]) == ("fr", 50.0, 0.99)


@pytest.mark.parametrize("command", [["shape", "compile"], ["mine", "--prompts", "P"], ["dataset", "corpus"]])
def test_kind_picks_the_entries_phrase_lists_take(command, tmp_path):
    """--phrases found.json takes its style entries unless --kind says otherwise: a list of topic
    entries alone is refused by default (before the model is opened) and read with --kind topic (the
    run then stops at the junk model); an unknown kind is a usage error."""
    found, model, prompts = tmp_path / "found.json", tmp_path / "m.gguf", tmp_path / "p.txt"
    found.write_text(json.dumps({"phrases": [{"phrase": "in Python", "kind": "topic"}]}))
    model.write_bytes(b"junk")
    prompts.write_text("How do I sort a list?\n")
    args = [str(prompts) if a == "P" else a for a in command] + ["--model", str(model), "--phrases", str(found),
                                                               "--out", str(tmp_path / "out")]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 1 and "no usable phrase of kind style" in res.output, res.output
    res = CliRunner().invoke(main, args + ["--kind", "topic"])
    assert res.exit_code == 1 and "no usable phrase" not in res.output and "m.gguf" in res.output, res.output
    res = CliRunner().invoke(main, args + ["--kind", "subject"])
    assert res.exit_code == 2 and "Invalid value for '--kind'" in res.output
