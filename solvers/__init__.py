"""The solvers' math and the bundle they write: `solvers.head` (rows of the output head),
`solvers.l47` (the WFLD edit of the last layer), `solvers.tail` (the exact tail both stand on),
`bundle` (the bundle format and its identity), `phrases` (the one phrase matcher, phrase lists) and `apply` (a bundle written into a copy of the
GGUF). Nothing here reads a protocol or a ledger (docs/architecture.md).

The names below are imported on first use (their modules pull in numba / JAX).
"""
from exactedit import lazy_exports

__all__, __getattr__ = lazy_exports(__name__, {
    "Bundle": "bundle",
    "InputRef": "bundle",
    "TensorEdit": "bundle",
    "apply_bundle": "apply",
    "bundle_identity": "bundle",
    "kinds_of": "phrases",
    "load_phrases": "phrases",
    "read_bundle": "bundle",
    "render_apply": "apply",
    "write_bundle": "bundle",
})
