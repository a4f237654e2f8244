"""Tests use no `_private` name of infra: a test that reaches past a module's public names pins
its insides, so every refactor breaks tests that still hold. A name a test needs is API (make it
public) or the test goes through the public API instead. Read from the source (AST): an import
`from infra... import _name`, and `module._name` (an attribute read, or a string name given to
`setattr`/`monkeypatch.setattr`) on a module of infra that the test imported."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _is_module(dotted: str, root: Path) -> bool:
    path = root / dotted.replace(".", "/")
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _infra_modules(tree: ast.AST, root: Path) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """The names a module binds to modules of infra ({name: dotted module}), and its imports of
    a private name from infra ((line, what))."""
    modules: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                and node.module.split(".")[0] == "infra":
            for alias in node.names:
                if _private(alias.name):
                    found.append((node.lineno, f"from {node.module} import {alias.name}"))
                elif _is_module(f"{node.module}.{alias.name}", root):
                    modules[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "infra":
                    bound = alias.asname or "infra"
                    modules[bound] = alias.name if alias.asname else "infra"
    return modules, found


def private_uses(path: Path, root: Path = ROOT) -> list[str]:
    """`path:line what` for each use of a private name of infra in the test module `path`."""
    tree = ast.parse(path.read_text(), str(path))
    modules, found = _infra_modules(tree, root)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain, value = [node.attr], node.value
            while isinstance(value, ast.Attribute):
                chain.insert(0, value.attr)
                value = value.value
            if isinstance(value, ast.Name) and value.id in modules:
                found.append((node.lineno, ".".join([modules[value.id], *chain])))
        elif isinstance(node, ast.Call) and len(node.args) >= 2 \
                and isinstance(node.args[0], ast.Name) and node.args[0].id in modules \
                and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str) and _private(node.args[1].value):
            found.append((node.lineno, f"{modules[node.args[0].id]}.{node.args[1].value}"))
    return [f"{path.relative_to(root)}:{line} {what}" for line, what in sorted(found)]


def test_no_test_uses_a_private_name_of_infra() -> None:
    found = [use for path in sorted(TESTS.rglob("*.py")) for use in private_uses(path)]
    assert not found, "".join(
        f"\n{use}: a private name of infra; make it public if it is API, or test through the "
        "public API" for use in found)


def test_a_private_use_is_named(tmp_path: Path) -> None:
    for module in ("infra/__init__.py", "infra/core/__init__.py", "infra/core/head.py"):
        (tmp_path / module).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / module).write_text("")
    test = tmp_path / "test_x.py"
    test.write_text(
        "import infra.core.head\nimport infra.core.head as h\nfrom infra.core import head\n"
        "from infra.core.head import _checked, public\n"
        "def test_x(monkeypatch):\n"
        "    head.run(), head.__name__, h.public, public._fine_on_a_class\n"
        "    head._env()\n"
        "    h._x = 1\n"
        "    infra.core.head._y\n"
        "    monkeypatch.setattr(head, '_z', 1)\n"
        "    monkeypatch.setattr(head, 'public', 1)\n")
    assert private_uses(test, tmp_path) == [
        "test_x.py:4 from infra.core.head import _checked",
        "test_x.py:7 infra.core.head._env",
        "test_x.py:8 infra.core.head._x",
        "test_x.py:9 infra.core.head._y",
        "test_x.py:10 infra.core.head._z",
    ]
