"""`engine dump --chat` runs the GGUF's chat template only in the sandbox: a template reaching
outside it is refused with a clean one-line error before any engine is loaded."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner

from exactedit.cli import main
from exactedit.quant.gguf.write import MetaValue, _VT, synthetic_model

VOCAB = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [f"t{i}" for i in range(29)]


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
    "{% set x = messages.append({'role': 'user', 'content': 'x'}) %}",
], ids=["subclasses", "os-popen", "mutation"])
def test_an_escaping_template_is_a_clean_cli_error(tmp_path, template):
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * 29, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 2), "tokenizer.chat_template": template}
    model = synthetic_model(tmp_path / "evil.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path
    conv = tmp_path / "c.jsonl"
    conv.write_text(json.dumps([{"role": "user", "content": "hi"}]) + "\n")
    res = CliRunner().invoke(main, ["engine", "dump", "--model", str(model), "--chat", str(conv),
                                    "--out", str(tmp_path / "d")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert "tokenizer.chat_template: refused by the sandbox" in res.output and "Traceback" not in res.output
    assert not (tmp_path / "d").exists()


@pytest.mark.parametrize("template", [
    "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "{% for m in messages %}{{ m['content'] }}{% endfor %}",          # no turn shape
], ids=["escaping", "no-shape"])
def test_a_bad_chat_template_file_is_a_clean_cli_error_naming_it(tmp_path, template):
    """--chat-template FILE: the file's errors name the file and `chat_template`, before any engine."""
    meta = {"tokenizer.ggml.tokens": VOCAB, "tokenizer.ggml.token_type": np.array([3, 3, 3] + [1] * 29, np.int32),
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, 2)}
    model = synthetic_model(tmp_path / "m.gguf", vocab=len(VOCAB), n=256, h=32, layers=1, metadata=meta).path
    conv, tpl = tmp_path / "c.jsonl", tmp_path / "t.jinja"
    conv.write_text(json.dumps([{"role": "user", "content": "hi"}]) + "\n")
    tpl.write_text(template)
    res = CliRunner().invoke(main, ["engine", "dump", "--model", str(model), "--chat", str(conv),
                                    "--chat-template", str(tpl), "--out", str(tmp_path / "d")])
    assert res.exit_code == 1 and isinstance(res.exception, SystemExit), res.output
    assert f"{tpl}: chat_template: " in res.output and "Traceback" not in res.output
    assert not (tmp_path / "d").exists()
