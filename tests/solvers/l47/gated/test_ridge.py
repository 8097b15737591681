"""The gate's ridge chosen on dev (solvers/l47/gated/ridge.py): the dev score by hand, the choice
is the table's best (ties to the smaller ridge) and its gate is `fit_gate`'s at that ridge bit for
bit, a world where the near-hard-margin gate overfits picks a larger ridge and leaks less on
unseen rows, no dev positive keeps the first ridge, and the errors name the field."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit.solvers.l47.gated import DesignConfig, GateConfig, GatedError, choose_ridge, fit_gate
from exactedit.solvers.l47.gated.ridge import MIN_COVERAGE, dev_score
from tests.solvers.l47.gated.synth import planted


def test_the_dev_score_by_hand():
    a = np.array([2.0, 1.0, 0.5, 0.0, 0.3, -0.4, 0.0])
    y = np.array([True, True, True, False, False, False, False])
    s = dev_score(a, y, target=2.0)
    cov = (1.0 + 0.5 + 0.25) / 3
    leak = (0.15 ** 2 + 0.2 ** 2) / 3
    assert s["coverage"] == pytest.approx(cov, rel=1e-15) and s["leak"] == pytest.approx(leak, rel=1e-15)
    assert s["score"] == pytest.approx(cov - leak, rel=1e-15)
    assert s["leak_max"] == pytest.approx(0.2) and (s["n_pos"], s["n_neg"]) == (3, 4)
    none = dev_score(a[3:], y[3:], target=2.0)
    assert none["score"] is None and none["coverage"] is None and none["leak_energy"] == pytest.approx(0.0625)
    with pytest.raises(GatedError, match="target"):
        dev_score(a, y, target=0.0)


def _overfit_world(seed: int, shifted: bool = True):
    """The planted label along e_0 overlaps (negatives up to 1.5, positives from 1.0), and a
    direction e_2 nearly constant on the fit's rows (std 0.02) sits 0.1 higher on the positives: a
    near-hard-margin gate leans on e_2 with a large weight, and the unseen rows where e_2 is not
    constant (every 50th negative at 1.0, `shifted`) fire it far off its contexts, as Qwen's
    "you can" unit did (15 times its contexts' median on a held-out row)."""
    x, y, _, _ = planted(seed, pos=(1.0, 3.0), neg=(-3.0, 1.5))
    rng = np.random.default_rng(seed + 100)
    x[:, 2] = rng.normal(size=y.size) * 0.02 + np.where(y, 0.1, 0.0)
    if shifted:
        x[np.flatnonzero(~y)[::50], 2] = 1.0
    return x, y


def test_the_choice_is_the_tables_best_and_its_gate_is_fit_gates():
    x, y = _overfit_world(0, shifted=False)
    xd, yd = _overfit_world(1)
    design = DesignConfig(target=3.0)
    rc = choose_ridge(x, y, xd, yd, (1e-3, 1e-2, 1e-1, 1.0), GateConfig(), design)
    scored = [r for r in rc.table if r.get("score") is not None]
    assert rc.by == "dev" and len(scored) >= 2
    best = max(scored, key=lambda r: (r["score"], -r["lam"]))
    assert rc.lam == best["lam"]
    ref = fit_gate(x, y, GateConfig(lam=rc.lam))
    np.testing.assert_array_equal(rc.gate.g, ref.g)
    assert rc.summary()["lam"] == rc.lam and len(rc.summary()["table"]) == 4


def test_an_overfitting_gate_gives_way_to_a_larger_ridge_that_leaks_less_on_unseen_rows():
    x, y = _overfit_world(0, shifted=False)
    xd, yd = _overfit_world(1)
    xt, yt = _overfit_world(2)                      # rows neither the fit nor the choice saw
    design = DesignConfig(target=1.0)
    rc = choose_ridge(x, y, xd, yd, (1e-3, 1e-2, 1e-1, 1.0), GateConfig(), design)
    hard = choose_ridge(x, y, None, None, (1e-3,), GateConfig(), design)
    assert rc.lam == 1.0 and rc.by == "dev"
    table = {r["lam"]: r for r in rc.table}
    assert table[1e-3]["leak_max"] > 10 * table[1.0]["leak_max"]
    on_test = [dev_score(u.activation(xt), yt, 1.0) for u in (rc.unit, hard.unit)]
    assert on_test[0]["leak_max"] < 0.1 * on_test[1]["leak_max"] and on_test[0]["score"] > on_test[1]["score"]
    assert on_test[0]["coverage"] > 0.9 * on_test[1]["coverage"]


def test_without_a_dev_positive_the_first_ridge_is_kept():
    x, y, _, _ = planted(0)
    xd, yd, _, _ = planted(7)
    rc = choose_ridge(x, y, xd, np.zeros_like(yd), (1e-2, 1e-3), GateConfig(), DesignConfig())
    assert rc.by == "first" and rc.lam == 1e-2
    assert all(r["score"] is None and r["leak_energy"] >= 0 for r in rc.table)
    rc = choose_ridge(x, y, None, None, (1e-1,), GateConfig(), DesignConfig())
    assert rc.by == "first" and rc.lam == 1e-1 and rc.table == ({"lam": 1e-1},)


def test_a_ridge_that_puts_a_positive_below_zero_is_left_out_with_the_reason():
    x, y, _, _ = planted(0, pos=(0.05, 4.0), neg=(-3.0, 0.0))
    rc = choose_ridge(x, y, None, None, (1e-3, 1e4), GateConfig(), DesignConfig())
    bad = [r for r in rc.table if "error" in r]
    assert rc.lam == 1e-3
    if bad:                                               # the heavy ridge's gate misses a positive
        assert "<= 0" in bad[0]["error"]


@pytest.mark.parametrize("lams, field", [((), "lams"), ((0.0,), "lams"), ((float("nan"),), "lams")])
def test_bad_ridges_are_refused_by_name(lams, field):
    x, y, _, _ = planted(0)
    with pytest.raises(GatedError, match=field):
        choose_ridge(x, y, None, None, lams)


def test_dev_rows_of_another_width_are_refused():
    x, y, _, _ = planted(0)
    with pytest.raises(GatedError, match="x_dev"):
        choose_ridge(x, y, x[:, :5], y, (1e-3,))


def test_a_ridge_that_quiets_the_unit_everywhere_is_not_chosen_for_its_small_leak():
    """The score weighs what a ridge reaches against what it leaks: where no ridge reaches dev's
    contexts, the leak alone does not choose (the largest ridge would win by firing nowhere)."""
    x, y = _overfit_world(0, shifted=False)
    xd, yd = _overfit_world(1)
    rc = choose_ridge(x, y, xd, yd, (1e-3, 1.0), GateConfig(), DesignConfig(target=1.0))
    top = max(r["coverage"] for r in rc.table)
    assert top >= MIN_COVERAGE and rc.by == "dev"
    xd2 = xd.copy()
    xd2[yd, 0] = -2.0                                     # dev's contexts unlike the fit's: reached by no ridge
    rc2 = choose_ridge(x, y, xd2, yd, (1e-3, 1.0), GateConfig(), DesignConfig(target=1.0))
    assert max(r["coverage"] for r in rc2.table) < MIN_COVERAGE and rc2.by == "first" and rc2.lam == 1e-3
