"""The layers of docs/architecture.md, checked on the source: every import between exactedit's
packages goes down the layers (or sideways inside one), and the package graph has no cycle.
Function-level imports count the same as module-level ones."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> layer, bottom (0) to top; cli.py is the top; the root package's __init__ (its version
# and the lazy_exports helper every package's face uses) is below everything
LAYERS = {
    "init": -1,
    "quant": 0,
    "dumps": 1,
    "solvers.tail": 2,
    "solvers": 3, "solvers.head": 3, "solvers.l47": 3,
    "evals": 4,
    "native": 5,
    "fixtures": 6, "bench": 6, "": 7,
}
SOURCES = ["quant", "dumps", "solvers", "evals", "native", "fixtures", "bench", "cli.py"]


def _package(module: str) -> str | None:
    """exactedit.solvers.tail.kl_pass -> 'solvers.tail'; exactedit.cli -> ''; exactedit itself and
    the names its __init__ defines -> 'init'; modules outside exactedit -> None."""
    parts = module.split(".")
    if parts[0] != "exactedit":
        return None
    rest = parts[1:]
    if rest and rest[0] == "solvers" and len(rest) > 1 and f"solvers.{rest[1]}" in LAYERS:
        return f"solvers.{rest[1]}"
    if rest and rest[0] in LAYERS:
        return rest[0]
    return "" if rest and rest[0] == "cli" else "init"


def _edges():
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")) if (ROOT / top).is_dir() else [ROOT / top]:
            rel = path.relative_to(ROOT).with_suffix("")
            src = _package("exactedit." + ".".join(rel.parts))
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    # `from exactedit import quant` imports the package exactedit.quant
                    names = ([f"exactedit.{a.name}" for a in node.names] if node.module == "exactedit"
                             else [node.module])
                else:
                    names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                for name in names:
                    dst = _package(name)
                    if dst is not None and dst != src:
                        yield src, dst, f"{path.relative_to(ROOT)}:{node.lineno} imports {name}"


def test_imports_only_go_down_the_layers():
    up = [where for src, dst, where in _edges() if LAYERS[dst] > LAYERS[src]]
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        graph.setdefault(src, set()).add(dst)

    def reach(a, seen):
        for b in graph.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    cycles = sorted(p for p in graph if p in reach(p, set()))
    assert not cycles, f"packages on an import cycle: {cycles}"


def test_every_package_is_placed():
    found = {_package("exactedit." + ".".join(p.parent.relative_to(ROOT).parts))
             for top in SOURCES if (ROOT / top).is_dir() for p in (ROOT / top).rglob("__init__.py")}
    assert found <= set(LAYERS), found - set(LAYERS)
