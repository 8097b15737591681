"""A chat template given by the user (`--chat-template FILE`, model_chat(path, template=...)):
for a GGUF without one (Gemma 3 270M) the framing, the turn end and the guards are read off the
given file, which wins over a GGUF's own; a file that fails in the sandbox, has no turn shape, is
too large, empty or not UTF-8 stops with an error naming the file and the field; the framing is
recorded in the dump's manifest."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.dumps import read_dump
from exactedit.native.llamacpp.chat import model_chat
from exactedit.native.llamacpp.documents import import_dump
from exactedit.quant import gguf
from exactedit.quant.model.chat_template import (ChatFormat, ChatTemplateError, GivenTemplate, TemplateBudget,
    read_template)
from exactedit.quant.gguf.write import MetaValue, _VT, synthetic_model
from exactedit.quant.model.specials import model_specials

from tests.native.llamacpp.test_chat_framing import CHATML_TPL, FAILING, GEMMA_TPL, _raw

# Gemma-like: bos / eos control tokens, turn tags, and a user-defined "\n" (Gemma's runs of newlines)
VOCAB = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>",
         "\n"] + [f"t{i}" for i in range(23)]
TYPES = [3] * 8 + [4] + [1] * 23
BOS_GEMMA_TPL = "{{ bos_token }}" + GEMMA_TPL


def _model(tmp_path, template: str | None = None, name: str = "m"):
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array(TYPES, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 1),
            "tokenizer.ggml.bos_token_id": MetaValue(_VT.UINT32, 2),
            "tokenizer.ggml.padding_token_id": MetaValue(_VT.UINT32, 0)}
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return synthetic_model(tmp_path / f"{name}.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path


def _file(tmp_path, text, name="chat_template.jinja"):
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_a_model_without_a_template_takes_the_given_ones_framing_and_turn_end(tmp_path):
    model, tpl = _model(tmp_path), _file(tmp_path, BOS_GEMMA_TPL)
    with gguf.open(model) as g:
        own = model_specials(g)
    assert (own.turn_end, own.turn_end_from, own.template_from) == (1, "eos_token_id", "")   # <eos>: no template
    chat = model_chat(model, template=tpl)
    assert chat.fmt == ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model")
    assert chat.framing == f"user:{tpl}"
    sp = chat.specials
    assert (sp.turn_end, sp.turn_end_from, sp.template_from) == (5, "chat_template", f"user:{tpl}")
    assert set(sp.guards) == {0, 1, 2, 4, 5} and 5 in sp.end_of_generation   # pad, eos, bos and the turn tags
    assert chat.prompt("hi") == "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    d = chat.to_dict()
    assert d["chat_framing"] == f"user:{tpl}"
    assert d["chat_template_file"] == {"path": str(tpl), "sha256": GivenTemplate(BOS_GEMMA_TPL, str(tpl)).sha256}
    with gguf.open(model) as g:   # model_specials with the given template says the same
        assert model_specials(g, read_template(tpl)).turn_end == 5


def test_the_given_template_wins_over_the_ggufs_own(tmp_path):
    model = _model(tmp_path, CHATML_TPL)
    assert model_chat(model).fmt.turn_end == "<|im_end|>"
    chat = model_chat(model, template=_file(tmp_path, GEMMA_TPL))
    assert (chat.fmt.turn_start, chat.fmt.turn_end, chat.specials.turn_end) == ("<start_of_turn>", "<end_of_turn>", 5)


@pytest.mark.parametrize("kind", sorted(FAILING))
def test_a_failing_given_template_stops_naming_the_file(tmp_path, kind):
    tpl = _file(tmp_path, FAILING[kind], f"{kind}.jinja")
    with pytest.raises(ChatTemplateError) as e:
        model_chat(_model(tmp_path), template=tpl)
    assert str(e.value).startswith(f"{tpl}: chat_template: ")
    with pytest.raises(ChatTemplateError) as e:       # a fallback is for the GGUF's own template, not a given one
        model_chat(_model(tmp_path, name="m2"), template=tpl, fallback="chatml")
    assert str(e.value).startswith(f"{tpl}: chat_template: ")


def test_a_template_file_is_read_bounded(tmp_path):
    budget = TemplateBudget(source_chars=64)
    assert read_template(_file(tmp_path, "x" * 64), budget).source == "x" * 64
    for name, data, match in [("big", b"x" * 65, "over the source limit"),
                              ("huge", b"x" * 10_000, "over the source limit"),
                              ("empty", b" \n", "empty"), ("latin1", b"caf\xe9 {{ x }}", "not UTF-8")]:
        p = tmp_path / f"{name}.jinja"
        p.write_bytes(data)
        with pytest.raises(ChatTemplateError, match=match) as e:
            read_template(p, budget)
        assert str(e.value).startswith(f"{p}: chat_template: ")
    with pytest.raises(ChatTemplateError, match="cannot read") as e:
        read_template(tmp_path / "missing.jinja")
    assert e.value.field == "chat_template"


def test_the_given_framing_is_recorded_in_the_dumps_manifest(tmp_path):
    model, tpl = _model(tmp_path), _file(tmp_path, BOS_GEMMA_TPL)
    chat = model_chat(model, template=tpl)
    docs_tokens = np.array([2, 4, 9, 10, 5, 8, 4], np.int32)       # <bos><start_of_turn>t0 t1<end_of_turn>\n<start_of_turn>
    assert chat.is_chat(docs_tokens)
    res = import_dump(_raw(tmp_path), tmp_path / "d0", model=model)
    assert res["chat_framing"] == "default:chatml"                  # without the template: ChatML, said so
    res = import_dump(_raw(tmp_path, "raw2"), tmp_path / "d1", model=model, chat_template=tpl)
    m = read_dump(tmp_path / "d1").manifest
    assert res["chat_framing"] == m.chat_framing == f"user:{tpl}"
    assert m.meta["chat"]["format"]["turn_end"] == "<end_of_turn>"
    assert m.meta["chat"]["chat_template_file"]["sha256"] == read_template(tpl).sha256


@pytest.mark.parametrize("meta,framing", [
    ({"import": {"chat_framing": "gguf"}}, "gguf"),
    ({"documents": {"chat": {"chat_framing": "fallback:chatml"}}}, "fallback:chatml"),
    ({"chat": {"chat_framing": "user:t.jinja"}, "dataset": {"set": "train"}}, "user:t.jinja"),   # mine, dataset
    ({"chat": {"format": {}}}, None), ({}, None)])
def test_the_manifest_reads_the_framing_wherever_a_command_recorded_it(meta, framing):
    from exactedit.dumps.format import Manifest

    m = Manifest("rmsnorm", 0, 1, {}, {}, (), meta=meta)
    assert m.chat_framing == framing


def test_the_bundled_gemma_template_renders_gemma_3s_turns(tmp_path):
    """runs/bundled/gemma/chat_template.jinja: one <bos>, Gemma 3's turns, the assistant named
    "model", a system message folded into the first user turn (as Gemma's own template does)."""
    from exactedit.runs.loop.inputs import BUNDLED

    tpl = BUNDLED / "gemma" / "chat_template.jinja"
    chat = model_chat(_model(tmp_path), template=tpl)
    assert chat.fmt == ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model")
    assert chat.specials.turn_end == 5 and chat.framing == f"user:{tpl}"
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Why?"}]
    assert chat.render(conv, add_generation_prompt=True) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nWhy?<end_of_turn>\n<start_of_turn>model\n")
