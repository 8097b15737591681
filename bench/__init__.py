"""Benchmarks behind `exactedit bench ...`, each reported as a ratio against a baseline measured in
the same run (docs/performance.md). They call public library functions only.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "BENCHED": "quant",
    "BenchHeadConfig": "head",
    "BenchSolveHeadConfig": "solve_head",
    "BenchSolveWfldConfig": "solve_wfld",
    "DumpVerifyBenchConfig": "dump_verify",
    "EngineBenchConfig": "engine",
    "GGUFOpenBenchConfig": "gguf_open",
    "GenerateBenchConfig": "generate",
    "GpuHeadConfig": "gpu",
    "GpuSolveHeadConfig": "gpu_solve",
    "QuantBenchConfig": "quant",
    "ServeBenchConfig": "serve.throughput",
    "ShapeCompileBenchConfig": "shape_compile",
    "device_bench": "gpu",
    "format_table": "quant",
    "render_bench_head": "head",
    "render_bench_solve_head": "solve_head",
    "render_bench_solve_wfld": "solve_wfld",
    "render_dump_verify": "dump_verify",
    "render_engine_bench": "engine",
    "render_generate_bench": "generate",
    "render_gguf_open_bench": "gguf_open",
    "render_gpu_head": "gpu",
    "render_gpu_solve_head": "gpu_solve",
    "render_gpu_solve_wfld": "gpu_wfld",
    "render_serve_bench": "serve.throughput",
    "render_shape_compile_bench": "shape_compile",
    "run_bench_head": "head",
    "run_bench_solve_head": "solve_head",
    "run_bench_solve_wfld": "solve_wfld",
    "run_dump_verify_bench": "dump_verify",
    "run_engine_bench": "engine",
    "run_generate_bench": "generate",
    "run_gguf_open_bench": "gguf_open",
    "run_serve_bench": "serve.throughput",
    "run_shape_compile_bench": "shape_compile",
    "run_gpu_head": "gpu",
    "run_gpu_solve_head": "gpu_solve",
    "run_gpu_solve_wfld": "gpu_wfld",
    "run_quant_bench": "quant",
})
