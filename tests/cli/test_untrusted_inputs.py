"""Untrusted inputs at the command line (issue 38, items 6, 8 and 10): each repro ends in one clean
line naming the file and the field, exit code 1, no traceback, before any engine or generation:
a FIFO in a discover directory, a lone surrogate in discover's records, in `shape compile
--phrases` and in a chat role of `engine dump --chat`, a non-UTF-8 --prompts, a --texts directory
of no .txt, special files given as --prompts / --texts / --chat-template to antislop."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.quant.gguf.write import _VT, MetaValue, synthetic_model
from tests.special_files import WHY, special

VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"t{i}" for i in range(29)]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * 29, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 2), "tokenizer.chat_template": CHATML}
    return synthetic_model(tmp_path_factory.mktemp("m") / "m.gguf", vocab=len(VOCAB), n=256, h=32, layers=1,
                           metadata=meta).path


def _clean(res, *needles):
    assert res.exit_code == 1, res.output
    assert isinstance(res.exception, SystemExit) and "Traceback" not in res.output, res.output
    for n in needles:
        assert n in res.output, res.output


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_discover_refuses_a_fifo_in_a_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "a.txt").write_text("some text of mine")
    bad = special(d / "b.txt", "fifo")
    (tmp_path / "h.txt").write_text("my own writing")
    _clean(_run("discover", "--model-text", d, "--human", tmp_path / "h.txt", "--out", tmp_path / "o.json"),
           f"{bad}: file: not a regular file (a FIFO)")


def test_discover_refuses_a_lone_surrogate_by_file_and_line(tmp_path):
    """Valid JSON "\\ud800": discover's output crashed with UnicodeEncodeError."""
    f = tmp_path / "replies.jsonl"
    f.write_text(json.dumps({"text": "Here's an example of it."}) + "\n" + json.dumps({"text": "a \ud800 b"}) + "\n")
    (tmp_path / "h.txt").write_text("my own writing")
    _clean(_run("discover", "--model-text", f, "--human", tmp_path / "h.txt", "--out", tmp_path / "o.json"),
           f"{f}: line 2: the text holds a lone surrogate")
    assert not (tmp_path / "o.json").exists()


def test_shape_compile_refuses_bad_phrases_before_the_engine(tmp_path, model):
    f = tmp_path / "found.json"
    f.write_text(json.dumps({"phrases": [{"phrase": "you can \ud800use"}]}))
    _clean(_run("shape", "compile", "--model", model, "--phrases", f, "--out", tmp_path / "r.json"),
           f"{f}: phrases[0].phrase: phrase 'you can \\ud800use' holds a lone surrogate")
    g = tmp_path / "p.txt"
    g.write_text("you can use\nend to\x00 end\n")
    _clean(_run("shape", "compile", "--model", model, "--phrases", g, "--out", tmp_path / "r.json"),
           f"{g}: line 2: phrase 'end to\\x00 end' holds a control character")
    h = tmp_path / "deep.json"
    h.write_text('{"phrases": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _clean(_run("shape", "compile", "--model", model, "--phrases", h, "--out", tmp_path / "r.json"),
           f"{h}: json: not valid JSON (nested too deeply)")


def test_engine_dump_refuses_a_lone_surrogate_in_a_chat_role(tmp_path, model):
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps([{"role": "user\ud800", "content": "hi"}]) + "\n")
    _clean(_run("engine", "dump", "--model", model, "--chat", conv, "--out", tmp_path / "d"),
           f"{conv}: line 1: a lone surrogate in 'user\\ud800'")
    assert not (tmp_path / "d").exists()


def test_prompts_not_utf8_and_texts_of_no_txt_are_clean_errors(tmp_path, model):
    prompts = tmp_path / "prompts.txt"
    prompts.write_bytes(b"one prompt\n\xff\n")
    rules = tmp_path / "rules.json"
    rules.write_text("{}")
    _clean(_run("shape", "rates", "--model", model, "--rules", rules, "--prompts", prompts),
           f"{prompts}: lines: not UTF-8 text")
    phrases = tmp_path / "p.txt"
    phrases.write_text("you can use\n")
    (tmp_path / "empty").mkdir()
    _clean(_run("dataset", "build", "--model", model, "--prompts", prompts, "--phrases", phrases,
                "--texts", tmp_path / "empty", "--out", tmp_path / "ds"),
           f"{tmp_path / 'empty'}: --texts: a directory holding no .txt files")


@pytest.mark.parametrize("flag", ["--prompts", "--texts", "--chat-template"])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_antislop_refuses_special_files_before_generating(tmp_path, model, flag, kind):
    """A FIFO as --prompts hung the run; as --texts it hung the inputs' hashing; /dev/zero was
    read until memory ran out. (A symlink loop given on the command line is click's "does not
    exist"; inside a --texts directory, tests/runs/test_bounded_inputs.py.)"""
    prompts, rates, phrases = tmp_path / "prompts.txt", tmp_path / "rates.txt", tmp_path / "p.txt"
    prompts.write_text("a prompt\n")
    rates.write_text("another prompt\n")
    phrases.write_text("you can use\n")
    bad = special(tmp_path / "bad.txt", kind)
    given = {"--prompts": prompts, flag: bad}
    res = _run("antislop", "--model", model, "--out", tmp_path / "run", "--phrases", phrases, "--rate-prompts", rates,
               *[x for k, v in given.items() for x in (k, v)])
    _clean(res, f"{bad}: ", WHY[kind])
    assert not (tmp_path / "run").exists()


