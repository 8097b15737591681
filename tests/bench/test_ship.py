"""`exactedit bench ship` at a tiny shape through the CLI: both sides ship the same bytes, the
plans agree, the JSON carries every field (no timing threshold: the machine may be shared); the
config refuses bad shapes."""
from __future__ import annotations

import json
import math

import pytest
from click.testing import CliRunner

from exactedit.bench.wfld.ship import BenchShipConfig


def test_tiny_run_agrees_and_reports():
    from exactedit import cli

    res = CliRunner().invoke(cli.main, ["bench", "ship", "--h", "512", "--rows", "6", "--extra", "40", "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    assert got["same_bytes"] is True and got["max_plan_rel"] < 1e-10
    for key in ("plan_general_s", "plan_upper_s", "ship_general_s", "ship_upper_s", "ship_ratio", "plan_ratio"):
        assert math.isfinite(got[key]) and got[key] > 0
    assert got["ship_ratio"] == pytest.approx(got["ship_general_s"] / got["ship_upper_s"])
    assert got["passes"] == (got["same_bytes"] and got["ship_ratio"] >= got["target_ratio"])


@pytest.mark.parametrize("bad", [dict(h=100), dict(rows=0), dict(extra=0), dict(h=True)])
def test_bad_shapes_are_refused(bad):
    with pytest.raises(ValueError):
        BenchShipConfig(**bad)
