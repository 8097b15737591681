"""bench/gpu.py, bench/gpu_solve.py and bench/wfld/gpu.py at small shapes on the CPU (the same code the GPU runs):
results are complete, JSON-ready, checked against the numpy pass, and targets say n/a off-shape."""
from __future__ import annotations

import json

import numpy as np
import pytest

from exactedit.bench.gpu import GpuHeadConfig, render_gpu_head, run_gpu_head
from exactedit.bench.gpu_solve import GpuSolveHeadConfig, render_gpu_solve_head, run_gpu_solve_head


def test_head_bench_small():
    ticks = []
    r = run_gpu_head(GpuHeadConfig(rows=24, vocab=2000, n=256, tile_rows=512, repeats=2, device="cpu",
                                   kl_rows=8, check_rows=6), progress=lambda d, t: ticks.append((d, t)))
    assert [m.precision for m in r.modes] == ["exact", "tf32", "bf16"]
    assert all(len(m.pass_s) == 2 and m.best_s > 0 and m.ratio > 0 for m in r.modes)
    assert r.check["rows"] == 6 and r.check["argmax_agree"] == 1.0
    assert r.check["max_abs_dlse"] < 1e-5 * (1 + r.check["max_abs_lse"]) * 256
    assert [k["precision"] for k in r.kl] == ["tf32", "bf16"]
    assert all(0 <= k["mean_kl"] <= k["max_kl"] < 1e-2 for k in r.kl)
    assert r.passes is None and "n/a" in render_gpu_head(r)
    assert ticks[-1][0] == ticks[-1][1]
    _reports_compiles(r.to_dict())


def _reports_compiles(d: dict) -> None:
    """Every device bench's JSON names the compilation cache and counts the run's compiles."""
    json.dumps(d)
    cache = d["device"]["compilation_cache"]
    assert set(cache) == {"dir", "on"} and isinstance(cache["on"], bool)
    assert d["compiles"]["compiles"] >= 0 and d["compiles"]["compile_s"] >= 0


def test_solve_head_bench_small():
    r = run_gpu_solve_head(GpuSolveHeadConfig(rows=480, docs=6, vocab=1500, n=256, d_lo=16, null_k=4, max_steps=10,
                                              every=5, step_repeats=2, tile_rows=512, device="cpu"))
    assert r.checkpoints == 3 and np.isfinite(r.loss_first_last).all()
    assert set(r.seconds) == {"upload_head", "mix", "pass", "rows", "tracker_upload", "numba_warm", "optimize", "total",
                              "checkpoint"}
    assert set(r.seconds["checkpoint"]) == {"ship", "device_scores", "host_reference_scores"}
    assert r.term_rows["nll"] > 0 and r.term_rows["anchor"] > 0 and r.term_rows["closer"] > 0
    assert [t.param for t in r.step_only] == ["rank 1", "full rows"]
    assert r.passes is None and "n/a" in render_gpu_solve_head(r) and "XLA compiles" in render_gpu_solve_head(r)
    _reports_compiles(r.to_dict())
    assert {"mix", "pass", "optimize"} <= set(r.compiles["by_phase"])


@pytest.mark.parametrize("make,match", [
    (lambda: GpuHeadConfig(n=300), "multiple of the Q6_K block"),
    (lambda: GpuHeadConfig(precisions=("exact", "fp8")), "precisions must be"),
    (lambda: GpuHeadConfig(device="tpu"), "device must be one of"),
    (lambda: GpuSolveHeadConfig(dev_share=1.0), "dev_share"),
])
def test_configs_validate(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_whole_wfld_solve_bench_small():
    """The whole solve twice on the device path (JAX's CPU backend here); off-shape, no verdict."""
    from exactedit.bench.wfld.gpu import render_gpu_solve_wfld, run_gpu_solve_wfld
    from exactedit.bench.wfld.whole import BenchSolveWfldConfig

    r = run_gpu_solve_wfld(BenchSolveWfldConfig(n=256, h=64, vocab=1600, d_lo=32, rows=200, gn_iters=1,
                                                special_rows=16, tile_rows=256), device="cpu")
    assert r.device["platform"] == "cpu" and r.solve_s > 0 and r.solve_again_s > 0
    assert r.scored_rows == 3 * 200 and sum(r.conditions.values()) > 0 and r.dw_rel > 0
    assert set(r.phases) == set(r.phases_again) and "score" in r.phases
    assert r.passes is None and "n/a" in render_gpu_solve_wfld(r)
    _reports_compiles(r.to_dict())
    assert r.compiles_again["compiles"] == 0, r.compiles_again      # the second solve reuses every program
