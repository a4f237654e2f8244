"""Lambda autodown end to end on the test bed (issue 15): the watcher `up` starts beside the head
asks Ray there; a running job keeps the cluster, idleness makes the head terminate every instance
of the cluster through the (fake) API, itself included, and the laptop's next `status`, `list` and
`teardown` say that it removed itself.

The world (test bed hosts as instances, the fake API reached from the head through a relay) is
autoscale_bed.py's; `idle_minutes: 0.2` keeps the idle period at 12 s.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.core.privilege import SCALER_USER
from infra.node.autodown import HEAD_MARKER
from tests.lambda_cloud.autoscale_bed import CLUSTER, Scaled, autoscale_bed
from tests.testbed.preflight import require
from tests.waiting import read_json, watcher_checked

SCALE = 0.05
IDLE_MINUTES = 0.2
#: The watcher's marker on the head (it runs as the autoscaler's user), read as root there: a
#: cheap poll where each `invoke status` (which fetches it) costs a CLI process and an SSH session.
MARKER_ON_HEAD = HEAD_MARKER.replace("~", f"~{SCALER_USER}", 1)


@pytest.fixture(scope="module")
def scaled(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    require("testbed")
    with autoscale_bed(tmp_path_factory.mktemp("lambda-autodown"), scale=SCALE, boot_delay=1.0,
                       hosts=2) as cluster:
        spec = yaml.safe_load(cluster.spec.read_text())
        spec["autodown"] = {"idle_minutes": IDLE_MINUTES}
        # No Prometheus on the head: nothing here reads metrics (test_e2e_autoscale.py's do).
        spec.pop("metrics_history", None)
        spec["metrics"] = "none"
        cluster.spec.write_text(yaml.safe_dump(spec))
        yield cluster


def _ours(scaled: Scaled) -> list[dict[str, object]]:
    return [i for i in scaled.fake.inventory() if not i["foreign"]]


def _head_marker(head: Any) -> dict[str, Any] | None:
    """The watcher's marker as the head holds it, or None while there is none."""
    try:
        found = json.loads(head.run(f"cat {MARKER_ON_HEAD}").stdout or "null")
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


@pytest.mark.slow
def test_busy_head_stays_idle_head_removes_the_whole_cluster(scaled: Scaled) -> None:
    up = scaled.invoke("up")
    assert up.returncode == 0, up.stdout + up.stderr
    assert "starting the autodown watcher on the head" in up.stderr
    head = scaled.head()

    job = scaled.invoke("submit", "--no-wait", "tests/data/sleeper.py")
    assert job.returncode == 0, job.stdout + job.stderr
    job_id = job.stdout.strip().splitlines()[-1]
    # The watcher looked once a whole idle period had passed, with the job running (read on the
    # head); `status` fetches its marker from the head and keeps a copy here.
    host = scaled.host(head["ip"])
    checked = watcher_checked(lambda: _head_marker(host), IDLE_MINUTES, interval=1)
    assert scaled.head()["id"] == head["id"], "a head running a job must not remove itself"
    status = scaled.invoke("status")
    assert status.returncode == 0, status.stderr
    assert "autodown: busy (1 job(s) pending or running" in status.stdout, status.stdout
    copy = read_json(scaled.home / "autodown" / f"{scaled.spec.stem}.json")
    assert copy and copy["checked_at"] >= checked["checked_at"], (copy, checked)
    stopped = scaled.invoke("stop-job", job_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # `stop-job` returns once Ray reports the job STOPPED; its supervisor actor ends a moment
    # later, and until then the watcher rightly counts the head busy (a CI run on a loaded
    # machine caught "1 actor(s) alive"). So: the watcher's first check without it (on the
    # head), then `status`, which also caches the idle countdown on this machine.
    scaled.wait("the watcher to see the head idle",
                lambda: (_head_marker(host) or {}).get("idle_since"), timeout=60)
    status = scaled.invoke("status")
    assert "autodown: idle " in status.stdout, status.stdout

    started = time.monotonic()
    scaled.wait("every instance of the cluster terminated by its own head",
                lambda: all(i["status"] == "terminated" for i in _ours(scaled)) or None,
                timeout=180)
    print(f"\n[lambda autodown] cluster gone {time.monotonic() - started:.1f}s after the job "
          f"stopped (idle_minutes={IDLE_MINUTES})")
    assert {i["name"] for i in _ours(scaled)} >= {head["name"]}
    assert all(i["status"] == "active" for i in scaled.fake.inventory() if i["foreign"])

    status = scaled.invoke("status", "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["state"] == "removed itself" and reported["autodown"]["removed_at"]
    assert reported["cost"]["nodes"] == 0
    plain = scaled.invoke("status")
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in plain.stdout

    down = scaled.invoke("teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in down.stderr
    assert not (Path(scaled.home) / "state" / f"{CLUSTER}.json").exists()
