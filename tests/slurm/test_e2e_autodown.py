"""Whole-cluster autodown on the 2-host Slurm test bed (issue 15), through its login host.

The head's job runs the idle watcher (infra/node/autodown.py) beside Ray; after `idle_minutes` without a
job, task, actor or driver it cancels the cluster's worker jobs and then its own job. Nothing is
patched: real slurmctld/slurmd, Ray's own job and state APIs, the laptop's `invoke` as a user runs
it. One cluster serves both halves (kept while busy, removed once idle), with a half-minute idle
period.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest

from tests.slurm.conftest import (
    Register,
    invoke,
    job_of,
    login_spec,
    ok,
    ray_left_on_hosts,
)
from tests.testbed.slurm import SlurmCluster
from tests.waiting import read_json, wait_until, watcher_checked

pytestmark = pytest.mark.slow
#: Long enough that a `status` under CI load still sees the countdown before the removal.
IDLE_MINUTES = 0.5


def cluster_jobs(slurm: SlurmCluster, cluster_id: str) -> list[dict[str, str]]:
    """Every job in the queue carrying the cluster id in its comment (what ownership is by)."""
    out = slurm.run("squeue -h -o '%i|%T|%k'", check=True).stdout
    rows = [dict(zip(("id", "state", "comment"), line.split("|", 2), strict=True))
            for line in out.splitlines() if line.strip()]
    return [r for r in rows if f"rayfleet-cluster={cluster_id}," in r["comment"]]


def status(spec: Path) -> dict[str, Any]:
    return dict(json.loads(ok(invoke("status", "--cluster", str(spec), "--json"))))


def assert_removed_and_cleared(spec: Path, rf_home: Path, slurm: SlurmCluster,
                               job: dict[str, Any], minutes: str) -> None:
    """After the removal: status and teardown on the laptop say so; nothing is left."""
    seen = status(spec)
    assert not seen["running"] and seen["state"] == "removed itself", seen
    assert seen["autodown"]["removed_at"], seen
    plain = ok(invoke("status", "--cluster", str(spec)))
    assert re.search(rf"removed itself after {minutes} idle minutes at \d\d:\d\d", plain), plain
    down = invoke("teardown", "--cluster", str(spec))
    text = ok(down) + down.stderr
    assert re.search(rf"removed itself after {minutes} idle minutes at \d\d:\d\d", text), text
    assert f"cluster '{spec.stem}' is gone" in text, text
    assert not (rf_home / "state" / f"{spec.stem}.json").exists()
    assert not list(slurm.jobs_dir.glob(f"{job['name']}*")), "the job's files must go"
    assert ray_left_on_hosts(slurm, job) == {}


def head_marker(slurm: SlurmCluster, job: dict[str, Any]) -> dict[str, Any]:
    """The watcher's marker file on the head's node ({} while there is none): read there, a poll
    costs no `invoke status` (1-2 CPU-s each)."""
    head = next(h for h in slurm.nodes if h.hostname == job["head_node"])
    text = head.run(f"cat {job['temp_dir']}/autodown-marker.json 2>/dev/null").stdout
    try:
        return dict(json.loads(text))
    except ValueError:
        return {}


def _killed_watcher_comes_back_with_its_countdown(slurm: SlurmCluster,
                                                  job: dict[str, Any]) -> None:
    """`kill -9` of the counting watcher on the head's node: its supervisor starts it again
    within 30 s, counting from the same idle start (infra/node/supervise.py)."""
    head = next(h for h in slurm.nodes if h.hostname == job["head_node"])

    def marker() -> dict[str, Any]:
        return head_marker(slurm, job)

    before = wait_until(lambda: marker() if marker().get("idle_since") else None,
                        "the idle countdown on the head", timeout=30)
    head.run(f"kill -9 {int(before['pid'])}", check=True)
    started = time.monotonic()
    after = wait_until(lambda: (lambda m: m if m.get("pid") not in (None, before["pid"]) else None)(
        marker()), "the watcher started again", timeout=30)
    print(f"[selfdown] watcher back {time.monotonic() - started:.1f}s after kill -9")
    assert after["idle_since"] == before["idle_since"], (before, after)


def test_a_busy_autoscaling_cluster_is_kept_then_cancels_its_workers_and_its_head_once_idle(
        tmp_path: Path, rf_home: Path, slurm_cluster: SlurmCluster, torn_down: Register) -> None:
    """One cluster for both halves of autodown (one `up` fewer, ~80 CI-seconds): kept while a
    Ray job runs, then, once the job stopped and a killed watcher came back with its countdown,
    removed whole after an idle period.

    min_workers: 1 puts a worker job in the queue at once; Ray's own idle timeout (5 min) would
    never cancel it, so only autodown removes it. The autoscaler refills min_workers after the
    watcher cancelled the worker: the head job's exit cancels that one too."""
    spec = torn_down(login_spec(
        tmp_path, slurm_cluster, "selfdown",
        f"autodown: {{idle_minutes: {IDLE_MINUTES}}}\nidle_timeout_minutes: 5\n"
        "worker_types:\n  cpu: {cpus_per_node: 1, min_workers: 1, max_workers: 1}\n"
        "environment:\n  env_vars: {AUTOSCALER_UPDATE_INTERVAL_S: '1'}\n"))
    started = time.monotonic()
    ok(invoke("up", "--cluster", str(spec)))
    print(f"\n[selfdown] up in {time.monotonic() - started:.1f}s")
    job = job_of(rf_home, "selfdown")
    ray_job = ok(invoke("submit", "--cluster", str(spec), "--no-wait",
                        "tests/data/sleeper.py")).strip().splitlines()[-1]
    workers = wait_until(lambda: [j for j in cluster_jobs(slurm_cluster, job["cluster_id"])
                                  if "role=worker" in j["comment"]] or None,
                         "the min_workers job in the queue", timeout=60)
    assert workers
    # A whole idle period with a job running: the cluster stays, and status says why. The
    # watcher's check after that period, seen in its marker on the head; `status` keeps a copy.
    watcher_checked(lambda: head_marker(slurm_cluster, job), IDLE_MINUTES, interval=1)
    print(f"[selfdown] kept while busy, checked {time.monotonic() - started:.1f}s after `up` "
          "started")
    kept = cluster_jobs(slurm_cluster, job["cluster_id"])
    assert [j["state"] for j in kept if "role=head" in j["comment"]] == ["RUNNING"], kept
    assert [j["id"] for j in kept if "role=worker" in j["comment"]] == [workers[0]["id"]], kept
    busy = status(spec)["autodown"]
    assert read_json(rf_home / "autodown" / f"{spec.stem}.json"), "status kept no copy"
    assert busy["idle_s"] is None and "job(s) pending or running" in busy["detail"], busy
    assert busy["removed_at"] is None

    ok(invoke("stop-job", "--cluster", str(spec), ray_job))
    stopped = time.monotonic()
    _killed_watcher_comes_back_with_its_countdown(slurm_cluster, job)

    # The countdown in the words `status` prints: one call a poll, so that a slow `status`
    # under load does not eat the idle period.
    def countdown() -> str | None:
        plain = invoke("status", "--cluster", str(spec))
        found = re.search(rf"autodown: idle \d+\.\d of {IDLE_MINUTES:g} min", plain.stdout)
        return plain.stdout if plain.returncode == 0 and found else None

    assert wait_until(countdown, "the watcher's countdown in status", timeout=30)
    wait_until(lambda: cluster_jobs(slurm_cluster, job["cluster_id"]) == [] or None,
               "every job of the cluster to leave the queue", timeout=120)
    print(f"[selfdown] every job gone {time.monotonic() - stopped:.1f}s after the Ray job "
          f"stopped (idle period {IDLE_MINUTES * 60:.0f} s)")
    assert_removed_and_cleared(spec, rf_home, slurm_cluster, job, f"{IDLE_MINUTES:g}")
