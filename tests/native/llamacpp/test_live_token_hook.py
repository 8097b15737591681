"""Generation's per-token hook (native/llamacpp/sample.py `on_token`, the one-at-a-time loop's
`on_token`; `exactedit serve` streams through it) on SmolLM2-135M-Instruct: it sees each reply's
tokens in order, leaves the reply token for token what the loop gives without it, and a true
return ends the reply after that token with stop "halt"."""
from __future__ import annotations

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPTS = ("<|im_start|>user\nName three rivers.<|im_end|>\n<|im_start|>assistant\n",
           "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n")


def test_the_hook_sees_every_token_changes_nothing_and_can_halt():
    from exactedit.native.llamacpp import LlamaEngine, Sampling, sample_replies

    with LlamaEngine(oracles.live_model("smollm")) as e:
        jobs = [(e.tokenize(p), Sampling(max_new=16, seed=s)) for s, p in enumerate(PROMPTS)]
        plain = sample_replies(e, jobs, sequential=True)
        seen: list[tuple[int, int]] = []
        hooked = sample_replies(e, jobs, on_token=lambda job, tok: seen.append((job, tok)))
        halted = sample_replies(e, jobs, on_token=lambda job, tok: tok == plain[job].tokens[4])
    for k, (a, b) in enumerate(zip(plain, hooked)):
        assert np.array_equal(a.tokens, b.tokens) and a.stop == b.stop
        assert [t for j, t in seen if j == k] == [int(t) for t in a.tokens]
    for a, h in zip(plain, halted):
        cut = int(np.flatnonzero(a.tokens == a.tokens[4])[0]) + 1        # the first time that token comes
        assert h.stop == "halt" and np.array_equal(h.tokens, a.tokens[:cut]) and h.fired.shape[0] == cut
