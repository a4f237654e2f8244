"""pytest plugin: the test bed as fixtures. Enable with `pytest_plugins = ["tests.testbed.fixtures"]`.

- `testbed`: a session-wide `Testbed` of 2 hosts; `@pytest.mark.parametrize("testbed", [3],
  indirect=True)` asks for another size (one per size per session).
- `make_testbed`: factory `make_testbed(n) -> Testbed` for a private test bed, torn down after the test.
- `slurm_cluster`: session-wide 2-node `SlurmCluster` (on its own test bed).
- `slurm_local`: session-wide single-node `LocalSlurm` on 127.0.0.1.

Tests that share a session fixture must leave it as they found it (e.g. stop the Ray they started).
Where the machine cannot run the test bed the test is skipped, saying why, except under `CI=true`,
where that is a failure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.testbed.core import Testbed
from tests.testbed.preflight import require
from tests.testbed.slurm import LocalSlurm, SlurmCluster

_TIMINGS = pytest.StashKey[list[tuple[str, dict[str, float]]]]()


def report_timings(config: pytest.Config, label: str, timings: dict[str, float]) -> None:
    """Print now (seen with -s) and again in the terminal summary."""
    print(f"\n[testbed timings] {label}: {timings}")
    config.stash.setdefault(_TIMINGS, []).append((label, dict(timings)))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    entries = config.stash.get(_TIMINGS, [])
    if entries:
        terminalreporter.section("test bed timings (seconds)")
        for label, timings in entries:
            terminalreporter.write_line(f"{label}: " + ", ".join(f"{k} {v}" for k, v in timings.items()))


@pytest.fixture(scope="session")
def testbed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Testbed]:
    n_hosts = int(getattr(request, "param", 2))
    require("testbed")
    bed = Testbed(n_hosts, tmp_path_factory.mktemp(f"testbed{n_hosts}-"))
    try:
        yield bed
    finally:
        bed.close()
        report_timings(request.config, f"testbed({n_hosts})", bed.timings)


@pytest.fixture
def make_testbed(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                 ) -> Iterator[Callable[[int], Testbed]]:
    require("testbed")
    made: list[Testbed] = []

    def make(n_hosts: int = 2) -> Testbed:
        bed = Testbed(n_hosts, tmp_path_factory.mktemp(f"testbed{n_hosts}-"))
        made.append(bed)
        return bed

    try:
        yield make
    finally:
        for bed in made:
            bed.close()
            report_timings(request.config, f"make_testbed({len(bed.hosts)})", bed.timings)


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                  ) -> Iterator[SlurmCluster]:
    require("slurm")
    cluster = SlurmCluster(2, tmp_path_factory.mktemp("slurm-cluster-"))
    try:
        yield cluster
    finally:
        cluster.close()
        report_timings(request.config, "slurm_cluster(2)", cluster.timings)


@pytest.fixture(scope="session")
def slurm_local(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
                ) -> Iterator[LocalSlurm]:
    require("slurm")
    cluster = LocalSlurm(tmp_path_factory.mktemp("slurm-local-"))
    try:
        yield cluster
    finally:
        cluster.close()
        report_timings(request.config, "slurm_local", cluster.timings)
