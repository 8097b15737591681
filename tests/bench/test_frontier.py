"""`exactedit bench frontier` at a tiny shape through the CLI: both searches measure the same points
and choose the same strengths, their values agree within the line path's tolerance, the line
search makes fewer head passes than it measures points, and the JSON carries every field (no
timing threshold: the machine may be shared); the config refuses bad shapes."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from exactedit.bench.wfld.frontier import BenchFrontierConfig
from exactedit.solvers.tail.passes.line_pass import LINE_TOL


def test_tiny_run_agrees_and_reports():
    from exactedit import cli

    res = CliRunner().invoke(cli.main, ["bench", "frontier", "--n", "256", "--h", "64", "--vocab", "3000",
                                        "--rows", "40", "--phrases", "3", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["points"] == 6 + 3 * 5                       # the shared start, then 5 more strengths a phrase
    assert got["same_choice"] is True
    assert got["max_cut_diff"] <= LINE_TOL and got["max_mean_diff"] <= LINE_TOL
    assert 0 < got["line_passes"] < got["points"]
    for key in ("direct_s", "line_s", "ratio"):
        assert math.isfinite(got[key]) and got[key] > 0
    assert got["ratio"] == pytest.approx(got["direct_s"] / got["line_s"])
    assert got["passes"] == (got["same_choice"] and got["ratio"] >= got["target_ratio"])


@pytest.mark.parametrize("bad", [dict(n=100), dict(rows=3, phrases=2), dict(grid=(1.0,)), dict(phrases=0),
                                 dict(conditions=0)])
def test_bad_shapes_are_refused(bad):
    with pytest.raises(ValueError):
        BenchFrontierConfig(**bad)
