"""Chat templates from a GGUF: rendered in Jinja2's immutable sandbox, refused cleanly when they
reach outside it, and probed for the turn framing that row roles are derived from."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.quant import gguf
from exactedit.quant.model.chat_template import (CHATML, ChatFormat, ChatTemplate, ChatTemplateError, from_gguf,
    probe_format)
from exactedit.quant.gguf.write import MetaValue, _VT, synthetic_model

CHATML_TPL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
GEMMA_TPL = ("{{ bos_token }}{% for m in messages %}{% set r = 'model' if m['role'] == 'assistant' else m['role'] %}"
             "{{ '<start_of_turn>' + r + '\n' + m['content'] | trim + '<end_of_turn>\n' }}{% endfor %}"
             "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")
LLAMA3_TPL = ("{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] "
              "+ '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
MSGS = [{"role": "user", "content": "Hi"}]


def test_renders_like_the_template_says():
    t = ChatTemplate(CHATML_TPL)
    assert t.render(MSGS, add_generation_prompt=True) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert t.render(MSGS) == "<|im_start|>user\nHi<|im_end|>\n"
    g = ChatTemplate(GEMMA_TPL, bos_token="<bos>")
    assert g.render(MSGS + [{"role": "assistant", "content": " Yo "}]) == \
        "<bos><start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nYo<end_of_turn>\n"


def test_tojson_and_loop_controls():
    t = ChatTemplate("{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m | tojson }}{% endfor %}")
    assert t.render([{"role": "user", "content": "é"}, {"role": "user", "content": "b"}]) == \
        '{"role": "user", "content": "é"}'


@pytest.mark.parametrize("source", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",                    # attribute outside the sandbox
    "{{ messages.__class__.__init__.__globals__ }}",                      # reaching for globals
    "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}ok",  # mutating the input
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",           # the classic escape
    "{{ self.__init__.__globals__ }}",
], ids=["class-mro", "globals", "mutation", "cycler-os", "self-globals"])
def test_a_template_reaching_outside_the_sandbox_is_refused(source):
    with pytest.raises(ChatTemplateError) as e:
        ChatTemplate(source, where="evil.gguf").render(MSGS)
    assert str(e.value).startswith("evil.gguf: tokenizer.chat_template: ")
    assert "sandbox" in str(e.value) or "failed while rendering" in str(e.value)


def test_sandbox_refusal_says_so():
    with pytest.raises(ChatTemplateError, match="refused by the sandbox"):
        ChatTemplate("{{ ''.__class__.__mro__ }}").render(MSGS)
    with pytest.raises(ChatTemplateError, match="refused by the sandbox"):
        ChatTemplate("{% set x = messages.append(1) %}").render(MSGS)


def test_broken_templates_and_messages():
    with pytest.raises(ChatTemplateError, match="not a valid Jinja2 template"):
        ChatTemplate("{% for %}")
    with pytest.raises(ChatTemplateError, match="the template raised: no system"):
        ChatTemplate("{{ raise_exception('no system') }}").render(MSGS)
    with pytest.raises(ChatTemplateError, match="empty"):
        ChatTemplate("  ")
    t = ChatTemplate(CHATML_TPL)
    for bad in ([], [{"role": "user"}], [{"role": "wizard", "content": "x"}], "hi", [{"role": "user", "content": 3}]):
        with pytest.raises(ChatTemplateError, match="messages"):
            t.render(bad)


@pytest.mark.parametrize("source,want", [
    (CHATML_TPL, CHATML),
    (GEMMA_TPL, ChatFormat("<start_of_turn>", "<end_of_turn>", "\n", "model")),
    (LLAMA3_TPL, ChatFormat("<|start_header_id|>", "<|eot_id|>", "<|end_header_id|>", "assistant")),
], ids=["chatml", "gemma", "llama3"])
def test_probe_format(source, want):
    specials = ["<|im_start|>", "<|im_end|>", "<start_of_turn>", "<end_of_turn>", "<bos>", "<|start_header_id|>",
                "<|end_header_id|>", "<|eot_id|>"]
    assert probe_format(ChatTemplate(source, bos_token="<bos>"), specials) == want


def test_probe_needs_special_tags():
    with pytest.raises(ChatTemplateError, match="closes an assistant turn"):
        probe_format(ChatTemplate("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"), ["<s>"])


def test_from_gguf(tmp_path):
    vocab = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"t{i}" for i in range(29)]
    types = np.array([3, 3, 3] + [1] * 29, np.int32)
    meta = {"tokenizer.ggml.tokens": vocab, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 2),
            "tokenizer.chat_template": "{{ eos_token }}" + CHATML_TPL}
    w = synthetic_model(tmp_path / "m.gguf", vocab=len(vocab), n=256, h=32, layers=1, metadata=meta)
    with gguf.open(w.path) as g:
        assert from_gguf(g).render(MSGS).startswith("<|im_end|><|im_start|>user\n")
    w2 = synthetic_model(tmp_path / "n.gguf", vocab=len(vocab), n=256, h=32, layers=1,
                         metadata={k: v for k, v in meta.items() if k != "tokenizer.chat_template"})
    with gguf.open(w2.path) as g, pytest.raises(ChatTemplateError, match="no chat template"):
        from_gguf(g)
