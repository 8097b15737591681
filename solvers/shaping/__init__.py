"""Zero-parameter sampler rules (SPEC.md section 6), an edit kind beside the weights: the rules and
their offline shaping (`rules`), the causal trigger state machine (`triggers`), the rules file in
TOML and its compilation for one model (`rules_file`), the compiled format, token ids only
(`compiled`), and its phrase bans written for other engines (`export`; the llama.cpp grammar: `gbnf`).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "ExportConfig": "export",
    "Shaper": "rules",
    "compile_rules": "rules_file",
    "export_rules": "export",
    "load_rules": "rules_file",
    "read_compiled": "compiled",
    "render_export": "export",
})
