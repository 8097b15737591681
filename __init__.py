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

__all__ = ["__version__"]
