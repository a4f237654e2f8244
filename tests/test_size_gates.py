"""Size gates for infra/: no function over 60 lines (from its first decorator, or its `def`, to
its last line, docstring included) and no module over 450 lines. A newcomer reads a function in
one screen and a module in one sitting; code is made to fit by splitting it by concern (a helper
for one step, a module for one subject), never mid-thought."""

from __future__ import annotations

import ast
from pathlib import Path

INFRA = Path(__file__).resolve().parent.parent / "infra"
LONGEST_FUNCTION = 60
LONGEST_MODULE = 450


def function_length(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first decorator (or the `def`) to the function's last line."""
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return (node.end_lineno or node.lineno) - first + 1


def long_functions(root: Path = INFRA, longest: int = LONGEST_FUNCTION) -> list[str]:
    """`path:line name (N lines)` for each function or method under `root` over `longest` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = function_length(node)
                if length > longest:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    return found


def long_modules(root: Path = INFRA, longest: int = LONGEST_MODULE) -> list[str]:
    """`path (N lines)` for each module under `root` over `longest` lines."""
    found = []
    for path in sorted(root.rglob("*.py")):
        length = len(path.read_text().splitlines())
        if length > longest:
            found.append(f"{path.relative_to(root.parent)} ({length} lines)")
    return found


def test_no_function_in_infra_is_over_60_lines() -> None:
    found = long_functions()
    assert not found, "".join(
        f"\n{line}: over {LONGEST_FUNCTION} lines; split it by concern (a helper per step, "
        "behaviour kept)" for line in found)


def test_no_module_in_infra_is_over_450_lines() -> None:
    found = long_modules()
    assert not found, "".join(
        f"\n{line}: over {LONGEST_MODULE} lines; split it by concern into modules of one subject "
        "(keep its import path working or update the callers)" for line in found)


def test_a_long_function_is_named_with_its_decorators_counted(tmp_path: Path) -> None:
    package = tmp_path / "infra"
    package.mkdir()
    body = "".join(f"    x = {n}\n" for n in range(LONGEST_FUNCTION - 2))
    # Both have 60 lines from the def; the decorated one has 61 from its decorator.
    (package / "a.py").write_text(f"def fits():\n{body}    return x\n\n\n"
                                  f"class C:\n    @staticmethod\n    async def too_long():\n"
                                  + body.replace("    ", "        ") + "        return x\n")
    lines = len((package / "a.py").read_text().splitlines())
    assert long_functions(package) == [f"infra/a.py:{LONGEST_FUNCTION + 5} too_long "
                                       f"({LONGEST_FUNCTION + 1} lines)"]
    assert long_modules(package) == []
    assert long_modules(package, lines - 1) == [f"infra/a.py ({lines} lines)"]
