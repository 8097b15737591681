"""The removal screen (solvers/l47/gated/removal.py) against brute-force loops: per-unit energy of
the contribution, its streaming (any chunk), the candidates (least energy among units quiet on the
phrase's rows), and the residual changes against a full FFN output with the unit zeroed or
rewritten."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.solvers.l47.gated import (GatedError, col_norms, removal_candidates, removal_delta, rewrite_delta,
                                         unit_energy)


def _world(seed, t=40, h=30, n=12):
    rng = np.random.default_rng(seed)
    hh = (rng.normal(size=(t, h)) * rng.uniform(0.0, 3.0, size=h)).astype(np.float32)
    hh[:, rng.integers(h)] = 0.0                               # a dead unit
    wdown = rng.normal(size=(n, h)).astype(np.float32)
    pos = rng.random(t) < 0.2
    pos[0] = True
    return hh, wdown, pos


def _brute_energy(hh, wdown):
    e = np.zeros(hh.shape[1])
    for j in range(hh.shape[1]):
        for t in range(hh.shape[0]):
            c = float(hh[t, j]) * wdown[:, j].astype(np.float64)
            e[j] += c @ c
    return e


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 50), st.integers(1, 8), st.floats(0.0, 2.0))
def test_screen_against_brute_force(seed, chunk, k, tol):
    hh, wdown, pos = _world(seed)
    cn = col_norms(wdown, chunk=chunk)
    np.testing.assert_allclose(cn, np.linalg.norm(wdown.astype(np.float64), axis=0), rtol=1e-12)
    e = unit_energy(hh, cn, chunk=chunk)
    np.testing.assert_allclose(e, _brute_energy(hh, wdown), rtol=1e-10)
    got = removal_candidates(hh, cn, pos, k, active_tol=tol, chunk=chunk)
    hp = hh[pos].astype(np.float64)
    cut = tol * np.sqrt(np.mean(hp**2))
    quiet = [j for j in range(hh.shape[1]) if max(abs(hp[:, j])) <= cut]
    want = sorted(quiet, key=lambda j: (e[j], j))[:k]
    assert got.units.tolist() == want
    np.testing.assert_allclose(got.energy, e[want], rtol=1e-12)
    np.testing.assert_allclose(got.share, e[want] / e.sum(), rtol=1e-12)
    np.testing.assert_allclose(got.rms, np.sqrt(e[want] / hh.shape[0]), rtol=1e-12)
    assert got.n_active == hh.shape[1] - len(quiet) and got.threshold == pytest.approx(cut, rel=1e-12)


def test_deltas_against_the_ffn_output():
    hh, wdown, _ = _world(1)
    h64, w64 = hh.astype(np.float64), wdown.astype(np.float64)
    y0 = h64 @ w64.T
    j = 5
    zeroed = w64.copy()
    zeroed[:, j] = 0.0
    np.testing.assert_allclose(removal_delta(hh, wdown, j), h64 @ zeroed.T - y0, atol=1e-12)
    rng = np.random.default_rng(2)
    a, down = rng.normal(size=hh.shape[0]), rng.normal(size=wdown.shape[0])
    h_new, w_new = h64.copy(), w64.copy()
    h_new[:, j], w_new[:, j] = a, down
    np.testing.assert_allclose(rewrite_delta(hh, wdown, j, a, down), h_new @ w_new.T - y0, atol=1e-12)


def test_errors_name_the_field():
    hh, wdown, pos = _world(3)
    with pytest.raises(GatedError, match="removal: j"):
        removal_delta(hh, wdown, hh.shape[1])
    with pytest.raises(GatedError, match="wdown: shape"):
        removal_delta(hh, wdown[:, :-1], 0)
    with pytest.raises(GatedError, match="positives_mask: values"):
        removal_candidates(hh, col_norms(wdown), np.zeros(hh.shape[0], bool), 3)
    with pytest.raises(GatedError, match="wdown_col_norms: shape"):
        unit_energy(hh, np.ones(3))
    with pytest.raises(GatedError, match="removal: k"):
        removal_candidates(hh, col_norms(wdown), pos, 0)
