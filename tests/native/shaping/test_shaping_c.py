"""The C reference of the compiled rules (native/shaping/c/shaping.c), built with the system compiler and
run through ctypes, against solvers.shaping.rules's live Shaper: the same logits, bit for bit, and the
same rules fired, at every row of random histories with random float32 logits."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings, strategies as st

from exactedit.solvers.shaping.rules import Shaper
from tests import oracles
from tests.shaping_c import CRules, build, compiler
from tests.shaping_world import ID, TEXTS, chat, compiled


@pytest.fixture(scope="module")
def dll(tmp_path_factory):
    if compiler() is None:
        oracles.unavailable("C compiler", "neither cc nor gcc is on PATH (the C reference is compiled by the tests)")
    return build(tmp_path_factory.mktemp("c"))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return compiled(tmp_path_factory.mktemp("world"))


def _compare(dll, world, toks, logits, persona=True):
    c = CRules(dll, world.to_dict(), persona=persona)
    sh = Shaper(world.rules, world.vocab, persona=persona)
    for t, tok in enumerate(toks):
        sh.push(int(tok))
        want, fired = sh.shape(logits[t])
        got, mask = c.shape(toks[:t + 1], logits[t])
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), (t, np.flatnonzero(got != want))
        assert mask == sum(1 << i for i, f in enumerate(fired) if f), (t, mask, fired)


SPECIAL = ["<|im_start|>", "<|im_end|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]
POOL = [ID[t] for t in TEXTS if t not in ("<|endoftext|>",)]
FLOATS = st.floats(-30.0, 30.0, width=32) | st.sampled_from([0.0, -0.0, 1.0, 8.0, -8.0, 6.0, 1e-30, -1e30])


@st.composite
def histories(draw):
    """A chat prefix (so assistant turns occur), then random tokens; logits with ties."""
    head = draw(st.sampled_from([[], chat(), chat("<think>"), [ID["<|im_start|>"], ID["assistant"], ID["\n"]]]))
    tail = draw(st.lists(st.sampled_from(POOL), max_size=24))
    toks = np.array(head + tail or [ID["x"]], np.int32)
    base = draw(st.lists(FLOATS, min_size=len(TEXTS), max_size=len(TEXTS)))
    logits = np.tile(np.array(base, np.float32), (toks.size, 1))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    noise = rng.normal(size=logits.shape).astype(np.float32) * draw(st.sampled_from([0.0, 1.0, 20.0]))
    return toks, (logits + noise).astype(np.float32), draw(st.booleans())


@settings(max_examples=300, deadline=None)
@given(histories())
@example((np.array(chat("\"You", " ca", "n", " use", ".", "The"), np.int32),
          np.zeros((15, len(TEXTS)), np.float32), True))   # ties: logaddexp(x, x) = x + log 2
@example((np.array(chat("x", "```python", "\n", "``", "`\n\n", "The", " end", " to", "\n``", "`", "You"), np.int32),
          np.zeros((20, len(TEXTS)), np.float32), True))   # fences split over tokens (Qwen2.5's "``" + "`\n\n")
def test_c_reference_equals_evals_shaping(dll, world, case):
    toks, logits, persona = case
    _compare(dll, world, toks, logits, persona)


def test_every_rule_fires_in_the_compared_rows(dll, world):
    """The comparison is not vacuous: each rule changes logits in this history."""
    toks = np.array(chat("<think>", "x", "</think>", "\n\n", "You", " can", ".", " rather"), np.int32)
    logits = np.random.default_rng(0).normal(size=(toks.size, len(TEXTS))).astype(np.float32)
    c = CRules(dll, world.to_dict())
    masks = [c.shape(toks[:t + 1], logits[t])[1] for t in range(toks.size)]
    assert all(any(m >> i & 1 for m in masks) for i in range(3)), masks
    _compare(dll, world, toks, logits)


def test_c_refuses_bad_input(dll, world):
    c = CRules(dll, world.to_dict())
    with pytest.raises(ValueError):
        c.shape(np.array([len(TEXTS)], np.int32), np.zeros(len(TEXTS), np.float32))
    with pytest.raises(ValueError):
        c.shape(np.zeros(0, np.int32), np.zeros(len(TEXTS), np.float32))
