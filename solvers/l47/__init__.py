"""The last layer's edits ("l47": the last layer, layer 47 of the production model; layer 27 of
Qwen2.5-Coder-1.5B, 29 of SmolLM2-135M), one entry per edit kind:

    solve_dense(DenseInputs, WfldConfig) -> DenseResult     the dense edit of the FFN's down projection
    gated.solve_gated(GatedInputs, WfldConfig) -> GatedResult   one unit of the FFN rewritten as a
                                                   detector of the phrase's context (solvers/l47/gated)

The WFLD anti-slop edit of the last layer's down projection (SPEC.md section 5): prefix-exact
mining (`mining`), natural alternatives (`alternatives`), the vector-Jacobian products (`jacobian`),
the K x K Gram solve and Gauss-Newton loop (`gauss_newton`), the problem a solve stands on
(conditions, targets, null basis, background metric, shipper: `problem`), the strength frontier
and its choice on dev (`frontier`; along lines: solvers/tail/passes/line_pass.py), the solve and
its summaries (`solve`), the constraint-keeping ship (`ship`), the exact rescore (`rescore`) and the
report (`report`). The phrase matcher is solvers.phrases; the protocol-driven run is
runs.solve.wfld.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "BarD": "frontier",
    "DenseInputs": "solve",
    "DenseResult": "solve",
    "solve_dense": "solve",
    "WfldConfig": "config",
    "WfldError": "config",
    "build_report": "report",
    "format_report": "report",
    "linearize": "jacobian",
    "WfldProblem": "problem",
    "build_problem": "problem",
    "parse_phrase_margin": "config",
    "parse_same_sense": "config",
    "rescore_parts": "rescore",
    "solve_min_norm": "gauss_newton",
})
