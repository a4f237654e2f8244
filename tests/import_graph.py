"""The import graph of `infra/` read from the source (AST), lazy imports and imports under
`if TYPE_CHECKING:` included: a type a module names belongs to a layer it may import, so a circle
hidden from the interpreter is still a circle. Used by tests/test_layers.py."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import ROOT


def modules(root: Path = ROOT / "infra") -> dict[str, Path]:
    """Dotted module name -> file, for every module of the package tree at `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _owner(name: str, known: dict[str, Path]) -> str | None:
    """The module of ours that `name` (a module or a name in one) is, or None."""
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def imports(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ours that `module` imports anywhere in its file."""
    tree = ast.parse(path.read_text())
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # `from a import b`: the module a.b when b is one, else a (its parent package
            # loads first, but a package's own lazy import of its submodule is no cycle).
            subs = [f"{base}.{alias.name}" for alias in node.names]
            names = [n for n in subs if n in known]
            if len(names) < len(subs):
                names.append(base)
        for name in names:
            owner = _owner(name, known)
            if owner and owner != module:
                found.add(owner)
    return found


def graph(root: Path = ROOT / "infra") -> dict[str, set[str]]:
    known = modules(root)
    return {name: imports(name, path, known) for name, path in known.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other round (strongly connected, > 1 module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(edges.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found
