"""The sampler rules live on llama.cpp: a rules file compiled for one model (`compile`), the rules in
the generation loop (`live`), the four arms base / rules / weights / both rated in free generation
(`rates`), the bitwise check that the sampler ran the rules scored offline (`verify`) and the C
reference of the compiled JSON (`c/`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "open_rules": "live",
    "shape_rates": "rates",
})
