"""A model whose chat template is refused or fails no longer becomes ChatML silently: model_chat,
`dump import --model` and `solve wfld` stop with the template's error unless a fallback framing is
named, and the framing used is recorded in the dump's manifest."""
from __future__ import annotations

import types

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.dumps.format import Manifest
from exactedit.native.llamacpp.chat import model_chat
from exactedit.native.llamacpp.documents import import_dump
from exactedit.quant import gguf
from exactedit.quant.model.chat_template import CHATML, ChatFormat, ChatTemplateError
from exactedit.quant.gguf.write import MetaValue, _VT, synthetic_model
from exactedit.solvers.l47.config import WfldError

VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>"] + \
    [f"t{i}" for i in range(27)]
CHATML_TPL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
GEMMA_TPL = ("{% for m in messages %}{{ '<start_of_turn>' + ('model' if m['role'] == 'assistant' else m['role']) "
             "+ '\n' + m['content'] + '<end_of_turn>\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
REFUSED = "{{ ''.__class__.__mro__ }}" + GEMMA_TPL
FAILING = {"refused": REFUSED, "syntax": "{% for %}", "hangs": "{{ 9**(9**10) }}" + GEMMA_TPL,
           "no-shape": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"}


def _model(tmp_path, template: str | None, name: str = "m"):
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3] * 5 + [1] * 27, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 2)}
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return synthetic_model(tmp_path / f"{name}.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path


def test_a_working_template_gives_its_own_framing(tmp_path):
    chat = model_chat(_model(tmp_path, GEMMA_TPL))
    assert (chat.fmt, chat.framing) == (ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model"), "gguf")
    assert chat.to_dict()["chat_framing"] == "gguf" and "template_error" not in chat.to_dict()
    none = model_chat(_model(tmp_path, None, "n"))
    assert (none.fmt, none.framing) == (CHATML, "default:chatml")


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_a_failing_template_stops_unless_a_fallback_is_named(tmp_path, kind):
    model = _model(tmp_path, FAILING[kind])
    with pytest.raises(ChatTemplateError, match="name a fallback framing") as e:
        model_chat(model)
    assert str(e.value).startswith(f"{model}: tokenizer.chat_template: ")
    chat = model_chat(model, fallback="chatml")
    assert (chat.fmt, chat.framing) == (CHATML, "fallback:chatml") and chat.template_error
    assert chat.to_dict()["template_error"] == chat.template_error
    with pytest.raises(ChatTemplateError, match="fallback: expected one of"):
        model_chat(model, fallback="llama2")


def _raw(tmp_path, name="raw", T=4):
    d = tmp_path / name
    d.mkdir()
    rng = np.random.default_rng(0)
    np.array([1, 5, 6, 2][:T], np.int32).tofile(d / "tokens.bin")
    rng.standard_normal((T, 256)).astype("<f4").tofile(d / "R.bin")
    rng.standard_normal((T, 32)).astype("<f4").tofile(d / "hh.bin")
    (d / "dump.toml").write_text('arch = "rmsnorm"\nlayer = 0\n'
                                 '[fields.tokens]\nfile = "tokens.bin"\ndtype = "int32"\nshape = ["T"]\n'
                                 '[fields.R]\nfile = "R.bin"\ndtype = "float32"\nshape = ["T", 256]\n'
                                 '[fields.hh]\nfile = "hh.bin"\ndtype = "float32"\nshape = ["T", 32]\n')
    return d


def test_dump_import_records_the_framing_and_refuses_a_failing_template(tmp_path):
    good = _model(tmp_path, CHATML_TPL, "good")
    res = import_dump(_raw(tmp_path), tmp_path / "d1", model=good)
    assert res["chat_framing"] == "gguf"
    m = read_dump(tmp_path / "d1").manifest
    assert m.chat_framing == "gguf" and m.meta["chat"]["format"]["turn_end"] == "<|im_end|>"
    bad = _model(tmp_path, REFUSED, "bad")
    with pytest.raises(ChatTemplateError, match="refused by the sandbox.*name a fallback framing"):
        import_dump(_raw(tmp_path, "raw2"), tmp_path / "d2", model=bad)
    assert not (tmp_path / "d2").exists()
    res = import_dump(tmp_path / "raw2", tmp_path / "d3", model=bad, chat_fallback="chatml")
    assert read_dump(tmp_path / "d3").manifest.chat_framing == "fallback:chatml" == res["chat_framing"]
    # a dump written before the record (or with its roles given) says nothing, and still reads
    old = read_dump(import_dump(tmp_path / "raw2", tmp_path / "d4")["dump"])
    assert old.manifest.chat_framing is None
    before = Manifest("rmsnorm", 0, 1, {}, {}, (), meta={"documents": {"chat": {"format_from": "chat_template"}}})
    assert before.chat_framing is None


def test_solve_wfld_stops_on_a_failing_template_unless_the_turn_end_is_named(tmp_path):
    from exactedit.runs.solve.wfld import _resolve_specials
    from exactedit.solvers.tail.model import load_tokens

    model = _model(tmp_path, REFUSED)
    with gguf.open(model) as g:
        tail = types.SimpleNamespace(tokens=load_tokens(g))
        with pytest.raises(WfldError, match="refused by the sandbox.*pass --turn-end"):
            _resolve_specials(g, tail, None, types.SimpleNamespace(specials=(), turn_end=""))
        specials, turn_end = _resolve_specials(g, tail, None, types.SimpleNamespace(specials=(), turn_end="<|im_end|>"))
    assert turn_end == 2 and 2 in specials


def test_dump_import_cli_names_the_fallback(tmp_path):
    """`dump import --chat-fallback chatml` reaches the import; without it the refused template stops
    the command in one line."""
    from click.testing import CliRunner

    from exactedit.cli import main

    bad = _model(tmp_path, REFUSED, "bad")
    args = ["dump", "import", str(_raw(tmp_path)), "--model", str(bad)]
    r = CliRunner().invoke(main, args + ["--out", str(tmp_path / "d1")])
    assert r.exit_code == 1 and "name a fallback framing" in r.output and "Traceback" not in r.output, r.output
    r = CliRunner().invoke(main, args + ["--out", str(tmp_path / "d2"), "--chat-fallback", "chatml", "--json"])
    assert r.exit_code == 0, r.output
    assert read_dump(tmp_path / "d2").manifest.chat_framing == "fallback:chatml"
