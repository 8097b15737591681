"""The sampler rules live on llama.cpp: a rules file compiled for one model (`compile`), the rules in
the generation loop (`live`), the four arms base / rules / weights / both rated in free generation
(`rates`), the bitwise check that the sampler ran the rules scored offline (`verify`), the C
reference of the compiled JSON (`c/`), and the exported phrase grammar in llama-cpp-python with
its cost (`grammar`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "GrammarCostConfig": "grammar",
    "compile_file": "compile",
    "generate_text": "live",
    "grammar_cost": "grammar",
    "open_rules": "live",
    "render_compile": "compile",
    "render_generation": "live",
    "render_grammar_cost": "grammar",
    "render_shape_rates": "rates",
    "render_shaping_verify": "verify",
    "shape_processors": "live",
    "shape_rates": "rates",
    "verify_shaping": "verify",
})
