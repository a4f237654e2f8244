"""Golden files for rendered templates: `assert_golden(path, text)`.

Run with UPDATE_GOLDEN=1 to rewrite them after an intended change, then review the diff in git.
Machine-specific values (paths of executables, versions) are normalised by the caller first.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

GOLDEN_DIR = Path(__file__).parent


def assert_golden(relative: str, text: str, replacements: dict[str, str] | None = None) -> None:
    for old, new in (replacements or {}).items():
        text = text.replace(old, new)
    path = GOLDEN_DIR / relative
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return
    assert path.exists(), f"no golden file {path}; run with UPDATE_GOLDEN=1 to create it"
    expected = path.read_text()
    if text != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), text.splitlines(keepends=True),
            f"golden/{relative}", "rendered"))
        raise AssertionError(f"rendered output differs from golden/{relative}:\n{diff}")
