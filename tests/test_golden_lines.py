"""Rendered files a person reads: no line of any golden file (every template's output, start
commands included) is 200 characters or more."""

from __future__ import annotations

from tests.golden import GOLDEN_DIR

LIMIT = 200


def test_every_golden_line_is_under_200_characters() -> None:
    files = sorted(p for p in GOLDEN_DIR.rglob("*") if p.is_file() and p.suffix != ".py"
                   and "__pycache__" not in p.parts)
    assert len(files) >= 20, files  # the goldens of all four providers are there
    long = [f"{p.relative_to(GOLDEN_DIR)}:{n} is {len(line)} characters"
            for p in files for n, line in enumerate(p.read_text().splitlines(), 1)
            if len(line) >= LIMIT]
    assert long == [], "\n".join(long)
