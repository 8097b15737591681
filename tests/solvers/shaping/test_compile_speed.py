"""`shape compile` at scale: 1,000 phrases against a vocabulary the size of Qwen's
(151,936 tokens) in well under 10 s. The token pieces were found by a scan over every phrase
per token (O(vocab x phrases): about 15 s for 100 phrases, minutes for 1,000); `phrase_pieces`
is checked against that scan on random phrases."""
from __future__ import annotations

import string
import time

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.bench.shape_compile import scan_pieces
from exactedit.solvers.shaping.rules_file import PenaltySpec, RulesSpec, compile_rules, phrase_pieces
from tests.shaping_world import CONTROL, TEXTS, USER_DEFINED

QWEN_VOCAB = 151_936


_WORD = st.text(alphabet="abcyouE é", min_size=1, max_size=6).map(str.strip).filter(bool)


@settings(max_examples=60, deadline=None)
@given(phrases=st.lists(st.lists(_WORD, min_size=2, max_size=3).map(" ".join), min_size=1, max_size=4, unique=True))
def test_phrase_pieces_is_the_scan(phrases):
    text_bytes = [b"" if t in CONTROL else t.encode() for t in TEXTS] + [b"c" * 300, b" youyouyou"]
    assert phrase_pieces(phrases, text_bytes) == scan_pieces(phrases, text_bytes)


def _big_table(n: int) -> list[str]:
    rng = np.random.default_rng(0)
    seen, texts = set(TEXTS), list(TEXTS)
    while len(texts) < n:
        w = "".join(rng.choice(list(string.ascii_lowercase), int(rng.integers(2, 9))))
        for t in (w, " " + w, " " + w.capitalize()):
            if t not in seen and len(texts) < n:
                seen.add(t)
                texts.append(t)
    return texts


@pytest.mark.slow
def test_compile_1000_phrases_on_a_qwen_sized_vocabulary(tmp_path):
    from exactedit.quant import gguf
    from exactedit.quant.gguf.write import _VT, MetaValue, synthetic_model
    from tests.shaping_world import CHATML_TPL

    texts = _big_table(QWEN_VOCAB)
    ident = {t: i for i, t in enumerate(texts)}
    plain = len(texts) - len(CONTROL) - len(USER_DEFINED)
    types = np.array([3] * len(CONTROL) + [4] * len(USER_DEFINED) + [1] * plain, np.int32)
    meta = {"tokenizer.ggml.model": "test-raw", "tokenizer.ggml.tokens": texts, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.eos_token_id": MetaValue(_VT.UINT32, ident["<|im_end|>"]),
            "tokenizer.chat_template": CHATML_TPL}
    model = synthetic_model(tmp_path / "big.gguf", vocab=len(texts), n=32, h=32, layers=1, tied=True,
                            head_type="Q8_0", metadata=meta).path
    specials = set(CONTROL + USER_DEFINED)
    longest = max(len(t) for t in texts)

    def tokenize(text: str, special: bool) -> list[int]:          # greedy longest match
        out, i = [], 0
        while i < len(text):
            j = next(j for j in range(min(len(text), i + longest), i, -1)
                     if text[i:j] in ident and (special or text[i:j] not in specials))
            out.append(ident[text[i:j]])
            i = j
        return out

    words = [t[1:] for t in texts[len(TEXTS):] if t.startswith(" ") and t[1:].islower()]
    rng = np.random.default_rng(1)
    phrases = sorted({" ".join(words[k] for k in rng.choice(len(words), 3)) for _ in range(1100)})[:1000]
    spec = RulesSpec("speed.toml", "0" * 64, (PenaltySpec(tuple(phrases)),))
    with gguf.open(model) as g:
        t0 = time.perf_counter()
        compiled = compile_rules(spec, g, tokenize, model_path=str(model))
        took = time.perf_counter() - t0
    rule = compiled.rules[0]
    assert len(rule.phrases) == 1000 and rule.pieces
    assert took <= 10.0, f"shape compile of 1,000 phrases on {len(texts)} tokens took {took:.1f} s"
