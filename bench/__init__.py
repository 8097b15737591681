"""Benchmarks behind `exactedit bench ...`, each reported as a ratio against a baseline measured in
the same run (docs/performance.md). They call public library functions only.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "run_bench_head": "head",
    "run_bench_solve_head": "solve_head",
    "run_bench_solve_wfld": "solve_wfld",
    "run_gguf_open_bench": "gguf_open",
    "run_quant_bench": "quant",
})
