"""A model's own special tokens from its GGUF: token types, the *_token_id keys, the chat template."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.quant import gguf
from exactedit.errors import GGUFFormatError
from exactedit.quant.gguf.write import MetaValue, _VT, synthetic_model
from exactedit.quant.model.specials import model_specials, resolve_names

CHATML_TPL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|fim_pad|>", "<tool_call>"] + [f"t{i}" for i in range(27)]
TYPES = [3, 3, 3, 3, 4] + [1] * 27


def _model(tmp_path, name="m.gguf", **keys):
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array(TYPES, np.int32)}
    for k, v in keys.items():
        meta[k if k.startswith("tokenizer") else f"tokenizer.ggml.{k}"] = \
            v if isinstance(v, str) else MetaValue(_VT.UINT32, v)
    return synthetic_model(tmp_path / name, vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path


def test_qwen_like_model(tmp_path):
    p = _model(tmp_path, bos_token_id=0, eos_token_id=2, padding_token_id=0,
               **{"tokenizer.chat_template": CHATML_TPL})
    with gguf.open(p) as g:
        s = model_specials(g)
    assert s.control == (0, 1, 2, 3) and s.user_defined == (4,)
    assert s.ids == {"bos": 0, "eos": 2, "pad": 0}
    assert s.template == (1, 2)
    assert (s.turn_end, s.turn_end_from) == (2, "chat_template")
    assert s.guards == (0, 1, 2)                 # not the unused <|fim_pad|>, not the user-defined <tool_call>
    assert s.end_of_generation == (2,)
    assert s.to_dict()["guards"] == ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def test_turn_end_precedence(tmp_path):
    with gguf.open(_model(tmp_path, "a.gguf", eos_token_id=0, eot_token_id=2,
                          **{"tokenizer.chat_template": CHATML_TPL})) as g:
        s = model_specials(g)
        assert (s.turn_end, s.turn_end_from, s.end_of_generation) == (2, "eot_token_id", (0, 2))
    with gguf.open(_model(tmp_path, "b.gguf", eos_token_id=0)) as g:   # no template: eos
        s = model_specials(g)
        assert (s.turn_end, s.turn_end_from, s.template, s.guards) == (0, "eos_token_id", (), (0,))
    with gguf.open(_model(tmp_path, "c.gguf")) as g:
        assert model_specials(g).turn_end is None


def test_bad_ids_are_refused(tmp_path):
    with gguf.open(_model(tmp_path, eos_token_id=999)) as g, pytest.raises(GGUFFormatError, match="eos_token_id"):
        model_specials(g)


def test_resolve_names():
    assert resolve_names(["<|im_end|>", "t0"], VOCAB) == (2, 5)
    with pytest.raises(GGUFFormatError, match="think"):
        resolve_names(["<think>"], VOCAB)


def test_role_tags_are_guarded_when_control(tmp_path):
    vocab = ["<|endoftext|>", "<think>", "</think>", "<tool_call>"] + [f"t{i}" for i in range(28)]
    meta = {"tokenizer.ggml.tokens": vocab, "tokenizer.ggml.token_type": np.array([3, 3, 3, 4] + [1] * 28, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 0)}
    p = synthetic_model(tmp_path / "t.gguf", vocab=len(vocab), n=256, h=32, layers=1, metadata=meta).path
    with gguf.open(p) as g:
        s = model_specials(g)
    assert s.role_tags == (1, 2, 3) and s.guards == (0, 1, 2)     # <tool_call> is user-defined here: not a guard
