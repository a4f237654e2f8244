"""Node-hours from squeue's own formats (Slurm bills no money; rayfleet reports node-hours)."""

from __future__ import annotations

import pytest

from infra.providers.slurm import costs


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
