"""GCP's autodown action, run the way a head runs it (`python -m infra.node.autodown --config ...`)
against the fake APIs: the idle watcher deletes the TPU nodes and VMs carrying the cluster's labels,
workers first and its own VM last (an operation nobody polls: the fake finishes it by itself, as
Google does); another cluster's VM and unlabelled VMs are untouched; the marker says it removed the
cluster. The end-to-end version, with the head's own service account and real Ray, is
test_e2e_autodown.py.

The action here is `remove` itself and the supervised autoscaler's stop (`supervise.stop`), not
`stop_ray_then_remove` whole:
on a head from before the separated autoscaler that one runs `ray stop`, which belongs on a head,
never on this machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from infra.node import identity, rayproc, supervise
from infra.providers.gcp_tpu import config
from tests.conftest import ROOT
from tests.gcp_tpu.conftest import PROJECT, ZONE, write_service_account_key
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.idle_watcher import run_idle_watcher
from tests.waiting import wait_until


def test_idle_head_deletes_workers_then_its_own_vm(tmp_path: Path) -> None:
    fake = FakeGcp(PROJECT, op_polls=2, op_seconds=0.5).start()
    try:
        ours, other = "0a0d0e01", "0be70002"

        def labels(cluster_id: str, name: str, role: str) -> dict[str, str]:
            return {**config.sweep_labels(cluster_id, name), identity.TAG_OWNER: "0123456789ab",
                    identity.TAG_NAME: name, "ray-node-type": role}

        fake.add_instance(ZONE, "ray-idle-head", labels(ours, "idle", "head"))
        fake.add_instance(ZONE, "ray-idle-worker-cpu", labels(ours, "idle", "worker"))
        fake.add_tpu_node(ZONE, "ray-idle-worker-tpu", "v4-8", labels(ours, "idle", "worker"))
        fake.add_instance(ZONE, "ray-busy-head", labels(other, "busy", "head"))
        fake.add_instance(ZONE, "prod-db", {"team": "data"})
        # Same name, another id: not this cluster's (both labels must match).
        fake.add_instance(ZONE, "ray-idle-lookalike", labels(other, "idle", "worker"))

        done, _, marker = run_idle_watcher(
            tmp_path, ours, "infra.node.gcp_tpu.autodown:remove",
            {"project": PROJECT, "zone": ZONE, "labels": config.sweep_labels(ours, "idle"),
             "head_name": "ray-idle-head",
             "credentials_file": str(write_service_account_key(tmp_path / "k.json")),
             "api_endpoint": fake.url}, idle_minutes=0.01)
        assert done.returncode == 0, done.stdout + done.stderr
        log = done.stdout
        assert log.index("deleting TPU node ray-idle-worker-tpu") < log.index(
            "deleting the head VM ray-idle-head")
        assert log.index("deleting VM ray-idle-worker-cpu") < log.index("deleting the head VM")
        # Nobody polls the head's own deletion: it finishes by itself a moment later.
        wait_until(lambda: fake.nodes_with({config.CLUSTER_LABEL: ours}) == [],
                   "the cluster's nodes to be deleted", timeout=10, interval=0.1)
        assert sorted(i["name"] for i in fake.instances.values()) == [
            "prod-db", "ray-busy-head", "ray-idle-lookalike"]
        written = json.loads(marker.read_text())
        assert written["phase"] == "removed" and written["removed_at"]
        assert "Ray not answering" in written["detail"]
    finally:
        fake.stop()


def test_the_supervised_autoscaler_is_stopped_for_good_and_nothing_else_is(tmp_path: Path) -> None:
    """What the action stops before deleting workers (the watcher and the separated autoscaler
    are the same node user): Ray's monitor runs under the head's one supervisor, which starts it
    again when it dies (privilege.start_monitor); the action's `stop_autoscaler` (by the
    `monitor_pidfile` that autodown_setup gives it) ends both, so nothing starts it again while
    the cluster goes, and a pid file naming another process stops nothing."""
    from infra.node.gcp_tpu.autodown import stop_autoscaler

    # A stand-in with the monitor's module in its command line (`-m ray.autoscaler...`), and an
    # unrelated process of the same user whose pid a stale pid file may hold.
    sleep = "import time; time.sleep(60)"
    pidfile = tmp_path / "monitor.pid"
    other = subprocess.Popen([sys.executable, "-c", sleep])
    try:
        # A bare pid (what a monitor from before supervision left) names nothing to stop.
        pidfile.write_text(f"{other.pid}\n")
        said: list[str] = []
        assert stop_autoscaler({"monitor_pidfile": str(pidfile)}, said.append) is False
        assert said == []
        assert other.poll() is None, "a process that is not the autoscaler must be left alone"
        assert supervise.ensure([sys.executable, "-c", sleep, "ray.autoscaler._private.monitor"],
                                pidfile, tmp_path / "monitor.out", cwd=str(ROOT))
        first = supervise.status(pidfile)["pid"]
        assert first is not None and "ray.autoscaler" in rayproc.cmdline(first)
        # A monitor that dies (`kill -9`, a crash) is back within seconds.
        os.kill(first, signal.SIGKILL)
        wait_until(lambda: supervise.status(pidfile)["pid"] not in (None, first),
                   "the supervisor to start the monitor again", timeout=15, interval=0.1)
        second = supervise.status(pidfile)["pid"]
        supervisor = supervise.read(pidfile)["supervisor"]
        assert stop_autoscaler({"monitor_pidfile": str(pidfile)}, said.append) is True
        assert said == ["stopped Ray's autoscaler on the head, so that it launches no more workers"]
        wait_until(lambda: not rayproc.cmdline(second) and not supervisor.running(),
                   "the monitor and its supervisor to end", timeout=15, interval=0.1)
        # Stopped for good: longer than the supervisor's first pause, and no monitor came back.
        time.sleep(supervise.FIRST_DELAY_S * 2)
        assert not supervise.running(pidfile) and not pidfile.exists()
        assert stop_autoscaler({"monitor_pidfile": str(tmp_path / "missing.pid")}, said.append) \
            is False
        assert stop_autoscaler({}, said.append) is False
        assert other.poll() is None
    finally:
        supervise.stop(pidfile)
        other.kill()
        other.wait()
