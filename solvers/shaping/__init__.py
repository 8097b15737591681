"""Zero-parameter sampler rules (SPEC.md section 6), an edit kind beside the weights: the rules and
their offline shaping (`rules`), the causal trigger state machine (`triggers`), the rules file in
TOML and its compilation for one model (`rules_file`) and the compiled format, token ids only
(`compiled`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Shaper": "rules",
    "compile_rules": "rules_file",
    "load_rules": "rules_file",
    "read_compiled": "compiled",
})
