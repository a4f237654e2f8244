"""docs/concepts/sharing.md numbers the gateway's guarantees; each names the tests that hold it.

A guarantee the page makes without a test that can fail is a sentence, not a guarantee: every
numbered item of the section "The gateway's guarantees" names at least one test id
(`tests/...py::test_name`), and each id names a test function that exists."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

PAGE = ROOT / "docs" / "concepts" / "sharing.md"
SECTION = "## The gateway's guarantees"
_ITEM = re.compile(r"^(\d+)\. \*\*(.+?)\*\*", re.MULTILINE)
_TEST_ID = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def _section(text: str) -> str:
    assert SECTION in text, f"{PAGE.name} has no section {SECTION!r}"
    body = text.split(SECTION, 1)[1]
    return body.split("\n## ", 1)[0]


def _items(section: str) -> list[tuple[str, str]]:
    """(number, the item's whole text) of each numbered guarantee."""
    starts = list(_ITEM.finditer(section))
    return [(m.group(1), section[m.start():(starts[i + 1].start() if i + 1 < len(starts)
                                           else len(section))])
            for i, m in enumerate(starts)]


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            and node.name.startswith("test_")}


def test_every_numbered_guarantee_names_tests_that_exist() -> None:
    items = _items(_section(PAGE.read_text()))
    assert len(items) >= 5, "the section numbers the gateway's guarantees (1., 2., ...)"
    assert [int(n) for n, _ in items] == list(range(1, len(items) + 1)), "numbered 1, 2, 3, ..."
    for number, text in items:
        ids = _TEST_ID.findall(text)
        assert ids, f"guarantee {number} names no test (`tests/...py::test_name`)"
        for file, name in ids:
            path = ROOT / file
            assert path.is_file(), f"guarantee {number}: {file} does not exist"
            assert name in _defined_tests(path), f"guarantee {number}: {file} has no {name}"


def test_the_check_catches_a_guarantee_without_a_test() -> None:
    page = f"{SECTION}\n\n1. **A.** held by `tests/test_docs_guarantees.py::test_x`.\n" \
           "2. **B.** no test named.\n\n## Next\n"
    items = _items(_section(page))
    assert [n for n, t in items if not _TEST_ID.findall(t)] == ["2"]