def test_antislop_refuses_prompts_not_utf8_and_an_empty_texts_directory(tmp_path, model):
    prompts, rates, phrases = tmp_path / "prompts.txt", tmp_path / "rates.txt", tmp_path / "p.txt"
    prompts.write_bytes(b"a prompt\n\xfe\n")
    rates.write_text("another prompt\n")
    phrases.write_text("you can use\n")
    common = ("antislop", "--model", model, "--out", tmp_path / "run", "--phrases", phrases, "--rate-prompts", rates)
    _clean(_run(*common, "--prompts", prompts), f"{prompts}: lines: not UTF-8 text (invalid start byte at byte 9)")
    prompts.write_text("a prompt\n")
    (tmp_path / "empty").mkdir()
    _clean(_run(*common, "--prompts", prompts, "--texts", tmp_path / "empty"),
           f"{tmp_path / 'empty'}: --texts: a directory holding no .txt files")
    found = tmp_path / "found.json"                          # a lone surrogate crashed preflight
    found.write_text(json.dumps({"phrases": [{"phrase": "Here's an \ud800example"}]}))
    _clean(_run(*common[:5], "--phrases", found, *common[7:], "--prompts", prompts),
           f"{found}: phrases[0].phrase: phrase \"Here's an \\ud800example\" holds a lone surrogate")
    assert not (tmp_path / "run").exists()


# ---- the engine's and verify's own input files (issue 38: bounded untrusted inputs) -------------

def _engine_cmd(cmd: str, flag: str, bad, model, tmp_path) -> list:
    """The command line giving `bad` as `flag` of `cmd`, every other input a fine file."""
    (tmp_path / "bundle").mkdir(exist_ok=True)
    return {"dump": ["engine", "dump", "--model", model, flag, bad, "--out", tmp_path / "d"],
            "perplexity-chunks": ["engine", "perplexity-chunks", "--model", model, flag, bad, "--out", tmp_path / "d"],
            "run": ["engine", "run", "--metal-gguf", model, flag, bad, "--logits-out", tmp_path / "l.f32"],
            "live": ["verify", "live", "--model", model, "--bundle", tmp_path / "bundle", flag, bad]}[cmd]


_ENGINE_INPUTS = [("dump", "--text", "--text"), ("dump", "--tokens", "--tokens"), ("dump", "--chat", "--chat"),
                  ("perplexity-chunks", "--text", "--text"), ("run", "--tokens-file", "tokens file"),
                  ("live", "--text", "--text"), ("live", "--tokens", "--tokens")]


@pytest.mark.parametrize("cmd, flag, field", _ENGINE_INPUTS)
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_engine_and_verify_inputs_refuse_special_files_before_the_engine(tmp_path, model, cmd, flag, field, kind):
    """`engine dump --text/--tokens`, `engine perplexity-chunks --text`, `engine run --tokens-file`,
    `verify live --text/--tokens`: a FIFO was waited on for ever (here: a watchdog's empty write
    end), /dev/zero read until memory ran out; each is one clean line naming the file and the flag,
    before any engine loads and before anything is written."""
    bad = special(tmp_path / "in.bin", kind)
    _clean(_run(*_engine_cmd(cmd, flag, bad, model, tmp_path)), f"{bad}: {field}: {WHY[kind]}")
    assert not (tmp_path / "d").exists() and not (tmp_path / "l.f32").exists()


@pytest.mark.parametrize("cmd, flag, field", [x for x in _ENGINE_INPUTS if "text" in x[1]])
def test_engine_and_verify_texts_not_utf8_name_the_file_and_byte(tmp_path, model, cmd, flag, field):
    f = tmp_path / "t.txt"
    f.write_bytes(b"plain text then \xff")
    _clean(_run(*_engine_cmd(cmd, flag, f, model, tmp_path)),
           f"{f}: {field}: not UTF-8 text (invalid start byte at byte 16)")


@pytest.mark.parametrize("cmd, flag, field", [x for x in _ENGINE_INPUTS if "tokens" in x[1]])
def test_engine_and_verify_tokens_are_capped(tmp_path, model, cmd, flag, field):
    from exactedit.dumps.contract import MAX_TOKENS

    f = tmp_path / "t.i32"
    with open(f, "wb") as fh:
        fh.truncate(4 * MAX_TOKENS + 4)                     # sparse
    _clean(_run(*_engine_cmd(cmd, flag, f, model, tmp_path)),
           f"{f}: {field}: {4 * MAX_TOKENS + 4} bytes, over the limit of {4 * MAX_TOKENS}")


