"""The output-head row solver (SPEC.md section 4), one entry:

    solve_rows(HeadInputs, HeadSolveConfig, *, stopping, progress) -> HeadRowsResult

It takes the rows its driver gathered (`gather_head_rows`: one full-vocab pass, `rowdata`) and the
stopping rule it is handed, and builds the train batch (`batch`), the anchors' null space, runs
Adam (`optimize`) with exactly scored checkpoints, ships the chosen step's edit and scores it
(`solve`). Beneath it: the objective J with its analytic gradient (`objective`) and JAX twin
(`objective_jax`), full-row and rank-r null-space parameters (`param`), Adam (`adam`), the edit set
(`editset`), the Q6_K ship of edited rows (`ship`), the split reports (`scores`) and dev tracking
(`track`). The protocol-driven run (protocol, ledger, splits, test once, bundle) is runs.solve.head.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Checkpoint": "solve",
    "EditSet": "editset",
    "HeadInputs": "solve",
    "HeadRows": "ship",
    "HeadRowsResult": "solve",
    "HeadSolveConfig": "config",
    "HeadSolveError": "config",
    "RowData": "rowdata",
    "Shipped": "ship",
    "SplitReport": "scores",
    "check_head_tail": "solve:check_tail",
    "choose_edit_set": "editset",
    "gather_head_rows": "solve:gather_rows",
    "head_bundle_plan": "solve:bundle_plan",
    "load_head_rows": "ship",
    "numpy_step": "solve",
    "objective_grad": "objective",
    "optimize": "solve",
    "rejected_openers": "batch",
    "resolve_head_tokens": "editset:resolve_tokens",
    "solve_rows": "solve",
})
