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
# and the lazy_exports helper every package's face uses) and its base modules (`errors`, `files`:
# the project's errors and crash-safe file helpers) are below everything, and so is the fixture's
# data (`fixtures`, which imports nothing)
LAYERS = {
    "init": -1, "fixtures": -1,
    # quant/, bottom to top: the block formats, the K-quants, the face (quantize / dequantize, the type
    # registry, the runtime view), the dot orders, constraint-keeping rounding, the GGUF file, the
    # model's metadata
    "quant.formats": 0, "quant.kquants": 0.1, "quant": 0.2, "quant.dots": 0.3, "quant.rounding": 0.4,
    "quant.gguf": 0.5, "quant.model": 0.6,
    "dumps": 1,
    "solvers.tail.forward": 2, "solvers.tail.passes": 2.1, "solvers.tail": 2.2,
    "solvers": 3, "solvers.head": 3, "solvers.l47": 3, "solvers.l47.gated": 3, "solvers.shaping": 3,
    "evals": 4, "evals.protocol": 4, "evals.kl": 4, "evals.scoring": 4, "evals.rates": 4, "evals.discover": 4,
    "native": 5, "native.llamacpp": 5, "native.shaping": 5, "native.verify": 5,
    # runs/, bottom to top: the solve and eval drivers, the data commands, the loops' shared code, the
    # two loops (which never import each other), the demo and the server
    "runs": 6, "runs.solve": 6, "runs.eval": 6.1, "runs.data": 6.2, "runs.loop": 6.3,
    "runs.antislop": 6.4, "runs.persona": 6.4, "runs.demo": 6.5, "runs.serve": 6.5,
    "bench": 7, "bench.loop": 7, "bench.serve": 7, "bench.wfld": 7, "": 8,
}
SOURCES = ["__init__.py", "errors.py", "files.py", "quant", "dumps", "solvers", "evals", "native", "runs", "fixtures",
           "bench", "cli.py"]
# who may import a `runs` module: the commands (cli.py), the benchmarks that time a command end to
# end, and other runs
RUN_CALLERS = {""} | {p for p in LAYERS if p.split(".")[0] in ("runs", "bench")}
# the root's base modules, which cli.py may import like a package face
BASE_MODULES = {"exactedit.errors", "exactedit.files"}
MAX_LOOSE_MODULES = 12


def _package(module: str) -> str | None:
    """exactedit.solvers.tail.passes.kl_pass -> 'solvers.tail'; exactedit.cli -> ''; exactedit itself and
    the names its __init__ defines -> 'init'; modules outside exactedit -> None."""
    parts = module.split(".")
    if parts[0] != "exactedit":
        return None
    rest = parts[1:]
    for n in (3, 2, 1):
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
            if name in out:     # the root's __init__.py, listed once
                continue
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
    bad = [where for src, dst, where in _edges() if dst.split(".")[0] == "runs" and src not in RUN_CALLERS]
    assert not bad, "a runs module imported by library code:\n" + "\n".join(bad)


def test_cli_imports_package_faces_only():
    """cli.py names a package (its __init__'s public names), never a module inside one."""
    mods = _modules()
    deep = [f"cli.py:{line} imports {m}" for line, m in _imports(ROOT / "cli.py")
            if m in mods and mods[m].name != "__init__.py" and m not in BASE_MODULES]
    assert not deep, "cli.py imports past a package face:\n" + "\n".join(deep)


def test_every_package_is_placed():
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for top in SOURCES if (ROOT / top).is_dir() for p in (ROOT / top).rglob("__init__.py")}
    assert found <= set(LAYERS), found - set(LAYERS)


def test_the_runs_layer_holds_the_command_code():
    """No package outside runs/ is named after commands: the drivers and loops live in runs/."""
    stray = sorted(str(p.relative_to(ROOT)) for top in SOURCES if top != "runs" and (ROOT / top).is_dir()
                   for p in (ROOT / top).rglob("runs") if p.is_dir() and any(p.glob("*.py")))
    assert not stray, f"command code outside runs/: {stray}"


def test_no_package_root_holds_more_than_twelve_loose_modules():
    """A package (or sub-package) root holds at most 12 modules besides its __init__: past that, its
    concepts get sub-packages of their own."""
    big = {}
    for top in SOURCES:
        if (ROOT / top).is_dir():
            for init in (ROOT / top).rglob("__init__.py"):
                n = sum(1 for p in init.parent.glob("*.py") if p.name != "__init__.py")
                if n > MAX_LOOSE_MODULES:
                    big[str(init.parent.relative_to(ROOT))] = n
    assert not big, f"package roots with more than {MAX_LOOSE_MODULES} loose modules: {big}"


def test_the_loops_never_import_each_other():
    pairs = [where for src, dst, where in _edges() if {src, dst} == {"runs.antislop", "runs.persona"}]
    assert not pairs, "antislop and persona import each other:\n" + "\n".join(pairs)
