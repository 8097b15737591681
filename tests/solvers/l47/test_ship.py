"""Shipping the WFLD edit: the metric's normalization, the feedback shipper against plain
rounding on a Q6_K tensor, and the solve's shipping report."""
from __future__ import annotations

import numpy as np
import pytest

from exactedit import quant
from exactedit.runs.solve.wfld import WfldInputs, solve_wfld
from exactedit.solvers.l47 import ship
from exactedit.solvers.l47 import gauss_newton as wfld
from exactedit.solvers.l47.config import WfldConfig, WfldError
from exactedit.solvers.l47.report import format_report
from tests.solvers.l47.synth import build_world


def test_modes():
    assert ship.uses_feedback("auto", "Q6_K") and not ship.uses_feedback("auto", "Q8_0")
    assert ship.uses_feedback("feedback", "Q8_0") and not ship.uses_feedback("round", "Q6_K")
    assert not ship.uses_feedback("auto", "BF16")
    with pytest.raises(WfldError, match="block scales"):
        ship.uses_feedback("feedback", "BF16")
    with pytest.raises(ValueError, match="ship must be one of"):
        WfldConfig(ship="gptq")


def test_metric_terms_are_relative_squared_errors():
    """sum_r W0_r^T H W0_r = n (background: the weights themselves are an error of size 1 per
    row) + hold_weight * n (each held direction sees all of W0 h)."""
    rng = np.random.default_rng(0)
    n, h = 6, 40
    w0 = rng.standard_normal((n, h))
    hh = rng.standard_normal((30, h))
    held = rng.standard_normal((3, h))
    for weight in (0.0, 10.0):
        metric = ship.shipping_metric(hh, 0.1, np.concatenate([held, np.zeros((1, h))]), w0, weight)
        H = metric.H
        C = wfld.background_metric(hh, 0.1)
        bg = np.einsum("rh,hk,rk->", w0, C, w0)
        H_bg = np.diag(metric.d) + metric.F[:30].T @ metric.F[:30]
        np.testing.assert_allclose(H_bg, C * w0.shape[0] / bg, rtol=1e-10)  # the solve's metric, scaled
        total = np.einsum("rh,hk,rk->", w0, H, w0)
        assert total == pytest.approx(n * (1 + weight), rel=1e-10)


def _q6k_problem(seed=0, rows=24, h=512, held=6):
    rng = np.random.default_rng(seed)
    raw0 = quant.quantize((rng.standard_normal((rows, h)) * 0.02).astype(np.float32), "Q6_K")
    w0 = quant.dequantize(raw0, "Q6_K", h).astype(np.float64)
    hh = rng.standard_normal((held, h))
    P = np.eye(h) - hh.T @ np.linalg.solve(hh @ hh.T, hh)     # an edit with dW hh = 0 exactly
    dW = (rng.standard_normal((rows, h)) * 2e-3) @ P
    return raw0, w0, dW, hh, rng.standard_normal((200, h))


def test_feedback_shipper_keeps_the_held_directions():
    raw0, w0, dW, hh, bg = _q6k_problem()
    metric = ship.shipping_metric(bg, 0.01, hh, w0, 1e4)
    fb = ship.FeedbackShipper(raw0, "Q6_K", 512, quant.dequantize, metric, sweeps=2)
    plain = wfld.Shipper(raw0, "Q6_K", 512, quant.dequantize)
    raw_f, view_f = fb(w0 + dW)
    raw_p, view_p = plain(w0 + dW)
    np.testing.assert_array_equal(view_f, quant.dequantize(raw_f, "Q6_K", 512))
    rel = lambda view: np.linalg.norm((view - w0) @ hh.T, axis=0) / np.linalg.norm(w0 @ hh.T, axis=0)  # noqa: E731
    # measured: ~6e-4 with feedback vs ~2e-2 rounding each weight (h = 512, 6 held directions)
    assert rel(view_f).max() * 10 < rel(view_p).max()
    # the edit itself survives: the shipped change keeps most of dW's size and direction
    e = view_f - w0
    assert np.sum(e * dW) / np.linalg.norm(dW) ** 2 > 0.5
    # rows the edit does not touch keep their bytes; no edit at all ships the original
    w1 = w0.copy()
    w1[3] += dW[3]
    raw1, _ = fb(w1)
    assert np.array_equal(np.delete(raw1, 3, axis=0), np.delete(raw0, 3, axis=0))
    assert np.array_equal(fb(w0)[0], raw0)


def test_solve_reports_residuals_as_solved_and_shipped(tmp_path):
    w = build_world(tmp_path)
    inputs = WfldInputs(str(w["model"]), str(w["phrases"]), (str(w["train"]),), (str(w["heldout"]),),
                        (str(w["collateral"]),), (str(w["anchors"]),))
    res = solve_wfld(WfldConfig(gn_iters=2, special_rows=48, tile_rows=64, ship="feedback"), inputs, tmp_path / "b")
    sh = res.report["shipping"]
    assert sh["feedback"] and sh["type"] == "Q8_0"
    assert sh["objective"]["shipped"] <= sh["objective"]["ggml"]
    assert {x["word"] for x in sh["words"]} == {" end", " than", " away"}
    for x in sh["words"]:
        assert x["held"]["solved"]["max_rel"] < 1e-9 and x["held"]["shipped"]["max_rel"] is not None
    assert {"rejected", "alternative", "special@target", "special@anchor"} <= set(sh["holds"])
    alts = res.report["alternatives"]
    assert len(alts["positions"]) == res.report["conditions"]["rejected"]
    for pos in alts["positions"]:
        assert pos["raised"] and all(c["p_base"] >= 0.01 for c in pos["raised"][1:])
        for v in pos["variants"]:  # a variant counts as rejected: it moves with the rejected token
            assert v["dlogit"] == pytest.approx(pos["rej_dlogit"], abs=0.05)
    assert any(pos["variants"] for pos in alts["positions"])
    text = format_report(res.report)
    assert "shipping (Q8_0, error feedback" in text and "raised / moved with the rejected" in text
