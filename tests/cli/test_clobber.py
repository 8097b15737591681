"""No command writes over its own inputs: an output that is an input file (by path, symlink
or hard link), lies inside an input dump or bundle, or (for an output replaced whole) is a directory
holding an input, is refused in one clean line naming both, before anything is written, with or
without --overwrite; every file of the inputs keeps its bytes. --overwrite still replaces a previous
output."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from tests.cli.io_world import T, V, make_inputs


@pytest.fixture
def world(tmp_path):
    from exactedit.evals.protocol.ledger import Ledger

    root = tmp_path / "w"
    root.mkdir()
    make_inputs(root)
    for name in ("text.txt", "prompts.txt", "phrases.txt", "rules.toml", "protocol.toml", "report.json"):
        (root / name).write_text(f"{name}\n")
    (root / "tokens.bin").write_bytes(np.arange(4, dtype="<i4").tobytes())
    (root / "texts").mkdir()
    (root / "texts" / "a.txt").write_text("a text\n")
    with Ledger.open(root / "ws") as led:
        led.append("note", "test", {}, {})
    return root


def _snapshot(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and not p.is_symlink()}


# (command line with {w} for the world's directory, the output the message names, the input it names)
CASES = {
    "logits --out MODEL": ("logits --model {w}/m.gguf --dump {w}/d --out {w}/m.gguf", "{w}/m.gguf", "model input"),
    "logits --out DUMP/field": ("logits --model {w}/m.gguf --dump {w}/d --out {w}/d/R.npy", "{w}/d/R.npy", "{w}/d"),
    "logits --out DUMP/manifest": ("logits --model {w}/m.gguf --dump {w}/d --out {w}/d/manifest.json",
                                   "{w}/d/manifest.json", "{w}/d"),
    "logits --out symlink to MODEL": ("logits --model {w}/m.gguf --dump {w}/d --out {w}/sym.gguf", "{w}/sym.gguf",
                                      "{w}/m.gguf"),
    "logits --out hard link of MODEL": ("logits --model {w}/m.gguf --dump {w}/d --out {w}/hard.gguf",
                                        "{w}/hard.gguf", "{w}/m.gguf"),
    "kld --write-base MODEL": ("kld --model {w}/m.gguf --dump {w}/d --write-base {w}/m.gguf", "{w}/m.gguf", "--model"),
    "kld --rows-out DUMP/field": ("kld --model {w}/m.gguf --edited {w}/hard.gguf --dump {w}/d --rows-out {w}/d/R.npy",
                                  "{w}/d/R.npy", "{w}/d"),
    "kld --rows-out EDITED": ("kld --model {w}/m.gguf --edited {w}/e.gguf --dump {w}/d --rows-out {w}/e.gguf",
                              "{w}/e.gguf", "--edited"),
    "kld --write-base = --rows-out": ("kld --model {w}/m.gguf --dump {w}/d --write-base {w}/x --rows-out {w}/x",
                                      "{w}/x", "--rows-out"),
    "apply --out BUNDLE/manifest.json --overwrite": (
        "apply {w}/b --model {w}/m.gguf --out {w}/b/manifest.json --overwrite", "{w}/b/manifest.json", "{w}/b"),
    "apply --out MODEL --overwrite": ("apply {w}/b --model {w}/m.gguf --out {w}/m.gguf --overwrite", "{w}/m.gguf",
                                      "model input"),
    "apply --out hard link of MODEL --overwrite": ("apply {w}/b --model {w}/m.gguf --out {w}/hard.gguf --overwrite",
                                                   "{w}/hard.gguf", "{w}/m.gguf"),
    "untie --out MODEL": ("untie --model {w}/m.gguf --out {w}/m.gguf --overwrite", "{w}/m.gguf", "--model"),
    "dump import --out inside SOURCE": ("dump import {w}/d --out {w}/d/v1 --overwrite", "{w}/d/v1", "SOURCE"),
    "engine dump --out holding TEXT": (
        "engine dump --model {w}/m.gguf --text {w}/texts/a.txt --out {w}/texts --overwrite", "{w}/texts", "--text"),
    "engine dump --out holding MODEL": ("engine dump --model {w}/m.gguf --text {w}/text.txt --out {w} --overwrite",
                                        "{w}", "holds"),
    "engine perplexity-chunks --out holding TEXT": (
        "engine perplexity-chunks --model {w}/m.gguf --text {w}/texts/a.txt --out {w}/texts --overwrite",
        "{w}/texts", "--text"),
    "engine run --logits-out MODEL": (
        "engine run --metal-gguf {w}/m.gguf --tokens-file {w}/tokens.bin --logits-out {w}/m.gguf", "{w}/m.gguf",
        "--metal-gguf"),
    "shape compile --out RULES": ("shape compile {w}/rules.toml --model {w}/m.gguf --out {w}/rules.toml",
                                  "{w}/rules.toml", "RULES"),
    "solve head --out DUMP --overwrite": (
        "solve head --model {w}/m.gguf --train {w}/d --dev {w}/d --protocol {w}/protocol.toml --out {w}/d "
        "--overwrite --workspace {w}/ws", "{w}/d", "--train"),
    "solve wfld --out inside DUMP --overwrite": (
        "solve wfld --model {w}/m.gguf --phrases {w}/phrases.txt --train {w}/d --anchors {w}/d --out {w}/d/b "
        "--overwrite", "{w}/d/b", "--train"),
    "demo --out FIXTURE": ("demo --fixture {w}/d --out {w}/d", "{w}/d", "--fixture"),
    "mine --out holding PROMPTS": ("mine --model {w}/m.gguf --prompts {w}/prompts.txt --phrases {w}/phrases.txt "
                                   "--out {w} --overwrite", "{w}", "holds"),
    "mine --png PROMPTS": ("mine --model {w}/m.gguf --prompts {w}/prompts.txt --phrases {w}/phrases.txt "
                           "--png {w}/prompts.txt", "{w}/prompts.txt", "--prompts"),
    "dataset build --out TEXTS": ("dataset build --model {w}/m.gguf --prompts {w}/prompts.txt --phrases "
                                  "{w}/phrases.txt --texts {w}/texts --out {w}/texts --overwrite", "{w}/texts", "--texts"),
    "dataset corpus --out holding TEXT": ("dataset corpus --model {w}/m.gguf --phrases {w}/phrases.txt --texts "
                                          "{w}/texts/a.txt --out {w}/texts --overwrite", "{w}/texts", "--texts"),
    "eval score --out BUNDLE": ("eval score --protocol {w}/protocol.toml --model {w}/m.gguf --bundle {w}/b --out {w}/b "
                                "--workspace {w}/ws", "{w}/b", "--bundle"),
    "eval test --out inside BUNDLE": ("eval test --protocol {w}/protocol.toml --model {w}/m.gguf --bundle {w}/b "
                                      "--out {w}/b/test --workspace {w}/ws", "{w}/b/test", "--bundle"),
    "eval blind --out DOC": ("eval blind --model {w}/m.gguf --bundle {w}/b --doc {w}/d --dev-report {w}/report.json "
                             "--out {w}/d --workspace {w}/ws", "{w}/d", "--doc"),
    "eval ledger --export into WORKSPACE": ("eval ledger --workspace {w}/ws --export {w}/ws/ledger.jsonl",
                                            "{w}/ws/ledger.jsonl", "--workspace"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_an_output_never_overwrites_an_input(world, case):
    line, out, needle = (s.replace("{w}", str(world)) for s in CASES[case])
    (world / "sym.gguf").symlink_to(world / "m.gguf")
    os.link(world / "m.gguf", world / "hard.gguf")
    (world / "e.gguf").write_bytes((world / "m.gguf").read_bytes())
    before = _snapshot(world)
    res = CliRunner().invoke(main, line.split())
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output and res.output.count("\n") == 1, res.output
    assert out in res.output and needle in res.output and "refusing" in res.output, res.output
    assert _snapshot(world) == before
    assert not [p for p in world.rglob("*.tmp")]


def test_overwrite_still_replaces_a_previous_output(world, tmp_path):
    out = tmp_path / "e.gguf"
    for _ in range(2):
        res = CliRunner().invoke(main, ["apply", str(world / "b"), "--model", str(world / "m.gguf"), "--out", str(out),
                                        "--overwrite"])
        assert res.exit_code == 0, res.output
    for _ in range(2):
        res = CliRunner().invoke(main, ["logits", "--model", str(world / "m.gguf"), "--dump", str(world / "d"),
                                        "--out", str(tmp_path / "l.npy")])
        assert res.exit_code == 0, res.output
    assert np.load(tmp_path / "l.npy").shape == (T, V)


def test_reports_may_go_into_a_directory_that_holds_inputs(world):
    """eval score writes dev-report.* into --out, never replacing it: `--out .` beside the protocol is fine."""
    from exactedit.files import refuse_clobber

    refuse_clobber({"--out": world}, {"--protocol": world / "protocol.toml"}, holds_inputs=True)
