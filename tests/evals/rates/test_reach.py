"""The reach of a reply-end style within the bar off its decision rows (evals/rates/reach.py):
the transfer's KL against two explicit distributions, the bounds' bisections at the bar, and the
proportional family against the uniform one."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from exactedit.evals.rates.reach import MAX_SHARE, proportional_shares, reach, transfer_kl


def _kl_brute(q, s, f):
    """KL of [q, s, rest] against [q (1 - f), s + f q, rest], summed term by term."""
    p = np.array([q, s, 1.0 - q - s])
    pp = np.array([q * (1 - f), s + f * q, 1.0 - q - s])
    keep = p > 0
    return float(np.sum(p[keep] * (np.log(p[keep]) - np.log(pp[keep]))))


def _prob(hi: float):
    """0 or a normal float up to `hi`: at a subnormal q the brute-force reference's q (1 - f)
    rounds to 0 and its KL term to inf (q = 5e-324, f = 0.5: found by hypothesis), an artefact
    of the reference, not of `transfer_kl` (whose q log(1/(1-f)) stays finite)."""
    return st.one_of(st.just(0.0), st.floats(1e-300, hi))


@settings(max_examples=200, deadline=None)
@given(q=_prob(0.9), s=_prob(0.09), f=st.floats(0, 0.999))
def test_transfer_kl_is_the_kl_of_the_moved_distribution(q, s, f):
    assert transfer_kl([q], [s], f)[0] == pytest.approx(_kl_brute(q, s, f), rel=1e-9, abs=1e-15)


def test_uniform_share_meets_the_bar_and_the_floor_table():
    rng = np.random.default_rng(0)
    q = rng.beta(0.05, 5.0, 500)
    s = np.full(500, 1e-5)
    dec = np.zeros(500, bool)
    dec[::50] = True
    q[dec] = 0.4
    r = reach(q, s, dec, bar=0.002)
    off = ~dec
    assert float(transfer_kl(q[off], s[off], r.uniform_share).mean()) == pytest.approx(0.002, rel=1e-6)
    assert r.uniform_kl[0.5] == pytest.approx(float(transfer_kl(q[off], s[off], 0.5).mean()))
    assert r.stop_mass_decision == pytest.approx(q[dec].sum()) and r.decision_rows == 10
    f = proportional_shares(q, r.proportional_lam)
    assert r.proportional_kl == pytest.approx(0.002, rel=1e-6)
    assert r.proportional_rate == pytest.approx(float((q * f).sum() / q.sum()))
    # the share that grows with p(turn end) reaches more within the same bar than one share for all
    assert r.proportional_rate > r.uniform_share * 1.05


def test_with_one_q_everywhere_the_two_bounds_agree():
    q = np.full(200, 0.01)
    dec = np.zeros(200, bool)
    dec[:5] = True
    r = reach(q, np.zeros(200), dec, bar=0.005)
    assert r.proportional_rate == pytest.approx(r.uniform_share, rel=1e-6)
    assert r.uniform_share == pytest.approx(1 - np.exp(-0.5), rel=1e-9)     # 0.01 log(1/(1-f)) = 0.005


def test_a_bar_no_share_reaches_and_refusals():
    q = np.full(10, 1e-6)
    r = reach(q, np.zeros(10), np.zeros(10, bool), bar=1.0)
    assert r.uniform_share == MAX_SHARE                     # even f -> 1 stays within a loose bar
    with pytest.raises(ValueError, match="off the decision"):
        reach(q, np.zeros(10), np.ones(10, bool), bar=0.005)
    with pytest.raises(ValueError, match="probabilities"):
        reach(q * 2e6, np.zeros(10), np.zeros(10, bool), bar=0.005)
    with pytest.raises(ValueError, match="positive"):
        reach(q, np.zeros(10), np.zeros(10, bool), bar=0.0)
