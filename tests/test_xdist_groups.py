"""The suite's xdist groups take effect: a module (or bed-sharing package) runs whole on one worker.

pytest-xdist keys `--dist loadgroup` on an `@group` suffix it adds to each node id from the
`xdist_group` mark; a mark added too late, or a pytest whose node id ignores the rename, leaves
every test its own group and splits a module's ordered scenarios over fresh clusters.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import _group


def test_this_test_carries_its_group(request: pytest.FixtureRequest) -> None:
    group = _group(Path(str(request.node.path)))
    marks = [m.args[0] for m in request.node.iter_markers("xdist_group")]
    assert marks == [group]
    if hasattr(request.config, "workerinput"):  # under -n N: the worker got the grouped id
        assert request.node.nodeid.endswith(f"@{group}"), request.node.nodeid
