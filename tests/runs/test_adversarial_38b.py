"""The adversarial re-run of issue 38's new surfaces (antislop and persona flags and their stage
ledger, `dataset corpus`, `shape compile --phrases`, the eval ledger, apply, verify --text), each
defect it found pinned here by its repro (the old behaviour in each docstring): tracebacks, a hang,
silent acceptances, a file one of the run's own readers misread. Live tests are on SmolLM2, short."""
from __future__ import annotations

import math
import os
import re

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.quant.gguf.write import synthetic_model
from exactedit.runs.antislop.config import AntislopConfig, AntislopError
from exactedit.runs.persona.config import PersonaConfig, PersonaError
from tests.special_files import WHY, special


def _refused(cls, error, **kw) -> str:
    with pytest.raises(error) as info:
        cls(**kw)
    return str(info.value)


def _clean(res, *needles):
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    for n in needles:
        assert n in res.output, res.output


# ---- settings: refused before any generation, naming the flag, with advice that can be taken -----
@pytest.mark.parametrize("cls, error", [(AntislopConfig, AntislopError), (PersonaConfig, PersonaError)])
def test_a_reply_cap_leaving_no_room_for_a_prompt_is_a_setting_problem(cls, error):
    """--max-new 10^12 passed the settings and was refused by the first generation as "needs
    1..-999999997952 tokens"."""
    msg = _refused(cls, error, model="m.gguf", max_new=10**12)
    assert "max_new (--max-new): 1000000000000 leaves no room for a prompt in the engine's context of 2048" in msg
    assert cls(model="m.gguf", max_new=2047).max_new == 2047


@pytest.mark.parametrize("cls, error", [(AntislopConfig, AntislopError), (PersonaConfig, PersonaError)])
def test_more_replies_than_seeds_asks_for_fewer_replies_not_a_negative_seed(cls, error):
    """--samples 10^12 was told "give a seed <= -995705032705": no seed is negative."""
    msg = _refused(cls, error, model="m.gguf", samples=10**12)
    assert "more than llama.cpp's 4294967295 seeds: give fewer replies" in msg and "<= -" not in msg


@pytest.mark.parametrize("bias, advice", [(1e308, "e.g. 3.4028234663852886e+38"), (1e39, "e.g. 3.4028234663852886e+38"),
                                          (1e-45, "e.g. 1.401298464324817e-45"), (6.1, "e.g. 6.125 or 6")])
def test_a_rules_bias_float32_does_not_hold_gets_advice_float32_holds(bias, advice):
    """--rules-bias 1e308 was an OverflowError traceback; 1e39 was offered 1e+39 (inf in float32);
    1e-45 was offered nothing."""
    msg = _refused(AntislopConfig, AntislopError, model="m.gguf", rules_bias=bias)
    assert msg.endswith(advice), msg


@pytest.mark.parametrize("field", ["prompts", "phrases", "texts", "chat_template", "model"])
def test_a_path_of_bytes_that_are_not_utf8_is_refused_by_its_flag(field):
    """A file name that is not UTF-8 (a lone surrogate in Python) reached the protocol and the
    report: a UnicodeEncodeError after the generation, or at the very end."""
    bad = "/tmp/x\udcffy/f.txt"
    kw = {"model": "m.gguf", field: (bad,) if field == "texts" else bad}
    msg = _refused(AntislopConfig, AntislopError, **kw)
    assert f"{field}" in msg and "is not UTF-8 (a byte no UTF-8 text holds, at character 6)" in msg, msg
    (line,) = [x for x in msg.splitlines() if x.startswith("  - ")]
    assert "\udcff" not in line                     # printable: the path as ascii() writes it


@pytest.mark.parametrize("system, what", [("Be a pirate \udcff.", "a lone surrogate ('\\udcff' at character 12)"),
                                          ("Be\x00 a pirate.", "a control character ('\\x00' at character 2)"),
                                          ("Be a\x1b[31m pirate.", "a control character ('\\x1b' at character 4)")])
def test_a_persona_prompt_no_tokenizer_takes_is_refused_before_the_run(system, what):
    """`persona --system $'Be a pirate \\xff.'` was a UnicodeEncodeError traceback in the data stage
    (persona.json already written)."""
    msg = _refused(PersonaConfig, PersonaError, model="m.gguf", system=system)
    assert f"system (--system): the persona prompt holds {what}" in msg, msg
    assert PersonaConfig(model="m.gguf", system="Be a pirate.\n\tAlways.").system


@pytest.mark.parametrize("spec, what", [("starter:Arr\udcff", "a lone surrogate"),
                                        ("signoff:bye\x00", "a control character"),
                                        ("starter:\x1b[1mArr", "a control character")])
def test_a_style_text_no_reply_shows_is_refused(spec, what):
    """A sign-off holding a NUL or a lone surrogate was taken: never shown by any reply, and the
    report (UTF-8) could not be written at the end."""
    from exactedit.evals.rates.style import Style, StyleError

    with pytest.raises(StyleError, match=f"holds {what}"):
        Style.parse(spec)


