"""The suite's xdist groups take effect: a module (or bed-sharing package) runs whole on one worker.

pytest-xdist keys `--dist loadgroup` on an `@group` suffix it adds to each node id from the
`xdist_group` mark; a mark added too late, or a pytest whose node id ignores the rename, leaves
every test its own group and splits a module over workers, each building the module's cluster
again. The groups start longest first, by the times pytest recorded (tests/durations.py).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import durations
from tests.conftest import _group, start_order


def test_this_test_carries_its_group(request: pytest.FixtureRequest) -> None:
    group = _group(Path(str(request.node.path)))
    marks = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert marks == [group]
    if hasattr(request.config, "workerinput"):  # under -n N: the worker got the grouped id
        assert request.node.nodeid.endswith(f"@{group}"), request.node.nodeid


def test_groups_start_unknown_first_then_longest_first() -> None:
    recorded = {"a.py": 5.0, "b.py": 50.0, "c.py": 5.0}
    assert start_order(["a.py", "new.py", "b.py", "c.py", "other.py"], recorded) == \
        ["new.py", "other.py", "b.py", "a.py", "c.py"]


def test_durations_are_summed_per_group_from_pytests_junit_report(tmp_path: Path) -> None:
    """A module's tests add up (the cluster built in the first one's setup counts), a bed-sharing
    package's modules are one group, a test class's cases count for its module; a merge keeps the
    groups this run did not measure and drops those whose files are gone."""
    report = tmp_path / "junit.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_wait" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_wait" name="test_b" time="2.0"/>'
        '<testcase classname="tests.gcp_tpu.test_api" name="test_c" time="3.0"/>'
        '<testcase classname="tests.gcp_tpu.test_cli.TestSomething" name="test_d" time="4.0"/>'
        '<testcase classname="tests.local.test_e2e_sharing" name="test_e" time="0.25"/>'
        '</testsuite></testsuites>')
    assert durations.measured([report]) == {"test_wait.py": 3.5, "gcp_tpu": 7.0,
                                            "local/test_e2e_sharing.py": 0.25}
    out = tmp_path / "durations.json"
    durations.write({"test_spec.py": 9.0, "test_wait.py": 1.0, "gone/test_x.py": 99.0}, out,
                    guessed=["test_spec.py", "test_wait.py"])
    assert durations.main([str(report), "--out", str(out)]) == 0
    assert list(durations.load(out).items()) == [
        ("test_spec.py", 9.0), ("gcp_tpu", 7.0), ("test_wait.py", 3.5),
        ("local/test_e2e_sharing.py", 0.2)]
    assert durations.estimated(out) == ["test_spec.py"]  # test_wait.py is measured now


def test_the_recorded_durations_name_groups_that_exist() -> None:
    """tests/durations.json as committed loads, and every group it names is a test file or a
    bed-sharing package of today (tests/durations.py prunes the others at each write)."""
    recorded = durations.load()
    assert recorded, "tests/durations.json is missing: python -m tests.durations JUNIT.xml"
    assert [g for g in recorded if not durations.exists(g)] == []
