"""The head's Prometheus runner (infra/node/metrics.py) under the head daemons' supervisor, with the
distribution's real `prometheus`: the supervisor's pid file stays the supervisor's, so `status`
sees both and a second `ensure` (what every `up` runs) starts no second Prometheus."""

from __future__ import annotations

import sys
from pathlib import Path

from infra.node import rayproc, supervise
from infra.node.metrics import PrometheusConfig
from tests.conftest import ROOT
from tests.waiting import wait_until


def test_the_runner_leaves_the_supervisors_pid_file_alone(real_daemon: None,
                                                          tmp_path: Path) -> None:
    config = tmp_path / "rayfleet-metrics.json"
    port = rayproc.free_port()
    PrometheusConfig(
        host="127.0.0.1", port=port, discovery_file=str(tmp_path / "discovery.json"),
        storage_dir=str(tmp_path / "tsdb"), retention_days=1, retention_size_mb=64,
        scrape_interval_s=5, log_path=str(tmp_path / "prometheus.log")).write(config)
    pidfile = Path(f"{config}.pid")
    argv = [sys.executable, "-m", "infra.node.metrics", "--config", str(config)]
    try:
        assert supervise.ensure(argv, pidfile, tmp_path / "supervisor.log", cwd=str(ROOT))
        wait_until(lambda: rayproc.port_answers("127.0.0.1", port), "Prometheus listening",
                   timeout=60, interval=0.2)
        found = supervise.status(pidfile)
        assert found["supervisor_running"] and found["daemon_running"], (
            found, pidfile.read_text())
        assert not supervise.ensure(argv, pidfile, tmp_path / "supervisor.log", cwd=str(ROOT))
    finally:
        supervise.stop(pidfile)
        # A pid file that identifies nothing (the fault this test looks for) stops nothing.
        rayproc.terminate(rayproc.cluster_processes([str(tmp_path)]))
    assert not rayproc.port_answers("127.0.0.1", port)
