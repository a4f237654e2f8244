"""Node-hours from squeue's own formats (Slurm bills no money; rayfleet reports node-hours)."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import loading
from infra.core.costs import describe_range
from infra.providers.slurm import costs
from infra.providers.slurm.provider import Provider
from infra.providers.slurm.spec import Spec


@pytest.mark.parametrize(("nodelist", "count"), [
    ("n[1-3,7],gpu01", 5), ("localhost", 1), ("(None)", 0), ("", 0), ("a[01-02]", 2),
    ("c[1-2],d[5-6]", 4)])
def test_count_nodes(nodelist: str, count: int) -> None:
    assert costs.count_nodes(nodelist) == count


@pytest.mark.parametrize(("text", "seconds"), [
    ("1-02:03:04", 93784), ("05:06", 306), ("7", 7), ("2:00:00", 7200), ("UNLIMITED", None),
    ("INVALID", None)])
def test_elapsed(text: str, seconds: float | None) -> None:
    assert costs.elapsed_seconds(text) == seconds


def test_only_running_jobs_count() -> None:
    cost = costs.cost([("RUNNING", "n[1-2]", "1:00:00"), ("PENDING", "", "0:00"),
                       ("RUNNING", "n3", "30:00")])
    assert (cost.nodes, cost.node_hours, cost.uptime_s, cost.hourly_usd) == (3, 2.5, 3600, None)


@pytest.mark.parametrize(("extra", "expected"), [
    ("nodes: 3\n", "cost: 3 node-hours/h, fixed size"),
    ("worker_types:\n  cpu: {cpus_per_node: 2, min_workers: 1, max_workers: 4}\n"
     "  gpu: {cpus_per_node: 2, gpus_per_node: 1, max_workers: 2}\n",
     "cost: 2 node-hours/h at minimum size to 7 node-hours/h at maximum size"),
])
def test_plan_and_up_show_the_node_hours_range(tmp_path: Path, extra: str, expected: str) -> None:
    # `invoke plan` and `up` print this line; Slurm has no prices, so node-hours per hour.
    path = tmp_path / "hpc.yaml"
    path.write_text("provider: slurm\ncpus_per_node: 2\n" + extra)
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    cost_range = Provider(loaded).cost_range(None)
    assert cost_range is not None and cost_range.node_hours
    assert describe_range(cost_range).startswith(expected), describe_range(cost_range)
    assert "$" not in describe_range(cost_range)
