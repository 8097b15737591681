"""`exactedit bench quant`: a tiny run completes, both sides produce identical bytes, JSON is sound."""
from __future__ import annotations

import json

import pytest

from exactedit.bench.quant import BENCHED, QuantBenchConfig, format_table, run_quant_bench
from exactedit.errors import QuantError
from tests import oracles


def test_tiny_run_is_identical_to_ggml_and_reports_json():
    ggml = oracles.load()
    steps = []
    result = run_quant_bench(QuantBenchConfig(rows=8, cols=512, repeats=1),
                             progress=lambda done, total: steps.append((done, total)), ggml=ggml)
    assert [(r.qtype, r.op) for r in result.rows] == [
        (q, op) for q in BENCHED for op in ("quantize", "dequantize")]
    assert all(r.identical for r in result.rows)
    assert all(r.ratio == pytest.approx(r.ours_rows_per_s / r.ggml_rows_per_s) for r in result.rows)
    assert steps[-1] == (4 * len(BENCHED), 4 * len(BENCHED))
    assert "Q6_K" in format_table(result)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["config"]["rows"] == 8 and len(data["results"]) == 2 * len(BENCHED)


@pytest.mark.parametrize("kwargs,match", [
    ({"rows": 0}, "rows"), ({"threads": 10_000}, "NUMBA_NUM_THREADS"),
    ({"cols": 100}, "multiple of 256"), ({"qtypes": ("Q5_1",)}, "not benchmarked"),
    ({"qtypes": ()}, "at least one")])
def test_config_is_validated(kwargs, match):
    with pytest.raises(QuantError, match=match):
        QuantBenchConfig(**kwargs)
