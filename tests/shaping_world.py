"""A small chat model for the shaping tests: a synthetic GGUF whose token table holds ChatML
markup, think and tool-call tags, and the pieces of a few banned phrases in several spellings
(merged with a space, a bracket or a quote, split into short tokens, capitalized), with a
ChatML chat template; plus a greedy longest-match tokenizer standing in for the model's own."""
from __future__ import annotations

import numpy as np

CHATML_TPL = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>' + '\n' }}"
              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
CONTROL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]
USER_DEFINED = ["<tool_call>", "</tool_call>"]
WORDS = ["assistant", "user", "system", "\n", "\n\n", ".\n", " you", "you", "You", " You", " can", " ca", "n", "c",
         "an", " use", " us", "e", "(you", "\"You", " end", "end", "End", " End", " to", "to", " t", "o", " x", "x",
         "hi", ".", "!", "?", "```", "```python", "{\"", "[", " The", "The", " the", "the", "Sure", "sure", " rather",
         " than", "Rather", "_you", "ab", "9you", " ", "u", "y", "é", " élan", "Élan", "élan",
         "``", "`\n\n", "\n``", "`"]         # a code fence split over tokens, as Qwen2.5 writes it
TEXTS = CONTROL + USER_DEFINED + WORDS
ID = {t: i for i, t in enumerate(TEXTS)}
RULES = """
[prefix-penalty]
bias = 6.0
phrases = ["you can use", "end to end", "rather than"]

[step0-guard]
bias = 4.5

[persona-case]
drop = 8.0
"""


def write_model(path, template: str | None = CHATML_TPL):
    from exactedit.quant.gguf.write import _VT, MetaValue, synthetic_model

    types = np.array([3] * len(CONTROL) + [4] * len(USER_DEFINED) + [1] * len(WORDS), np.int32)
    meta = {"tokenizer.ggml.model": "test-raw", "tokenizer.ggml.tokens": TEXTS, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, ID["<|im_end|>"])}
    if template is not None:
        meta["tokenizer.chat_template"] = template
    return synthetic_model(path, vocab=len(TEXTS), n=256, h=32, layers=1, metadata=meta).path


def tokenize(text: str, special: bool) -> list[int]:
    """Greedy longest match (specials only when `special`)."""
    out, i = [], 0
    pool = [t for t in TEXTS if special or t not in CONTROL + USER_DEFINED]
    while i < len(text):
        best = max((t for t in pool if text.startswith(t, i)), key=len, default=None)
        if best is None:
            raise ValueError(f"cannot tokenize {text[i:]!r}")
        out.append(ID[best])
        i += len(best)
    return out


def compiled(tmp_path, rules: str = RULES):
    """The world's rules compiled for its model."""
    from exactedit.solvers.shaping.rules_file import compile_rules, load_rules
    from exactedit.quant import gguf

    model = write_model(tmp_path / "world.gguf")
    (tmp_path / "rules.toml").write_text(rules)
    with gguf.open(model) as g:
        return compile_rules(load_rules(tmp_path / "rules.toml"), g, tokenize, model_path=str(model))


def ids(*texts) -> list[int]:
    return [ID[t] for t in texts]


def chat(*reply, user=("hi",)) -> list[int]:
    return ids("<|im_start|>", "user", "\n", *user, "<|im_end|>", "\n", "<|im_start|>", "assistant", "\n", *reply)
