"""The WFLD anti-slop edit of the last layer's down projection (SPEC.md section 5): prefix-exact
mining (`mining`), natural alternatives (`alternatives`), the vector-Jacobian products (`jacobian`),
the K x K Gram solve and Gauss-Newton loop (`gauss_newton`), the problem a solve stands on
(conditions, targets, null basis, background metric, shipper: `problem`), the solve and its
summaries (`solve`), the constraint-keeping ship (`ship`), the exact rescore (`rescore`) and the
report (`report`). The phrase matcher is solvers.phrases; the protocol-driven run is
evals.runs.wfld_run.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "WfldConfig": "config",
    "WfldError": "config",
    "build_report": "report",
    "format_report": "report",
    "linearize": "jacobian",
    "WfldProblem": "problem",
    "build_problem": "problem",
    "parse_phrase_margin": "config",
    "parse_same_sense": "config",
    "score_traces": "rescore",
    "solve_min_norm": "gauss_newton",
})
