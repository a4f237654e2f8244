"""GCP autodown end to end against the offline Google (issue 15): `invoke up` starts the watcher
beside the head; a running job keeps the cluster past its idle period; once idle, the head stops
Ray's autoscaler (with its supervisor), deletes its workers (a CPU VM, a TPU node) and then its
own VM through the fake APIs with the VM's own service account (metadata server), and the
laptop's next `status` and `teardown` say it removed itself. Its first zone has no TPU capacity: the
head's autoscaler logs the refused min_workers TPU node, so `up` removes that zone's head and VM
and starts over in the next zone of `zones:` (where it waits for every min_workers).

Real `ray up`, real Ray and autoscaler on test-bed hosts, `invoke` as a user runs it; the test bed
is the one test_e2e_cluster.py uses (the package fixture `offline`). `idle_minutes: 0.3` keeps the
idle period at 18 s.
"""

from __future__ import annotations

import datetime as dt
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from infra.core.privilege import MONITOR_PID, SCALER_USER
from infra.core.shipping import NODE_DIR
from tests.gcp_tpu.offline import write_service_account_key
from tests.gcp_tpu.offline_bed import NEXT_ZONE, PROJECT, ZONE, Offline, spec_file
from tests.testbed.hosts import LIVE_PROCESSES
from tests.waiting import read_json, wait_until, watcher_checked

NAME = "gcpdown"
#: The watcher's user and home on the head (the autoscaler's: infra/core/privilege.py).
WATCHER_HOME = f"/home/{SCALER_USER}"
IDLE_MINUTES = 0.3


def _ours(offline: Offline, cluster_id: str) -> list[dict[str, Any]]:
    with offline.fake.lock:
        found = [dict(i) for i in offline.fake.instances.values()
                 if i["labels"].get("rayfleet-cluster") == cluster_id]
        found += [dict(n) for n in offline.fake.tpu_nodes.values()
                  if n["labels"].get("rayfleet-cluster") == cluster_id]
    return found


@dataclass
class Head:
    """The cluster's head as the fake Google lists it, and its test-bed host."""
    cluster_id: str
    vm: dict[str, Any]
    ip: str
    host: Any


@pytest.mark.slow
def test_busy_cluster_is_kept_idle_one_deletes_its_workers_and_itself(
        offline: Offline, tmp_path: Path) -> None:
    fake, google = offline.fake, offline.google
    home = tmp_path / "rayfleet-home"
    key = write_service_account_key(tmp_path / "sa-key.json", google.identity,
                                    f"student@{PROJECT}.iam.gserviceaccount.com")
    # A CPU VM and a TPU node that Ray's autoscaler keeps (min_workers): the head must stop it
    # from launching replacements while it deletes them, or those would leak. The first zone has
    # no TPU capacity: `up` moves the cluster to the next (min_workers refused for capacity).
    spec = spec_file(tmp_path, key, name=NAME, autodown={"idle_minutes": 5}, zone=None,
                     zones=[ZONE, NEXT_ZONE],
                     cpu_workers={"cpu": {"machine_type": "n2-standard-8", "cpus": 1,
                                          "min_workers": 1, "max_workers": 1,
                                          "provisioning": "spot"}},
                     tpu_workers={"tpu": {"accelerator_type": "v4-8", "min_workers": 1,
                                          "max_workers": 1, "cpus": 1, "provisioning": "spot"}})
    started = time.monotonic()
    timings: dict[str, float] = {}
    fake.tpu_stockout_zones.add(ZONE)
    try:
        # 1. A job keeps the cluster past its idle period (while the workers come up).
        job_id, busy_at = _up_then_a_job_then_up_with_a_short_idle_period(offline, home, spec)
        busy_since = time.monotonic()
        head = _head(offline, home)
        _the_watcher_and_the_monitor_run_as_the_scalers_user(head.host)
        timings["up"] = round(time.monotonic() - started, 1)
        _a_running_job_keeps_the_cluster(offline, home, spec, head, busy_at)
        timings["busy, kept"] = round(time.monotonic() - busy_since, 1)
        # 2. Idle: the countdown, then the head deletes its worker and its own VM.
        idle_since = time.monotonic()
        _idle_the_head_deletes_its_workers_then_itself(offline, home, spec, head, job_id)
        timings["idle -> removed itself"] = round(time.monotonic() - idle_since, 1)
        # 3. The laptop's next status and teardown say so; teardown only verifies.
        report = offline.invoke(home, "status", "--cluster", str(spec), "--json", timeout=120)
        assert report.returncode == 0, report.stdout + report.stderr
        reported = json.loads(report.stdout)
        assert reported["state"] == "removed itself" and reported["autodown"]["removed_at"]
        assert reported["cost"]["nodes"] == 0 and not reported["running"]
        plain = offline.invoke(home, "status", "--cluster", str(spec), timeout=120)
        assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in plain.stdout, plain.stdout
    finally:
        fake.tpu_stockout_zones.discard(ZONE)
        down = offline.invoke(home, "teardown", "--cluster", str(spec), timeout=600)
        print(f"\n[gcp autodown] phases (s): {timings}, total {time.monotonic() - started:.1f}",
              flush=True)
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"removed itself after {IDLE_MINUTES:g} idle minutes at " in down.stderr, down.stderr
    assert "ray down" not in down.stderr  # nothing to stop: teardown only verified
    assert not (home / "state" / f"{NAME}.json").exists()
    assert fake.nodes_with({"rayfleet-name": NAME}) == []


