"""The cost stage's split (runs/loop/cost.py): per named row set, the KL's rows, mean and max and
each side's perplexity over the rows that have a next token, against a direct recompute."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.runs.loop.cost import _split


@given(st.integers(0, 2**31), st.integers(2, 40))
@settings(max_examples=40, deadline=None)
def test_each_row_set_has_its_kl_and_perplexities(seed, T):
    rng = np.random.default_rng(seed)
    kl = rng.exponential(0.01, T)
    lb, le = -rng.exponential(2.0, T), -rng.exponential(2.0, T)
    lb[-1] = le[-1] = np.nan                          # a document's last row has no next token
    c = SimpleNamespace(per_row_kld=kl, exact_rows=SimpleNamespace(logp_next_base=lb, logp_next_edited=le))
    m = rng.random(T) < 0.5
    m[0] = True
    out = _split(c, {"a": m, "b": ~m})
    for label, mask in (("a", m), ("b", ~m)):
        got = out[label]
        assert got["rows"] == int(mask.sum())
        if not mask.any():
            assert got["mean"] is None
            continue
        assert got["mean"] == pytest.approx(kl[mask].mean()) and got["max"] == kl[mask].max()
        have = mask & np.isfinite(lb)
        want = np.exp(-lb[have].mean()) if have.any() else None
        assert got["ppl_base"] == (pytest.approx(want) if want is not None else None)
        want_e = np.exp(-le[have].mean()) if have.any() else None
        assert got["ppl_edited"] == (pytest.approx(want_e) if want_e is not None else None)


def test_without_per_row_log_probabilities_only_the_kl():
    c = SimpleNamespace(per_row_kld=np.array([0.1, 0.2, 0.3]), exact_rows=None)
    out = _split(c, {"x": np.array([True, False, True])})
    assert out == {"x": {"rows": 2, "mean": pytest.approx(0.2), "max": 0.3}}
    assert _split(c, {"x": np.array([True])}) == {}      # a mask of another dump's length: no split
