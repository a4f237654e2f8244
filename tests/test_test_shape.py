"""Every test reads in one screen: no `def test_*` in tests/ runs past 80 lines (split it by
concern, or move its steps into helpers or fixtures, keeping every assertion)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
LONGEST = 80


def long_tests(root: Path = TESTS, longest: int = LONGEST) -> list[str]:
    """`path:line name (N lines)` for each test function under `root` longer than `longest`
    lines, from its `def` to its last line."""
    found = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) \
                    and node.name.startswith("test_"):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > longest:
                    found.append(f"{path.relative_to(root.parent)}:{node.lineno} {node.name} "
                                 f"({length} lines)")
    return found


def test_no_test_function_is_over_80_lines() -> None:
    assert long_tests() == [], f"tests over {LONGEST} lines: split them by concern, or move " \
        "their steps into helpers or fixtures"


def test_a_long_test_is_named(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    body = "".join(f"    assert {n}\n" for n in range(1, LONGEST))
    (tmp_path / "tests" / "test_x.py").write_text(
        f"def test_fits():\n{body}\n\nasync def test_too_long():\n{body}    assert 0\n")
    assert long_tests(tmp_path / "tests") == [f"tests/test_x.py:{LONGEST + 3} test_too_long "
                                              f"({LONGEST + 1} lines)"]
