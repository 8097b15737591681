"""Phrase rates in free generation: base vs edited with bootstrap intervals (`phrase_rates`), their
table and PNG (`report`) and variant artefacts in the replies (`artefacts`). Imports evals.scoring.

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "plot_phrase_rates": "report",
    "variant_artefacts": "artefacts",
})
