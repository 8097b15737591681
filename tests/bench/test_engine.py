"""`exactedit bench engine`: a tiny run completes for both weight types, the engine pass's tile is
bitwise the reference kernel's, and the config is validated."""
from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from exactedit.bench.engine import EngineBenchConfig, render_engine_bench, run_engine_bench
from exactedit.errors import QuantError


@pytest.mark.parametrize("qtype,ubatch", [("Q6_K", 0), ("Q6_K", 4), ("Q8_0", 0)])
def test_tiny_run(qtype, ubatch):
    r = run_engine_bench(EngineBenchConfig(rows=9, vocab=700, n=256, qtype=qtype, ubatch=ubatch,
                                           tile_rows=256))
    assert r.bitwise_vs_reference
    assert r.exact_s > 0 and r.engine_s > 0 and r.ratio == pytest.approx(r.engine_s / r.exact_s)
    assert r.meets_target == (r.ratio <= 1.5)
    assert "ratio engine / exact" in render_engine_bench(r)
    assert r.to_dict()["config"]["qtype"] == qtype


def test_cli_json():
    from exactedit import cli

    res = CliRunner().invoke(cli.main, ["bench", "engine", "--rows", "8", "--vocab", "300", "--n", "256",
                                        "--json"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{"):])
    assert data["bench"] == "engine" and data["bitwise_vs_reference"] is True


@pytest.mark.parametrize("kwargs,match", [({"rows": 0}, "rows"), ({"qtype": "Q4_K"}, "qtype"),
                                          ({"n": 100}, "multiple"), ({"ubatch": -1}, "ubatch")])
def test_config_is_validated(kwargs, match):
    with pytest.raises(QuantError, match=match):
        EngineBenchConfig(**kwargs)


def test_micro_batch_layout():
    assert EngineBenchConfig(rows=20, ubatch=8).ubatch_sizes() == (8, 8, 4)
    assert EngineBenchConfig(rows=20).ubatch_sizes() == (20,)
