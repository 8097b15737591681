"""The layers of docs/architecture.md, checked on the source: every import between exactedit's
packages goes down the layers (or sideways inside one), the package graph has no cycle, no module
imports itself back through others (no file-level cycle), the code behind commands (`runs`
sub-packages) is imported only by the commands, and cli.py imports packages through their faces.
Function-level imports count the same as module-level ones."""
from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package -> layer, bottom (0) to top; cli.py is the top; the root package's __init__ (its version
# and the lazy_exports helper every package's face uses) is below everything
LAYERS = {
    "init": -1,
    "quant": 0,
    "dumps": 1,
    "solvers.tail": 2,
    "solvers": 3, "solvers.head": 3, "solvers.wfld": 3, "solvers.shaping": 3,
    "evals": 4, "evals.protocol": 4, "evals.kl": 4, "evals.scoring": 4, "evals.rates": 4, "evals.discover": 4,
    "evals.runs": 4,
    "native": 5, "native.llamacpp": 5, "native.shaping": 5, "native.verify": 5, "native.runs": 5,
    "fixtures": 6, "bench": 6, "": 7,
}
SOURCES = ["quant", "dumps", "solvers", "evals", "native", "fixtures", "bench", "cli.py"]
# who may import a `runs` module: the commands (cli.py), the demo on the fixture, the benchmarks
# that time a command end to end, and other runs
RUN_CALLERS = {"", "fixtures", "bench", "evals.runs", "native.runs"}


def _package(module: str) -> str | None:
    """exactedit.solvers.tail.kl_pass -> 'solvers.tail'; exactedit.cli -> ''; exactedit itself and
    the names its __init__ defines -> 'init'; modules outside exactedit -> None."""
    parts = module.split(".")
    if parts[0] != "exactedit":
        return None
    rest = parts[1:]
    for n in (2, 1):
        if len(rest) >= n and ".".join(rest[:n]) in LAYERS:
            return ".".join(rest[:n])
    return "" if rest and rest[0] == "cli" else "init"


@cache
def _modules() -> dict[str, Path]:
    """exactedit module name -> its file (a package by its __init__.py)."""
    out = {}
    for top in SOURCES:
        for path in sorted((ROOT / top).rglob("*.py")) if (ROOT / top).is_dir() else [ROOT / top]:
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(("exactedit",) + (parts[:-1] if parts[-1] == "__init__" else parts))
            out[name] = path
    return out


def _imports(path: Path):
    """(line, imported module) for every exactedit import in a file; `from P import m` names the
    module P.m where m is one."""
    mods = _modules()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                yield node.lineno, sub if sub in mods else node.module
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield node.lineno, a.name


def _edges():
    for name, path in _modules().items():
        src = _package(name)
        for line, imported in _imports(path):
            dst = _package(imported)
            if dst is not None and dst != src:
                yield src, dst, f"{path.relative_to(ROOT)}:{line} imports {imported}"


def test_imports_only_go_down_the_layers():
    up = [where for src, dst, where in _edges() if LAYERS[dst] > LAYERS[src]]
    assert not up, "imports that run up the layers:\n" + "\n".join(up)


def _cycles(graph: dict[str, set[str]]) -> list[str]:
    def reach(a, seen):
        for b in graph.get(a, ()):
            if b not in seen:
                seen.add(b)
                reach(b, seen)
        return seen

    return sorted(p for p in graph if p in reach(p, set()))


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    for src, dst, _ in _edges():
        graph.setdefault(src, set()).add(dst)
    cycles = _cycles(graph)
    assert not cycles, f"packages on an import cycle: {cycles}"


def test_no_import_cycle_between_files():
    """A module never reaches itself through the modules it imports (package faces, whose names
    are imported on first use, count as the modules they name)."""
    mods = _modules()
    graph = {name: {m for _, m in _imports(path) if m in mods and m != name} for name, path in mods.items()}
    # a face (a package's __init__) leads nowhere by itself: what its callers reach is its submodules
    for name in list(graph):
        if mods[name].name == "__init__.py":
            graph[name] = set()
    cycles = _cycles(graph)
    assert not cycles, f"modules on an import cycle: {cycles}"


def test_runs_are_imported_only_by_commands():
    bad = [where for src, dst, where in _edges() if dst.endswith("runs") and src not in RUN_CALLERS]
    assert not bad, "a runs module imported by library code:\n" + "\n".join(bad)


def test_cli_imports_package_faces_only():
    """cli.py names a package (its __init__'s public names), never a module inside one."""
    mods = _modules()
    deep = [f"cli.py:{line} imports {m}" for line, m in _imports(ROOT / "cli.py")
            if m in mods and mods[m].name != "__init__.py"]
    assert not deep, "cli.py imports past a package face:\n" + "\n".join(deep)


def test_every_package_is_placed():
    found = {_package("exactedit." + ".".join(p.parent.relative_to(ROOT).parts))
             for top in SOURCES if (ROOT / top).is_dir() for p in (ROOT / top).rglob("__init__.py")}
    assert found <= set(LAYERS), found - set(LAYERS)