def test_engine_dump_tokens_past_the_vocabulary_name_the_file_and_flag(tmp_path, model):
    """Adversarial pass: an id past the vocabulary was refused as "token stream: tokens: row 2",
    naming neither the file nor --tokens, after the engine loaded."""
    f = tmp_path / "t.i32"
    np.array([1, 2, 10**8], "<i4").tofile(f)
    _clean(_run("engine", "dump", "--model", model, "--tokens", f, "--out", tmp_path / "d"),
           f"{f}: --tokens: id 100000000 at position 2 is outside [0, {len(VOCAB)})")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("flag, value, says", [
    ("--tag", "", "--tag: expected a non-empty string, got ''"),
    ("--tag", " ", "--tag: expected a non-empty string, got ' '"),
    ("--source", "s\udcff", r"--source: 's\udcff' is not UTF-8 text"),
    ("--character", "c\udcfe", r"--character: 'c\udcfe' is not UTF-8 text"),
])
def test_engine_dump_labels_are_checked_before_the_engine(tmp_path, model, flag, value, says):
    """Adversarial pass: `--tag ''` was refused by the manifest after the whole capture; a label of
    bytes that are not UTF-8 (a lone surrogate from the shell) was written into the dump."""
    f = tmp_path / "t.txt"
    f.write_text("some text")
    res = CliRunner().invoke(main, ["engine", "dump", "--model", str(model), "--text", str(f), flag, value,
                                    "--out", str(tmp_path / "d")])
    _clean(res, f"engine dump: {says}")
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("kind", ["fifo", "zero", "utf8"])
def test_persona_system_file_is_read_bounded(tmp_path, model, kind):
    """--system-file: a FIFO was waited on for ever; now refused by name, as a non-UTF-8 file is."""
    if kind == "utf8":
        bad = tmp_path / "system.txt"
        bad.write_bytes(b"Be a \xff pirate.")
        says = "not UTF-8 text (invalid start byte at byte 5)"
    else:
        bad, says = special(tmp_path / "system.txt", kind), WHY[kind]
    (tmp_path / "p.txt").write_text("a\n")
    (tmp_path / "r.txt").write_text("b\n")
    _clean(_run("persona", "--model", model, "--system-file", bad, "--style", "kaomoji", "--prompts", tmp_path / "p.txt",
                "--rate-prompts", tmp_path / "r.txt", "--out", tmp_path / "run"), f"{bad}: --system-file: {says}")
    assert not (tmp_path / "run").exists()


# ---- the evals' and apply's own input files (issue 38): protocol, dev report, anchors, bundles ---

@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_eval_inputs_refuse_special_files_by_name(tmp_path, model, kind):
    """`eval register PROTOCOL`, `eval blind --dev-report`, `eval ledger --verify --against`: a FIFO
    was waited on for ever (here: the watchdog's empty write end, then a wrong complaint about its
    content), /dev/zero read until memory ran out; each is one clean line naming the file and the
    field or flag, before the ledger is opened."""
    ws, bundle, doc = tmp_path / "ws", tmp_path / "bundle", tmp_path / "doc"
    bundle.mkdir()
    doc.mkdir()
    bad = special(tmp_path / "in.json", kind)
    _clean(_run("eval", "register", bad, "--workspace", ws), f"{bad}: file: {WHY[kind]}")
    _clean(_run("eval", "blind", "--model", model, "--bundle", bundle, "--doc", doc, "--dev-report", bad,
                "--workspace", ws), f"{bad}: --dev-report: {WHY[kind]}")
    _clean(_run("eval", "ledger", "--verify", "--against", bad, "--workspace", ws), f"{bad}: --against: {WHY[kind]}")
    (tmp_path / "outputs").mkdir()
    found = special(tmp_path / "outputs" / "dev-report.json", kind)
    _clean(_run("eval", "ledger", "--verify", "--against", tmp_path / "outputs", "--workspace", ws),
           f"{found}: --against: {WHY[kind]}")
    assert not ws.exists()


@pytest.mark.parametrize("victim, field", [("manifest.json", "manifest"), ("report.json", "files"),
                                           ("output.weight.q6k", "edits[0].file")])
@pytest.mark.parametrize("kind", ["fifo", "zero"])
def test_apply_refuses_special_files_in_a_bundle(tmp_path, model, victim, field, kind):
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    # an edit of the model's own head (Q6_K [32, 256]): apply checks the entry against the model
    # before any edit file is read, so a mismatched one is refused before its file is looked at
    edit = TensorEdit("output.weight", "rows", "Q6_K", (32, 256), np.zeros((1, 210), np.uint8), np.array([3]))
    write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", str(model), "ab" * 32)], config={},
                 edits=[edit], files={"report.json": b"{}"})
    (tmp_path / "b" / victim).unlink()
    bad = special(tmp_path / "b" / victim, kind)
    _clean(_run("apply", tmp_path / "b", "--model", model, "--out", tmp_path / "e.gguf"), f"{bad}: {field}: {WHY[kind]}")
    assert not (tmp_path / "e.gguf").exists()
