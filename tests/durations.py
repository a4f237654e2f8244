"""How long each xdist group of the suite takes, as pytest recorded it: tests/durations.json.

tests/conftest.py hands the groups to pytest-xdist's workers longest first (with groups sent in
collection order, a long group started last decides the whole run's length), reading that file; a
group it does not list (a new module) starts first, before any measured one.

The file is written from pytest's own JUnit XML report, whose `time` per test is its setup, call and
teardown (a module's cluster is built in its first test's setup), so a group's sum is what it holds
its worker for:

    python -m pytest --junitxml=junit.xml ...   # .ci/run does this for every CI run
    python -m tests.durations junit.xml         # merge into tests/durations.json

A run of part of the suite updates the groups it ran and keeps the others' times; groups whose
files are gone are dropped. Times not yet measured by a whole run are listed as `estimated` (a
group leaves that list once measured). Commit the file when a CI run changed the order.
"""

from __future__ import annotations

import argparse
import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable
from pathlib import Path

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
FILE = TESTS / "durations.json"
#: Packages whose modules share a package-scoped bed (built once per worker that runs them):
#: their tests are one group, kept on one pytest-xdist worker.
PACKAGE_GROUPS = frozenset({"gcp_tpu"})


def group_of(path: Path) -> str:
    """The pytest-xdist group of a test file: its package for `PACKAGE_GROUPS`, else the module."""
    rel = path.resolve().relative_to(TESTS)
    return rel.parts[0] if rel.parts[0] in PACKAGE_GROUPS else rel.as_posix()


def _file_of(classname: str) -> Path | None:
    """The test file of a JUnit `classname` (`tests.local.test_x`, or `...test_x.TestClass`)."""
    parts = classname.split(".")
    while parts:
        candidate = ROOT.joinpath(*parts).with_suffix(".py")
        if candidate.is_file():
            return candidate
        parts.pop()
    return None


def measured(reports: Iterable[Path]) -> dict[str, float]:
    """Seconds per group summed over the test cases of JUnit XML `reports`."""
    found: dict[str, float] = {}
    for report in reports:
        for case in ET.parse(report).iter("testcase"):
            path = _file_of(case.get("classname", ""))
            if path is not None and TESTS in path.parents:
                group = group_of(path)
                found[group] = found.get(group, 0.0) + float(case.get("time") or 0.0)
    return found


def exists(group: str) -> bool:
    return (TESTS / group).exists()


def load(path: Path = FILE) -> dict[str, float]:
    """The recorded seconds per group ({} without a file: every group is then unknown)."""
    if not path.is_file():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text())["seconds"].items()}


def merge(old: dict[str, float], new: dict[str, float]) -> dict[str, float]:
    """`new`'s groups replace `old`'s, the others are kept; gone groups are dropped; longest first."""
    merged = {g: s for g, s in {**old, **new}.items() if exists(g)}
    return {g: round(merged[g], 1) for g in sorted(merged, key=lambda g: (-merged[g], g))}


def estimated(path: Path = FILE) -> list[str]:
    """The groups whose recorded time is a guess, not yet measured."""
    return list(json.loads(path.read_text()).get("estimated", [])) if path.is_file() else []


def write(seconds: dict[str, float], path: Path = FILE, guessed: Iterable[str] = ()) -> None:
    path.write_text(json.dumps({
        "about": "seconds each xdist group held its worker, from pytest's JUnit XML; written by "
                 "`python -m tests.durations JUNIT.xml` (see tests/durations.py)",
        "estimated": sorted(g for g in guessed if g in seconds),
        "seconds": seconds}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.durations", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("reports", nargs="+", type=Path, help="pytest --junitxml files")
    parser.add_argument("--out", type=Path, default=FILE)
    args = parser.parse_args(argv)
    missing = [str(r) for r in args.reports if not r.is_file()]
    if missing:
        print(f"no JUnit report at {missing[0]}: run pytest with --junitxml={missing[0]} first",
              file=sys.stderr)
        return 2
    new = measured(args.reports)
    write(merge(load(args.out), new), args.out,
          [g for g in estimated(args.out) if g not in new])
    print(f"{args.out}: {len(new)} group(s) measured")
    return 0


if __name__ == "__main__":
    sys.exit(main())
