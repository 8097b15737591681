"""exactedit: exact offline edits of a GGUF model's output head and last layer.

The installed package maps the repository's top-level folders under this one import name
(`exactedit.quant`, `exactedit.dumps`, `exactedit.solvers.tail`, ...); docs/architecture.md shows
the layers and what each may import.
"""
from importlib.metadata import PackageNotFoundError, version as _version

try:
    __version__ = _version("exactedit")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"

__all__ = ["__version__", "lazy_exports"]


def lazy_exports(package: str, exports: dict[str, str]):
    """(__all__, __getattr__) for a package whose public names live in its submodules and are
    imported on first use (PEP 562): `exports` maps each name to its submodule, or to
    "submodule:name" where the submodule calls it otherwise (a function named like its own module,
    `untie` in quant/model/untie.py, would be shadowed by the module once imported)."""
    from importlib import import_module

    def __getattr__(name: str):
        if name in exports:
            module, _, attr = exports[name].partition(":")
            return getattr(import_module(f"{package}.{module}"), attr or name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    return sorted(exports), __getattr__
