"""What `up` of a Slurm cluster with `metrics: prometheus` says about the head's Prometheus, from
what the head's job wrote in its info file (no Slurm needed; the e2e side is test_e2e_autoscale.py).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from infra.cli import loading
from infra.core.state import State
from infra.node.slurm.info import Info
from infra.providers.slurm.provider import Provider
from infra.providers.slurm.spec import Spec

INFO = Info(phase="ready", message="1/1 Ray nodes alive", job_id="7", head_node="node7",
            head_ip="10.0.0.7", port_base=20128, gcs_port=20128, dashboard_port=20129,
            client_port=20130, node_manager_port=20131, object_manager_port=20132,
            address="10.0.0.7:20128", dashboard_url="http://127.0.0.1:20129", temp_dir="/tmp/rf",
            cluster_id="c1", started_at=0.0, updated_at=0.0)


def _setup(tmp_path: Path, extra: str = "") -> tuple[Provider, State]:
    path = tmp_path / "hpc.yaml"
    path.write_text("provider: slurm\ncpus_per_node: 1\n" + extra)
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    return Provider(loaded), State.new(tmp_path / "hpc.json", "hpc", "slurm")


def test_a_head_without_prometheus_is_one_line_and_up_goes_on(
        rf_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    provider, state = _setup(tmp_path)
    provider._note_metrics(state, replace(INFO, prometheus=""))
    said = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(said) == 1 and "no `prometheus` on the head's node node7" in said[0], said
    assert "runs without metrics" in said[0]
    # Nothing says it has metrics: `top` and `report` then say in one line that it runs none.
    assert state.info.metrics_since is None


def test_a_head_with_prometheus_is_said_and_its_history_starts(
        rf_home: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    provider, state = _setup(tmp_path, "metrics_history: {scrape_interval_s: 3}\n")
    provider._note_metrics(state, replace(INFO, prometheus="/usr/bin/prometheus"))
    said = capsys.readouterr().err
    assert "Prometheus starting in the head's job on node7's loopback, port 20139" in said, said
    assert state.info.metrics_scrape_s == 3 and (state.info.metrics_since or 0) > 0
    # metrics: none: nothing said, nothing noted.
    quiet, none_state = _setup(tmp_path, "metrics: none\n")
    quiet._note_metrics(none_state, replace(INFO, prometheus=""))
    assert capsys.readouterr().err == "" and none_state.info.metrics_since is None
