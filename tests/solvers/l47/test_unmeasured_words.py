"""A banned word dev cannot measure (fewer than BarD.min_uses legitimate uses on the held-out traces)
is no word the strength rule may lower freely (issues 38.11 and 43): `choose_strength` leaves it out
of the choice, never takes a phrase ending in it above `WfldConfig.unmeasured_strength`, still
returns a strength where dev has no use at all (it used to raise after the whole run's generation),
and says so (`unmeasured`, `limited`, `passed_d` false); the text report names the word. On the
synthetic world (tests/solvers/l47/synth.py) the held-out trace gives each word fewer than 5 uses."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from exactedit.solvers.l47 import frontier as fr_mod
from exactedit.solvers.l47.config import WfldConfig
from exactedit.solvers.l47.frontier import BarD, Point, choose, choose_strength
from exactedit.solvers.l47.report import strength_lines
from tests.solvers.l47.test_problem import CFG, world  # noqa: F401 (the module-scoped fixture)

GRID = dataclasses.replace(CFG, strength_grid=(1.0, 0.5))


def _uses(w, traces) -> np.ndarray:
    fr = fr_mod.frontier_rows(traces, w["mining"])
    return np.bincount(fr.word, minlength=len(w["mining"].words)) if fr is not None else np.zeros(len(w["mining"].words))


def test_choose_leaves_the_ignored_words_out():
    pts = [Point((1.0,), {0: 0.9}, 0.9, {0: -0.5, 1: 0.0}, {0: 0.6, 1: 0.0}, {0: 2, 1: 9}),
           Point((0.5,), {0: 0.4}, 0.4, {0: -0.2, 1: 0.0}, {0: 0.3, 1: 0.0}, {0: 2, 1: 9})]
    best, passed = choose(pts, min_mean=-0.05, max_low_share=0.1)
    assert not passed and best.strength == (0.5,)              # word 0 fails everywhere: the weakest
    best, passed = choose(pts, min_mean=-0.05, max_low_share=0.1, ignore=[0])
    assert passed and best.strength == (1.0,)                  # word 0 not judged: the largest cut
    assert BarD().min_uses == 5 and WfldConfig().unmeasured_strength == 0.3


def test_choose_drops_points_above_the_kl_budget():
    """A point whose measured mean KL is above `max_kl` does not pass; unmeasured (None) is not judged."""
    import dataclasses as dc

    pts = [Point((2.0,), {0: 0.99}, 0.99, {1: 0.0}, {1: 0.0}, {1: 9}, kl={"dev chat": 0.008}),
           Point((1.0,), {0: 0.88}, 0.88, {1: 0.0}, {1: 0.0}, {1: 9}, kl={"dev chat": 0.003})]
    best, passed = choose(pts, min_mean=-0.05, max_low_share=0.1)
    assert passed and best.strength == (2.0,)
    best, passed = choose(pts, min_mean=-0.05, max_low_share=0.1, max_kl={"dev chat": 0.005})
    assert passed and best.strength == (1.0,)
    best, passed = choose([dc.replace(p, kl=None) for p in pts], min_mean=-0.05, max_low_share=0.1,
                          max_kl={"dev chat": 0.005})
    assert passed and best.strength == (2.0,)
    assert "kl" in pts[0].to_json(["p"], ["w0", "w1"]) and "kl" not in dc.replace(pts[0], kl=None).to_json(
        ["p"], ["w0", "w1"])


def test_the_synthetic_dev_does_not_measure_its_words(world):  # noqa: F811
    assert _uses(world, world["named"]["heldout"]).max() < BarD().min_uses


def test_no_dev_use_at_all_still_gives_a_strength_held_to_the_cautious_one(world):  # noqa: F811
    """The 31-minute repro: no legitimate use on dev. Old: WfldError "choosing the strength on dev
    needs legitimate uses ... (none found)". New: every phrase at the strongest grid point at or
    below unmeasured_strength, flagged."""
    w = world
    problem, out = choose_strength(GRID, w["tail"], w["problem"], w["mining"], [], w["named"]["collateral"], BarD())
    phrases = list(w["mining"].phrases)
    assert out["chosen"] == {p: pytest.approx(0.3) for p in phrases}
    assert out["passed_d"] is False and out["frontier"] == []
    assert set(out["unmeasured"]) == {w["tail"].tokens.piece(int(x)) for x in w["mining"].words}
    assert all(n == 0 for n in out["unmeasured"].values()) and out["limited"] == {p: 0.3 for p in phrases}
    assert out["min_uses"] == 5 and len(out["collateral_frontier"]) == 1     # reported on the collateral
    np.testing.assert_allclose(problem.cond.target, fr_mod.scaled(w["problem"], [0.3] * len(phrases)).cond.target)
    json.dumps(out, allow_nan=False)
    text = "\n".join(strength_lines(out))
    assert "NOT MEASURED on dev" in text and "0 uses on dev" in text and "<= 0.3" in text
    assert "no dev row to choose on" in text and "NO combination passes" not in text


def test_a_word_with_few_dev_uses_is_not_judged_and_its_phrases_are_capped(world):  # noqa: F811
    """Uses on dev, but fewer than min_uses: the frontier is read, the word is not judged, and no
    phrase ending in it goes above the cap (here below every grid point: the cap itself)."""
    w = world
    dev, coll = w["named"]["heldout"], w["named"]["collateral"]
    _, out = choose_strength(GRID, w["tail"], w["problem"], w["mining"], dev, coll, BarD())
    mining = w["mining"]
    short = [wi for wi, n in enumerate(_uses(w, dev)) if n < 5]
    limited = {mining.phrases[p] for wi in short for p in mining.word_phrases[wi]}
    assert limited and set(out["limited"]) == limited and out["passed_d"] is False
    assert all(out["chosen"][p] <= 0.3 + 1e-12 for p in limited)
    assert all(max(pt["strength"][p] for pt in out["frontier"]) <= 0.3 + 1e-12 for p in limited)
    # grid (1, 0.5, 0.2), cap 0.6: the point above the cap is taken at it, those below kept
    cfg = dataclasses.replace(GRID, strength_grid=(1.0, 0.5, 0.2), unmeasured_strength=0.6)
    _, out = choose_strength(cfg, w["tail"], w["problem"], w["mining"], dev, coll, BarD())
    assert {pt["strength"][p] for pt in out["frontier"] for p in limited} == {0.6, 0.5, 0.2}


def test_with_every_word_measured_the_rule_is_the_old_one(world):  # noqa: F811
    """min_uses 1 (every word with a dev use is measured): the choice is choose() over every grid
    point, nothing limited, as before."""
    w = world
    dev, coll = w["named"]["train"] + w["named"]["heldout"], w["named"]["collateral"]
    bar = BarD(min_uses=1)
    assert _uses(w, dev).min() >= 1
    _, out = choose_strength(GRID, w["tail"], w["problem"], w["mining"], dev, coll, bar)
    assert out["unmeasured"] == {} and out["limited"] == {}
    assert len(out["frontier"]) == 2 ** len(w["mining"].phrases)
    ok = [p for p in out["frontier"] if all(v["mean"] >= bar.min_mean and v["low"] <= bar.max_low_share
                                            for v in p["collateral"].values())]
    assert out["passed_d"] is bool(ok) and out["measured_passed_d"] is bool(ok)
    text = "\n".join(strength_lines(out))
    assert "NOT MEASURED" not in text


def test_solve_wfld_without_held_out_uses_ships_with_the_words_flagged(tmp_path):
    """solve wfld with a strength grid and no held-out trace: a bundle, not an error; the report's
    strength section names every word, each phrase at 0.3; bar (d) fails as not measured where
    the collateral has fewer than 5 uses, and the verdict is not a pass."""
    from exactedit.runs.solve.wfld import WfldInputs, solve_wfld, wfld_solve_report
    from tests.solvers.l47.synth import build_world

    (tmp_path / "w").mkdir()
    w = build_world(tmp_path / "w")
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (), (str(w["collateral"]),),
                        (str(w["anchors"]),))
    r = solve_wfld(GRID, inputs, tmp_path / "bundle")
    st = r.report["strength"]
    assert set(st["chosen"].values()) == {0.3} and st["passed_d"] is False and st["unmeasured"]
    d = [b for b in r.report["bars"] if b["bar"] == "(d)"]
    short = [b for b in d if b["n"] < 5]
    assert short and all(b["pass"] is False and "not measured" in b["label"] for b in short)
    assert r.verdict == "fail"
    text = wfld_solve_report(r)[1]
    assert "NOT MEASURED on dev" in text and "not measured (" in text