def test_persona_preflight_names_persona(tmp_path):
    """Persona's preflight error began "exactedit antislop cannot run on"."""
    from exactedit.runs.loop.preflight import PreflightError, preflight_head

    w = synthetic_model(tmp_path / "m.gguf", vocab=64, n=256, h=256, tied=True, head_type="Q8_0")
    with pytest.raises(PreflightError, match="^exactedit persona cannot run on"):
        preflight_head(w.path)


# ---- antislop's phrase list: what the solve reads back -------------------------------------------
def test_the_runs_phrase_list_reads_back_as_the_phrases_whatever_their_files_name(tmp_path, monkeypatch):
    """DIR/phrases.txt began "# from PATH": a PATH holding a newline put its second line among
    the phrases `solve wfld` reads (here "foo bar"), silently."""
    from exactedit.runs.antislop import checks, pipeline
    from exactedit.runs.loop import preflight
    from exactedit.solvers.phrases import load_phrases
    from tests.cli.test_untrusted_inputs import CHATML, VOCAB

    class _Stop(Exception):
        pass

    class _Fine:
        def to_dict(self):
            return {}

    monkeypatch.setattr(preflight, "preflight", lambda *a, **k: _Fine())
    monkeypatch.setattr(checks, "file_problems", lambda *a, **k: [])
    monkeypatch.setattr(checks, "word_uses", lambda *a, **k: _Fine())
    monkeypatch.setattr(pipeline, "_data", lambda r: (_ for _ in ()).throw(_Stop()))
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * 29, np.int32),
            "tokenizer.chat_template": CHATML}
    model = str(synthetic_model(tmp_path / "m.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path)
    folder = tmp_path / "mine\nfoo bar"
    folder.mkdir()
    (folder / "p.txt").write_text("you can use\nhere is an\n")
    (tmp_path / "q.txt").write_text("write a list\nexplain sorting\n")
    (tmp_path / "r.txt").write_text("write a poem\n")
    cfg = AntislopConfig(model=model, phrases=str(folder / "p.txt"), prompts=str(tmp_path / "q.txt"),
                         rate_prompts=str(tmp_path / "r.txt"), corpus_tokens=0)
    with pytest.raises(_Stop):
        pipeline.run_antislop(cfg, tmp_path / "out")
    assert load_phrases(tmp_path / "out" / "phrases.txt") == ("you can use", "here is an")


def test_an_out_of_bytes_that_are_not_utf8_is_refused_before_the_run(tmp_path):
    from exactedit.runs.loop.stages import StageError, StagedRun

    with pytest.raises(StageError, match=r"--out: the path is not UTF-8 \(a byte no UTF-8 text holds, at character"):
        StagedRun(str(tmp_path / "o\udcff"), str(tmp_path / "m.gguf"), None, (), None)
    assert os.listdir(tmp_path) == []


# ---- shape compile --phrases: a phrase that hides what it says -----------------------------------
@pytest.mark.parametrize("phrase, char", [("you can\ufeff use", "\\ufeff"), ("\u202eyou can use", "\\u202e"),
                                          ("you\u200b can use", "\\u200b"), ("you can \u2066use", "\\u2066")])
def test_a_phrase_holding_an_invisible_format_character_is_refused(phrase, char):
    """A byte-order mark inside a phrase, a zero-width space or a bidirectional override compiled
    into a rule that matches no text the phrase shows (and hides what it says in every report)."""
    from exactedit.solvers.phrases import PhraseError, parse_phrases

    with pytest.raises(PhraseError, match="line 1: phrase .* holds an invisible format character "
                                          + re.escape(f"('{char}' at")):
        parse_phrases([phrase], "p.txt")
    assert parse_phrases(["you\u200dcan use"]) == ("you\u200dcan use",)     # a joiner: scripts spell words with it


# ---- engine settings: no value llama.cpp wraps or chokes on --------------------------------------
@pytest.mark.parametrize("key, value", [("n_ctx", 2**32 + 2048), ("n_ctx", 2**31), ("n_batch", 10**9),
                                        ("n_threads", 10**6)])
def test_engine_settings_llama_cpp_would_wrap_or_crash_on_are_refused(key, value):
    """--n-ctx 2^32 + 2048 ran with 2048 while the dump recorded 4294969344; --threads 10^6 crashed
    llama.cpp (SIGSEGV); --n-batch 10^9 hung allocating the batch token by token."""
    from exactedit.native.llamacpp.engine import EngineError, EngineSettings

    with pytest.raises(EngineError, match=rf"EngineSettings: {key}: expected an integer in \[1, \d+\], got {value}"):
        EngineSettings(**{key: value})
    EngineSettings(n_ctx=1 << 24, n_batch=1 << 24, n_ubatch=512, n_threads=512)


# ---- the eval ledger's head file -------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["fifo", "zero", "loop"])
def test_a_special_file_as_the_ledger_head_is_named_not_waited_on(tmp_path, kind):
    """WORKSPACE/ledger.head as a FIFO hung `eval ledger`, `--verify` and every recording command;
    a link to /dev/zero was read until memory ran out."""
    from exactedit.fixtures import DEFAULT_FIXTURE

    ws = tmp_path / "ws"
    proto = str(DEFAULT_FIXTURE / "protocol.toml")
    assert CliRunner().invoke(main, ["eval", "register", proto, "--workspace", str(ws)]).exit_code == 0
    (ws / "ledger.head").unlink()
    bad = special(ws / "ledger.head", kind)
    for args in (["eval", "ledger"], ["eval", "ledger", "--verify"]):
        res = CliRunner().invoke(main, args + ["--workspace", str(ws)])
        _clean(res, f"{bad}: ledger.head: ", WHY[kind])


def test_a_head_file_longer_than_a_head_is_a_bad_head_read_bounded(tmp_path):
    """An 8 GiB (sparse) head file was read whole."""
    from exactedit.evals.protocol.ledger import MAX_HEAD_BYTES, Ledger
    from exactedit.fixtures import DEFAULT_FIXTURE

    ws = tmp_path / "ws"
    assert CliRunner().invoke(main, ["eval", "register", str(DEFAULT_FIXTURE / "protocol.toml"),
                                     "--workspace", str(ws)]).exit_code == 0
    with open(ws / "ledger.head", "r+b") as fh:
        fh.seek(0, 2)
        fh.truncate(fh.tell() + (8 << 30))
    with Ledger.open(ws, write=False) as ledger:
        check = ledger.verify()
    assert not check.ok and "does not match" in check.reason and MAX_HEAD_BYTES == 4096


# ---- apply: an output path that is a symlink loop --------------------------------------------------
def test_apply_to_a_symlink_loop_is_no_traceback(tmp_path):
    """`apply --out LOOP` was "RuntimeError: Symlink loop" (pathlib's resolve) from the clobber
    check and the transplant's; without --overwrite it is refused as existing, with it replaced."""
    from exactedit.solvers.bundle import InputRef, TensorEdit, write_bundle

    model = synthetic_model(tmp_path / "m.gguf", vocab=300, n=256, h=64)
    rows = np.zeros((1, 210), np.uint8)
    write_bundle(tmp_path / "b", solver="head", inputs=[InputRef("model", str(model.path), model.sha256)],
                 config={}, edits=[TensorEdit("output.weight", "rows", "Q6_K", (300, 256), rows, np.array([3]))])
    loop = tmp_path / "loop.gguf"
    loop.symlink_to(loop.name)
    args = ["apply", str(tmp_path / "b"), "--model", str(model.path), "--out", str(loop)]
    _clean(CliRunner().invoke(main, args), f"{loop}: output: exists")
    res = CliRunner().invoke(main, args + ["--overwrite"])
    assert res.exit_code == 0, res.output
    assert loop.is_file() and not loop.is_symlink()


# ---- verify --text: an empty text is named ---------------------------------------------------------
@pytest.mark.live
def test_verify_on_an_empty_text_names_the_text(tmp_path):
    """An empty --text was refused as the model's "tokens: expected a non-empty 1-D integer array"."""
    from tests import oracles

    smollm = oracles.live_model("smollm")
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "b").mkdir()
    res = CliRunner().invoke(main, ["verify", "live", "--model", str(smollm), "--bundle", str(tmp_path / "b"),
                                    "--text", str(tmp_path / "empty.txt")])
    _clean(res, f"{tmp_path / 'empty.txt'}: --text: no tokens (an empty text)")


# ---- shape compile --bias: a penalty that does something -------------------------------------------
@pytest.mark.parametrize("bias", [0.0, -0.0, math.nan, 1e39])
def test_a_phrases_bias_doing_nothing_or_not_float32_is_refused_before_the_model(tmp_path, bias):
    """`shape compile --phrases P --bias 0` compiled a rule that penalizes nothing (printed as
    "prefix-penalty --0" for -0); a bad bias was refused only after the model loaded, as
    "prefix-penalty.phrases"."""
    from exactedit.native.shaping.compile import compile_file
    from exactedit.solvers.shaping.compiled import ShapingRulesError

    with pytest.raises(ShapingRulesError, match=r"^--bias: bias: expected a finite number of nats > 0"):
        compile_file(None, tmp_path / "no-model.gguf", tmp_path / "r.json", phrases=("you can use",), bias=bias)
    assert not (tmp_path / "r.json").exists()


# ---- persona: a solve that cannot end, or ends in NaN, after the whole generation ----------------
@pytest.mark.parametrize("kw, says", [({"lr": 1e308}, "lr (--lr): 1e+308 is more than 1"),
                                      ({"max_steps": 10**15}, "is more than the 100000 steps a solve may take")])
def test_persona_refuses_a_solve_that_cannot_end_well_before_generating(kw, says):
    """--lr 1e308 passed and the solve ended in "x[0, 0] = nan: expected finite values to quantize";
    --max-steps 10^15 passed and the solve ran (and tracked) every step: neither shows until the
    generation is done."""
    assert says in _refused(PersonaConfig, PersonaError, model="m.gguf", **kw)