def _up_then_a_job_then_up_with_a_short_idle_period(
        offline: Offline, home: Path, spec: Path) -> tuple[str, dt.datetime]:
    """The job's id and when it was submitted.

    The job is submitted before the second `up`: a replaced watcher takes the countdown over from
    its marker (a restart buys no idle period), so a job sent only after the 0.3-minute watcher
    took over raced the idle time the first one had counted since the first `up`."""
    up = offline.invoke(home, "up", "--cluster", str(spec), timeout=900)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "starting the autodown watcher on the head (5 idle minutes)" in up.stderr, up.stderr
    assert "not enforced" not in up.stderr
    _min_workers_refused_for_capacity_moved_to_the_next_zone(offline, home, up.stderr)
    job = offline.invoke(home, "submit", "--cluster", str(spec), "--no-wait",
                         "tests/data/sleeper.py", timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr
    job_id = job.stdout.strip().splitlines()[-1]
    busy_at = dt.datetime.now(dt.timezone.utc)
    # A second `up` with another idle period replaces the running watcher (the countdown
    # below shows its 0.3 minutes); Ray's config is unchanged, so Ray and the job go on.
    spec.write_text(spec.read_text().replace("idle_minutes: 5", f"idle_minutes: {IDLE_MINUTES}"))
    up = offline.invoke(home, "up", "--cluster", str(spec), timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    assert "is already running with this config" in up.stderr, up.stderr
    assert "starting the autodown watcher on the head (0.3 idle minutes)" in up.stderr, up.stderr
    # The cost range (issue 15): head + its two workers, at min and max size alike.
    assert "cost: $" in up.stderr and "(3 nodes), fixed size" in up.stderr, up.stderr
    return job_id, busy_at


def _min_workers_refused_for_capacity_moved_to_the_next_zone(offline: Offline, home: Path,
                                                            said: str) -> None:
    """The head's autoscaler logged the TPU create's refusal in the first zone, so `up` removed
    that zone's head (and the worker VM it had made) and started over in the next zone, where
    it waited for every type's min_workers."""
    fake = offline.fake
    assert f"zone {ZONE} has no capacity for the head or its min_workers" in said, said
    with fake.lock:
        ours = sorted((key[0], i["labels"].get("ray-node-type"), i["status"])
                      for key, i in fake.instances.items()
                      if i["labels"].get("rayfleet-name") == NAME and "tpu_cores" not in i["labels"])
        nodes = [(n["name"].split("/")[3], n["state"]) for n in fake.tpu_nodes.values()
                 if n["labels"].get("rayfleet-name") == NAME]
    # Nothing left in the refused zone.
    assert ours == [(NEXT_ZONE, "head", "RUNNING"), (NEXT_ZONE, "worker", "RUNNING")], ours
    assert nodes == [(NEXT_ZONE, "READY")], nodes
    state = json.loads((home / "state" / f"{NAME}.json").read_text())
    assert [r["attrs"]["zone"] for r in state["resources"]
            if r["kind"] == "gcp-ray-cluster"] == [NEXT_ZONE]


def _head(offline: Offline, home: Path) -> Head:
    cluster_id = json.loads((home / "state" / f"{NAME}.json").read_text())["cluster_id"]
    vm = next(i for i in _ours(offline, cluster_id) if i["labels"].get("ray-node-type") == "head")
    ip = vm["networkInterfaces"][0]["networkIP"]
    return Head(cluster_id, vm, ip, next(h for h in offline.bed.hosts if h.ip == ip))


def _the_watcher_and_the_monitor_run_as_the_scalers_user(head_host: Any) -> None:
    # The watcher runs as the autoscaler's user (issue 29), with its files in that user's
    # home and no key file of ours: the VM's own identity only, through the metadata server.
    files = head_host.run(f"ls {WATCHER_HOME}/.rayfleet").stdout.split()
    assert set(files) <= {"autodown.json", "autodown.json.pid", "autodown-marker.json",
                          "autodown.log", "ray-token"}, files
    assert "autodown.json" in files, files
    # The SSH user's home keeps none of them (beside a head's Prometheus, with `metrics:
    # prometheus`, its config and its supervisor's pid file; no credential).
    # (The bed's hosts see this machine's /root through a copy-on-write overlay: what this
    # machine's own ~/.rayfleet holds, e.g. a Lambda client's `lambda-pacing` of another run,
    # shows there too and is not the head's.)
    machine = Path("/root/.rayfleet")
    own = {p.name for p in machine.iterdir()} if machine.is_dir() else set()
    files = [f for f in head_host.run("ls ~/.rayfleet").stdout.split() if f not in own]
    assert set(files) <= {"metrics.json", "metrics.json.pid", "metrics.yml", "metrics.log",
                          "ray-token"}, files
    watcher = head_host.run("ps -eo user:20,args | grep '[i]nfra.node.autodown'").stdout
    assert "infra.node.autodown --config" in watcher, watcher
    assert {line.split()[0] for line in watcher.splitlines()} == {SCALER_USER}, watcher
    # Ray's monitor runs under the head's supervisor, as that user too: one per head after
    # `up` twice (the second kept it: Ray did not change), and what the watcher stops first
    # (both, by the supervisor's pid file) so that nothing launches replacements below.
    monitors = head_host.run(f"pgrep -u {SCALER_USER} -f '^[^ ]+ -u -m ray[.]autoscaler'")
    assert len(monitors.stdout.split()) == 1, monitors.stdout
    supervised = json.loads(head_host.run(
        f"PYTHONPATH=$(ls -t {WATCHER_HOME}/{NODE_DIR}/*.zip | head -n 1) python3 -m "
        f"infra.node.supervise status --pidfile {WATCHER_HOME}/{MONITOR_PID}").stdout)
    assert supervised["supervisor_running"] and supervised["daemon_running"], supervised
    assert supervised["pid"] == int(monitors.stdout.split()[0]), supervised


def _a_running_job_keeps_the_cluster(offline: Offline, home: Path, spec: Path, head: Head,
                                     busy_at: dt.datetime) -> None:
    wait_until(lambda: {
        "vm" if i.get("status") == "RUNNING" and "tpu_cores" not in i["labels"] else "tpu"
        for i in _ours(offline, head.cluster_id) if i["labels"].get("ray-node-type") == "worker"
        and (i.get("status") == "RUNNING" or i.get("state") == "READY")} == {"vm", "tpu"},
        "the autoscaler's worker VM and TPU node",
        timeout=240, interval=0.5)
    # The watcher looked once a whole idle period had passed since the submit, the job
    # running all along: its marker read on the head (each `invoke status` a poll cost 1-2 CPU-s).
    def marker() -> dict[str, Any] | None:
        text = head.host.run(f"cat {WATCHER_HOME}/.rayfleet/autodown-marker.json").stdout
        try:
            found = json.loads(text or "null")
        except json.JSONDecodeError:  # caught mid-write
            return None
        return found if isinstance(found, dict) else None

    checked = watcher_checked(marker, IDLE_MINUTES, since=busy_at, interval=1)
    assert any(i["name"] == head.vm["name"] for i in _ours(offline, head.cluster_id)), \
        "a head running a job must not remove itself"
    status = offline.invoke(home, "status", "--cluster", str(spec), timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    assert "autodown: busy (1 job(s) pending or running" in status.stdout, status.stdout
    # `status` fetched that marker from the head and keeps a copy (at least as recent).
    copy = read_json(home / "autodown" / f"{spec.stem}.json")
    assert copy and copy.get("checked_at", "") >= checked["checked_at"], (copy, checked)


def _idle_the_head_deletes_its_workers_then_itself(offline: Offline, home: Path, spec: Path,
                                                   head: Head, job_id: str) -> None:
    stopped = offline.invoke(home, "stop-job", "--cluster", str(spec), job_id, timeout=120)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    # The job is stopped a moment after stop-job returns; the watcher notices within 1 s.
    wait_until(lambda: json.loads(head.host.run(
        f"cat {WATCHER_HOME}/.rayfleet/autodown-marker.json").stdout or "{}").get("idle_since") or None,
        "the watcher to count idle time", timeout=15, interval=0.5)
    status = offline.invoke(home, "status", "--cluster", str(spec), timeout=120)
    assert "autodown: idle " in status.stdout and " of 0.3 min" in status.stdout, status.stdout
    wait_until(lambda: not _ours(offline, head.cluster_id), "nothing of the cluster left at the fake",
             timeout=300, interval=1)
    # (The refused zone's head and VM were deleted by `up`, from the laptop.)
    deletes = [(path.rsplit("/", 1)[-1], caller) for host, method, path, caller in offline.google.log
               if method == "DELETE" and NAME in path and f"/{NEXT_ZONE}/" in path]
    assert [name for name, _ in deletes if "head" in name] == [head.vm["name"]], deletes
    assert deletes[-1][0] == head.vm["name"] and len(deletes) == 3, deletes  # the head last
    assert any(name.endswith("-tpu") for name, _ in deletes), deletes
    assert {caller for _, caller in deletes} == {head.ip}, deletes  # the head did it itself
    offline.google.machines.wait_idle()
    left = head.host.run(f"{LIVE_PROCESSES} | grep -E '[r]aylet|[g]cs_server|[i]nfra.node.autodown' "
                         "|| true").stdout.strip()
    assert left == "", left
