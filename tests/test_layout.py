"""The package layout keeps its layers (docs/architecture.md): imports go down or sideways, never up; no import
circles, function-local imports included; a method folder uses only the public names of another.

The walk reads the source (ast), so it sees the imports a test run would not execute (lazy, CUDA-only branches).
"""
from __future__ import annotations

import ast
import pathlib
from typing import Dict, Iterator, List, Set, Tuple

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "vitfast"
KERNELS = ROOT / "kernels"  # installed as vitfast.kernels

# Longest matching prefix wins.  A module may import from its own layer or below.
LAYERS: Dict[str, float] = {
    "vitfast._env": 0, "vitfast._lazy": 0, "vitfast._version": 0, "vitfast._copy": 0, "vitfast._checks": 0,
    "vitfast._C": 0, "vitfast._threads": 0, "vitfast._derived": 0, "vitfast.io.atomic": 0,
    "vitfast.reference": 1.0, "vitfast.kernels": 1.1, "vitfast.ops": 1.2,  # the op's contract, its kernel, the op
    "vitfast.nn": 2, "vitfast.arch": 2,
    "vitfast.training": 3, "vitfast.io.trainer_checkpoint": 3, "vitfast.io.head_ranking": 3, "vitfast.recipes": 3,
    "vitfast.methods": 4,
    "vitfast.convert": 5, "vitfast.fusion": 5, "vitfast.patch": 5, "vitfast.io": 5, "vitfast.export": 5, "vitfast.onnx_qdq": 5,
    "vitfast.cuda_graphs": 5, "vitfast.quant": 5, "vitfast.bench": 5, "vitfast.bench_runtimes": 5,
    "vitfast.bench_report": 5, "vitfast.measure": 5, "vitfast.models": 5,
    "vitfast.cli": 6, "vitfast.demos": 6, "vitfast.__main__": 6, "vitfast": 6,
}
LAYER_NAMES = ["leaf utilities", "ops and kernels", "fused modules", "training and leaf formats", "methods",
               "model tools", "front (CLI, demos)"]


def _modules() -> Iterator[Tuple[str, pathlib.Path, bool]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        yield ".".join(parts[:-1] if is_pkg else parts), path, is_pkg
    for path in sorted(KERNELS.rglob("*.py")):
        parts = ["vitfast", "kernels"] + list(path.relative_to(KERNELS).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        yield ".".join(parts[:-1] if is_pkg else parts), path, is_pkg


MODULES = {name: (path, is_pkg) for name, path, is_pkg in _modules()}


def _resolve(module: str, is_pkg: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_pkg else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str) -> List[Tuple[str, str, int]]:
    """(imported module, imported name or "", line) for every vitfast import in `module`, nested ones included."""
    path, is_pkg = MODULES[module]
    tree = ast.parse(path.read_text(), str(path))
    typing_only = {id(n) for branch in ast.walk(tree) if isinstance(branch, ast.If) and _is_type_checking(branch.test)
                   for stmt in branch.body for n in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue  # annotations only: never executed
        if isinstance(node, ast.Import):
            found += [(a.name, "", node.lineno) for a in node.names if a.name.split(".")[0] == "vitfast"]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_pkg, node)
            if target.split(".")[0] != "vitfast":
                continue
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                is_module = sub in MODULES or sub == "vitfast._C"
                found.append((sub, "", node.lineno) if is_module else (target, alias.name, node.lineno))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _layer(module: str) -> float:
    if module == "vitfast":
        return LAYERS[module]  # the package itself: the public facade, above everything
    parts = module.split(".")
    for i in range(len(parts), 1, -1):
        if ".".join(parts[:i]) in LAYERS:
            return LAYERS[".".join(parts[:i])]
    raise KeyError(module)


def test_every_module_has_a_layer():
    unplaced = []
    for module in MODULES:
        try:
            _layer(module)
        except KeyError:
            unplaced.append(module)
    assert not unplaced, f"modules without a layer in LAYERS: {unplaced}"


def test_no_upward_imports():
    upward = []
    for module in MODULES:
        mine = _layer(module)
        for target, name, line in _imports(module):
            if target not in MODULES and target != "vitfast._C":
                continue  # reported by test_imports_resolve
            theirs = _layer(target)
            if theirs > mine:
                upward.append(f"{module}:{line} ({LAYER_NAMES[int(mine)]}) imports {target}"
                              f"{'.' + name if name else ''} ({LAYER_NAMES[int(theirs)]})")
    assert not upward, "upward imports:\n" + "\n".join(upward)


def test_imports_resolve():
    missing = []
    for module in MODULES:
        for target, _, line in _imports(module):
            if target not in MODULES and target != "vitfast._C":
                missing.append(f"{module}:{line} imports {target}, which is not a module of the package")
    assert not missing, "\n".join(missing)


def _graph() -> Dict[str, Set[str]]:
    graph: Dict[str, Set[str]] = {m: set() for m in MODULES}
    for module in MODULES:
        for target, _, _ in _imports(module):
            if target in MODULES and target != module:
                graph[module].add(target)
    return graph


def _cycles(graph: Dict[str, Set[str]]) -> List[List[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    out: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_package_of(package: str, module: str) -> bool:
    return MODULES[package][1] and module.startswith(package + ".")


def test_no_import_circles():
    graph = _graph()
    # A package's __init__ re-exporting its own submodules, and a submodule reaching its package's lazy names, is
    # how Python packages work, not a circle between modules: drop the edges from a package to its own submodules.
    for module, targets in graph.items():
        graph[module] = {t for t in targets if not _is_package_of(module, t)}
    circles = _cycles(graph)
    assert not circles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in circles)


def _method(module: str) -> str:
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[:2] == ["vitfast", "methods"] else ""


def test_methods_use_only_public_names_of_each_other():
    private = []
    for module in MODULES:
        mine = _method(module)
        if not mine:
            continue
        for target, name, line in _imports(module):
            theirs = _method(target)
            if theirs and theirs != mine:
                hidden = [p for p in target.split(".") + [name] if p.startswith("_") and p != "__init__"]
                if hidden:
                    private.append(f"{module}:{line} imports {target}{'.' + name if name else ''}")
    assert not private, "private names across method folders:\n" + "\n".join(private)


@pytest.mark.parametrize("folder", ["ops", "nn", "methods", "io", "training", "cli", "demos"])
def test_layer_folders_exist(folder):
    assert (PACKAGE / folder / "__init__.py").is_file()


def test_the_check_can_fail():
    # The walk must see function-local imports and report an upward one: a nested import from the CLI in nn.
    graph = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert _cycles(graph) == [["a", "b"]]
    assert _layer("vitfast.nn.block") < _layer("vitfast.methods.usdc.gates") < _layer("vitfast.cli")
    tree = ast.parse("def f():\n    from ..cli import main\n")
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom))
    assert _resolve("vitfast.nn.block", False, node) == "vitfast.cli"


def test_cli_start_up_imports_no_model_code():
    # `vitfast --help` and argument errors must stay fast: timm (and the model code importing it) loads only when a
    # command needs it.
    import subprocess
    import sys

    code = "import sys, vitfast.cli; print(sorted(m for m in ('timm', 'sklearn', 'torchvision') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "[]"
