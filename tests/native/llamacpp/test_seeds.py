"""Seeds llama.cpp reproduces (issue 38.7): its `dist` sampler takes a uint32_t and reads
0xFFFFFFFF as "random", so through ctypes 2**32 + 7 samples as 7 and -1 as a random seed. A
Sampling refuses both, with the range in the message; every seed of [0, SEED_LIMIT) is taken."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from exactedit.native.llamacpp.engine import EngineError
from exactedit.native.llamacpp.generate import SEED_LIMIT, Sampling, seed_problem


@pytest.mark.parametrize("seed", [-1, SEED_LIMIT, 2**32, 2**32 + 7, -(2**31), 2**64, True, 1.5, "7"])
def test_seeds_the_engine_would_wrap_or_randomize_are_refused(seed):
    assert seed_problem(seed) is not None
    with pytest.raises(EngineError, match="seed"):
        Sampling(seed=seed)


def test_the_refusal_says_the_range_and_why():
    msg = seed_problem(-1, "seed (--seed)")
    assert msg.startswith("seed (--seed): -1 is outside") and f"0 to {SEED_LIMIT - 1}" in msg and "random" in msg
    assert "wraps" in seed_problem(2**32 + 7)


@given(st.integers(0, SEED_LIMIT - 1))
def test_every_seed_of_the_range_is_taken(seed):
    assert seed_problem(seed) is None and Sampling(seed=seed).seed == seed
