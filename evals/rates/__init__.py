"""Phrase rates in free generation: base vs edited with bootstrap intervals (`phrase_rates`), their
table and PNG (`report`), variant artefacts in the replies (`artefacts`) and the replies' lexical
diversity (`diversity`, MATTR). Imports evals.scoring and evals.discover (its word tokens).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "lexical_diversity": "diversity:diversity",
    "mattr": "diversity",
    "plot_phrase_rates": "report",
    "variant_artefacts": "artefacts",
})
