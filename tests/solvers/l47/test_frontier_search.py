"""The strength choice's coordinate search (solvers/l47/frontier.py `search_strengths`), used when
the grid's per-phrase combinations are too many to measure (GRID_LIMIT): on separable worlds (each
phrase's cut and word collateral depend on its own strength only, as the gated edit's units nearly
are) it finds the combination the full product finds, measuring about P x G points instead of G^P;
the steps compare the phrase's own cut; a failing start moves down. Then choose_strength on the
synthetic world with the limit forced low."""
from __future__ import annotations

import dataclasses
import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exactedit.solvers.l47 import frontier as fr_mod
from exactedit.solvers.l47.frontier import BarD, Point, choose, choose_strength, search_strengths
from tests.solvers.l47.test_problem import CFG, world  # noqa: F401 (the module-scoped fixture)

PICK = dict(min_mean=-0.05, max_low_share=0.1)


def _world(gain, harm):
    """Phrase p at strength s cuts 1 - exp(-gain[p] s) and costs its word a mean dlogp of
    -harm[p] s (no share below -0.1): separable."""
    def point(c):
        cut = {p: 1.0 - 2.718281828 ** (-gain[p] * s) for p, s in enumerate(c)}
        mean = {p: -harm[p] * s for p, s in enumerate(c)}
        return Point(tuple(c), cut, None, mean, {p: 0.0 for p in mean}, {p: 20 for p in mean})
    calls = []

    def measured(combos):
        calls.append(len(combos))
        return [point(c) for c in combos]
    return measured, calls


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.floats(0.2, 4.0), st.floats(0.0, 0.2)), min_size=2, max_size=4),
       st.sampled_from([(0.5, 1.0, 2.0), (0.25, 1.0), (0.5, 1.0, 2.0, 4.0)]))
def test_on_separable_worlds_the_search_finds_the_products_choice(phrases, grid):
    gain, harm = [g for g, _ in phrases], [h for _, h in phrases]
    P = len(phrases)
    measured, _ = _world(gain, harm)
    full = list(itertools.product(grid, repeat=P))
    want, want_ok = choose(measured(full), **PICK)
    measured, calls = _world(gain, harm)
    told = []
    pts, got, ok = search_strengths([(g,) * P for g in grid], grid, measured, progress=lambda d, t: told.append((d, t)),
                                    **PICK)
    assert ok == want_ok
    # progress: once per batch (the start, then each phrase's step), the points measured so far
    # against the most the search can still measure; it ends at done == total
    assert len(told) == 1 + P and told[0] == (len(grid), len(grid) + P * (len(grid) - 1))
    done = [d for d, _ in told]
    assert done == sorted(done) and set(itertools.accumulate(calls)) <= set(done) and told[-1] == (len(pts), len(pts))
    assert all(d <= t for d, t in told) and all(a[1] >= b[1] for a, b in zip(told, told[1:]))
    if want_ok:
        # per phrase: the weakest strength whose own cut is within CUT_TIE of its best passing cut
        # (the product compares the mean cut instead, so its ties may fall elsewhere)
        for p in range(P):
            cut = lambda g: 1.0 - 2.718281828 ** (-gain[p] * g)  # noqa: E731
            passing = [g for g in grid if -harm[p] * g >= PICK["min_mean"]]
            top = max(cut(g) for g in passing)
            assert got.strength[p] == min(g for g in passing if cut(g) >= top - fr_mod.CUT_TIE), (got, p)
            assert got.cut[p] >= want.cut[p] - 2 * fr_mod.CUT_TIE
    assert len(pts) <= len(grid) + P * (len(grid) - 1) and sum(calls) == len(pts)
    assert len({p.strength for p in pts}) == len(pts)                   # no point measured twice


def test_a_step_compares_the_phrases_own_cut_and_a_failing_start_moves_down():
    # phrase 0 is cheap and cuts more with strength; phrase 1's word fails above 0.5
    measured, _ = _world([1.0, 1.0], [0.0, 0.06])
    _, best, ok = search_strengths([(g, g) for g in (0.5, 1.0, 2.0)], (0.5, 1.0, 2.0), measured, **PICK)
    assert ok and best.strength == (2.0, 0.5)
    # with 30 phrases the mean cut would call phrase 0's gain a tie (CUT_TIE 0.01 over 30 phrases)
    measured, _ = _world([1.0] * 30, [0.0] + [0.06] * 29)
    pts, best, ok = search_strengths([(g,) * 30 for g in (0.5, 1.0, 2.0)], (0.5, 1.0, 2.0), measured, **PICK)
    assert ok and best.strength == (2.0,) + (0.5,) * 29 and len(pts) <= 3 + 30 * 2
    # nothing passes anywhere: each phrase ends at its weakest
    measured, _ = _world([1.0, 1.0], [0.2, 0.2])
    _, best, ok = search_strengths([(g, g) for g in (0.5, 1.0)], (0.5, 1.0), measured, **PICK)
    assert not ok and best.strength == (0.5, 0.5)
    # capped phrases never go above their cap
    measured, _ = _world([1.0, 1.0], [0.0, 0.0])
    cap = lambda c: (c[0], min(c[1], 0.3))  # noqa: E731
    pts, best, ok = search_strengths([cap((g, g)) for g in (0.5, 1.0)], (0.5, 1.0), measured, cap, **PICK)
    assert best.strength == (1.0, 0.3) and all(p.strength[1] <= 0.3 for p in pts)


def test_choose_strength_searches_when_the_product_is_too_large(world, monkeypatch):  # noqa: F811
    w = world
    dev, coll = w["named"]["train"] + w["named"]["heldout"], w["named"]["collateral"]
    cfg = dataclasses.replace(CFG, strength_grid=(1.0, 0.5, 0.25))
    P = len(w["mining"].phrases)
    _, full = choose_strength(cfg, w["tail"], w["problem"], w["mining"], dev, coll, BarD(min_uses=1))
    assert full["search"] == {"kind": "grid", "points": 3 ** P}
    monkeypatch.setattr(fr_mod, "GRID_LIMIT", 1)
    _, out = choose_strength(cfg, w["tail"], w["problem"], w["mining"], dev, coll, BarD(min_uses=1))
    assert out["search"]["kind"] == "coordinate" and out["search"]["points"] <= 3 + P * 2
    assert out["search"]["combinations"] == 3 ** P
    # every point it measured is a point of the full frontier, scored identically
    by = {tuple(sorted(p["strength"].items())): p for p in full["frontier"]}
    for p in out["frontier"]:
        assert p == by[tuple(sorted(p["strength"].items()))]
    chosen = tuple(sorted(out["chosen"].items()))
    assert chosen in by and any(tuple(sorted(p["strength"].items())) == chosen for p in out["collateral_frontier"])
    from exactedit.solvers.l47.report import strength_lines

    assert f"coordinate search: {out['search']['points']} points measured of the grid's {3 ** P}" in "\n".join(
        strength_lines(out))
