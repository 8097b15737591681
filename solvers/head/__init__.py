"""The output-head row solver's math (SPEC.md section 4): the objective J with its analytic gradient
(`objective`) and JAX twin (`objective_jax`), full-row and rank-r null-space parameters (`param`),
Adam (`adam`), the per-row data of one vocab pass (`rowdata`), the Q6_K ship of edited rows (`ship`),
dev tracking (`track`) and `optimize` (`solve`). The protocol-driven run is runs.solve.head.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Checkpoint": "solve",
    "HeadSolveConfig": "config",
    "HeadSolveError": "config",
    "RowData": "rowdata",
    "numpy_step": "solve",
    "objective_grad": "objective",
    "optimize": "solve",
})
