"""Batched sampling (native/llamacpp/batched.py, through generation's door native/llamacpp/sample.py;
`sequential` gives the one-at-a-time loop) on the real Gemma 3 270M through llama.cpp: one slot is
the live loop token for token; several slots are deterministic, keep each reply's own seed and
history (a reply does not depend on which others share its batch beyond the kernels' last bits),
and end replies the way the one-at-a-time loop does (a stop token kept, or max_new)."""
from __future__ import annotations

import numpy as np
import pytest

from tests import oracles

pytestmark = pytest.mark.live

PROMPTS = ("<start_of_turn>user\nName three rivers.<end_of_turn>\n<start_of_turn>model\n",
           "<start_of_turn>user\nSay hi.<end_of_turn>\n<start_of_turn>model\n",
           "<start_of_turn>user\nWrite one sentence about the sea.<end_of_turn>\n<start_of_turn>model\n")
MAX_NEW = 24


@pytest.fixture(scope="module")
def engine():
    from exactedit.native.llamacpp.engine import LlamaEngine

    with LlamaEngine(oracles.live_model("gemma")) as e:   # missing extra: skip, or a CI failure
        yield e


@pytest.fixture(scope="module")
def jobs(engine):
    from exactedit.native.llamacpp.generate import Sampling

    prompts = [engine.tokenize(p) for p in PROMPTS]
    return [(p, Sampling(MAX_NEW, 0.8, 40, seed)) for p in prompts for seed in (0, 1)]


def _run(engine, jobs, slots):
    from exactedit.native.llamacpp.sample import sample_replies

    return sample_replies(engine, jobs, slots=slots)


def _loop(engine, p, c):
    """The one-at-a-time loop, one reply."""
    from exactedit.native.llamacpp.sample import sample_replies

    (g,) = sample_replies(engine, [(p, c)], sequential=True)
    return g


def test_one_slot_is_the_live_loop_token_for_token(engine, jobs):
    got = _run(engine, jobs[:3], slots=1)
    for (p, c), g in zip(jobs[:3], got):
        want = _loop(engine, p, c)
        np.testing.assert_array_equal(g.tokens, want.tokens)
        assert g.truncated == want.truncated


def test_several_slots_are_deterministic_and_end_like_the_loop(engine, jobs):
    progress = []
    a = _run(engine, jobs, slots=4)
    b = _run(engine, jobs, slots=4)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.tokens, y.tokens)
    eog = {int(t) for t in range(engine.n_vocab) if engine.is_eog(t)}
    for (p, _), g in zip(jobs, a):
        np.testing.assert_array_equal(g.prompt, p)
        assert 1 <= g.tokens.size <= MAX_NEW
        if g.truncated:
            assert g.tokens.size == MAX_NEW and not eog & set(g.tokens.tolist())
        else:
            assert int(g.tokens[-1]) in eog and not eog & set(g.tokens[:-1].tolist())
    from exactedit.native.llamacpp.sample import sample_replies

    sample_replies(engine, jobs, slots=3, progress=lambda d, t: progress.append((d, t)))
    assert progress == [(k, len(jobs)) for k in range(1, len(jobs) + 1)]


def test_up_to_three_slots_each_reply_is_its_own(engine, jobs):
    """Prompts of different lengths, three replies at once, in two orders: every reply is the one
    the one-at-a-time loop samples for its seed (ggml's one-row kernels up to 3 rows a batch)."""
    assert len({p.size for p, _ in jobs}) > 1
    a = _run(engine, jobs, slots=3)
    b = _run(engine, jobs[::-1], slots=3)[::-1]
    assert not np.array_equal(a[0].tokens, a[1].tokens)
    for (p, c), x, y in zip(jobs, a, b):
        want = _loop(engine, p, c).tokens
        np.testing.assert_array_equal(x.tokens, want)
        np.testing.assert_array_equal(y.tokens, want)


def test_more_slots_keep_the_first_token_and_the_seed(engine, jobs):
    """Six at once: every reply's first token is the live loop's (its prompt is prefilled alone),
    the two seeds of a prompt differ, and a run repeats itself exactly."""
    a, b = _run(engine, jobs, slots=6), _run(engine, jobs, slots=6)
    for (p, c), x, y in zip(jobs, a, b):
        np.testing.assert_array_equal(x.tokens, y.tokens)
        assert x.tokens[0] == _loop(engine, p, _one_token(c)).tokens[0]
    assert not np.array_equal(a[0].tokens, a[1].tokens)


def _one_token(c):
    from exactedit.native.llamacpp.generate import Sampling

    return Sampling(1, c.temperature, c.top_k, c.seed)


def test_bad_slots_and_long_prompts_are_refused(engine, jobs):
    from exactedit.native.llamacpp.engine import EngineError
    from exactedit.native.llamacpp.generate import Sampling
    from exactedit.native.llamacpp.sample import sample_replies

    with pytest.raises(EngineError, match="slots"):
        sample_replies(engine, [jobs[0]], slots=0)
    long = np.zeros(engine.settings.n_ctx, np.int32) + jobs[0][0][0]
    with pytest.raises(EngineError, match=r"prompt\[0\]"):
        sample_replies(engine, [(long, Sampling(8))])
