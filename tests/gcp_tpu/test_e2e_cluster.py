"""Ray's own GCP node provider and autoscaler, unpatched, against an offline Google (issue 12).

`invoke up/submit/status/dashboard/teardown --provider=gcp-tpu` run as a user would, inside the
test bed's client namespace (whose /etc/hosts sends Google's names to the fake); the real `ray up`
creates the head through the fake Compute API, the head's autoscaler (credentials from the fake
metadata server) creates a TPU node through the fake TPU API when a job asks for `TPU: 4`, and
deletes it when idle. Every VM and TPU host is a test-bed host with real sshd and real Ray.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bench import gcp_autoscale
from infra.core.privilege import SCALER_USER
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.offline import write_service_account_key
from tests.gcp_tpu.offline_bed import CLUSTER, PROJECT, Offline, spec_file
from tests.gcp_tpu.tracked import ProbeRun, TrackedCluster, probe
from tests.waiting import wait_until


def tpu_nodes(fake: FakeGcp, state: str | None = None) -> list[dict[str, Any]]:
    with fake.lock:
        return [dict(n) for n in fake.tpu_nodes.values()
                if n["labels"].get("ray-cluster-name") == CLUSTER
                and (state is None or n["state"] == state)]


def result_of(output: str) -> dict[str, Any]:
    assert "RESULT " in output, output
    found: dict[str, Any] = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    return found


def test_revoked_key_is_one_line_and_creates_nothing(offline: Offline, tmp_path: Path) -> None:
    """Google's token endpoint refuses the key (google-auth's RefreshError): one line, exit 1."""
    from tests.gcp_tpu.conftest import assert_nothing_created

    home = tmp_path / "rayfleet-home"
    key = write_service_account_key(tmp_path / "sa-key.json", offline.google.identity,
                                    f"revoked@{PROJECT}.iam.gserviceaccount.com")
    offline.google.identity.revoked.add(json.loads(key.read_text())["private_key_id"])
    spec = spec_file(tmp_path, key, name="gcprevoked")
    result = offline.invoke(home, "up", "--cluster", str(spec), timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "Google refused the credentials (invalid_grant" in errors[0], \
        result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert offline.fake.nodes_with({"rayfleet-name": "gcprevoked"}) == []
    assert_nothing_created(home, "gcprevoked")


@pytest.mark.slow
def test_ctrl_c_during_up_removes_what_this_run_created(offline: Offline, tmp_path: Path) -> None:
    home = tmp_path / "rayfleet-home"
    key = write_service_account_key(tmp_path / "sa-key.json", offline.google.identity,
                                    f"student@{PROJECT}.iam.gserviceaccount.com")
    spec = spec_file(tmp_path, key, name="gcpint")
    up = subprocess.Popen(offline.argv("up", "--cluster", str(spec)), env=offline.env(home),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True)
    try:
        # `ray up` has created the head VM and is setting it up when the user presses Ctrl+C
        # (the terminal sends SIGINT to the whole foreground group: invoke and `ray up`).
        wait_until(lambda: [
            i for i in offline.fake.instances.values()
            if i["labels"].get("rayfleet-name") == "gcpint" and i["status"] == "RUNNING"] or None,
            "the head VM",
            timeout=180, interval=0.5)
        os.killpg(up.pid, signal.SIGINT)
        out, err = up.communicate(timeout=300)
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait()
    # (nsenter, the group's leader here, dies of the SIGINT itself; invoke's own exit is 130.)
    assert up.returncode != 0, out + err
    assert "interrupted; removing what this run created" in err, err
    assert "Traceback" not in err
    assert offline.fake.nodes_with({"rayfleet-name": "gcpint"}) == []
    assert offline.fake.nodes_with({"ray-cluster-name": "gcpint"}) == []
    state = json.loads((home / "state" / "gcpint.json").read_text()) if (
        home / "state" / "gcpint.json").exists() else {"resources": []}
    assert state["resources"] == [], state
    offline.google.machines.wait_idle()


@pytest.mark.slow
def test_ray_autoscales_tpu_nodes_against_offline_google(offline: Offline,
                                                         tracked_cluster: TrackedCluster) -> None:
    """A cluster's life in phases (each helper below checks its phase), timed. The cluster is
    the package's `tracked_cluster` (test_e2e_privilege.py's scenarios run on it too); its
    teardown, and that nothing of it is left, are tests/gcp_tpu/tracked.py's `tear_down`."""
    home, spec = tracked_cluster.home, tracked_cluster.spec
    timings = offline.timings
    timings["up"] = tracked_cluster.timings["up"]
    lap = time.monotonic()

    def phase(name: str) -> None:
        nonlocal lap
        now = time.monotonic()
        timings[name] = round(now - lap, 1)
        print(f"[gcp e2e] {name}: {timings[name]} s", flush=True)
        lap = now

    try:
        # 1. up: the head VM with our labels, Ray answering through the dashboard tunnel, no TPU.
        cluster_id, head_host = _up_labels_the_head_and_creates_no_tpu(offline, home,
                                                                       tracked_cluster.up)
        token_file = _the_dashboard_tunnel_needs_the_token(offline, home, spec)
        phase("up checked, tunnel")
        # 2. A job that needs TPU: 4 makes the autoscaler create a spot TPU node; Google preempts
        #    it mid-task: a new node takes over and the job still succeeds there.
        scaled = _demand_creates_a_tpu_node_preempted_mid_job(offline, tracked_cluster,
                                                              cluster_id, phase)
        # Checked once the jobs ran (more logs to search), and by then the tracking server that
        # `up` does not wait for is up (waiting for it right after `up` cost ~30 s of a run).
        _the_token_and_the_password_are_nowhere_else(home, head_host, token_file)
        # 3. Idle: the autoscaler deletes the replacement (the preempted node is 404 by then).
        idle = gcp_autoscale.idle_deleted(offline, scaled)
        assert not tpu_nodes(offline.fake)
        # It was Ray's monitor, as the autoscaler's user (issue 29), that terminated it.
        log = head_host.run(f"cat /home/{SCALER_USER}/rayfleet/logs/monitor.*").stdout
        assert "terminat" in log.lower(), log[-2000:]
        phase("idle -> replacement deleted")
        print(f"[gcp e2e] bench/gcp_autoscale.py's round on this cluster (job done includes the "
              f"preemption):\n{gcp_autoscale.HEADER}\n{gcp_autoscale.row(1, 'e2e', scaled, idle)}",
              flush=True)
        _status_shows_the_head_alone(offline, home, spec, head_host)
    except BaseException:
        _print_post_mortem(offline)
        raise
    finally:
        print(f"[gcp e2e] phases (s): {timings}", flush=True)


def _up_labels_the_head_and_creates_no_tpu(offline: Offline, home: Path,
                                           up: subprocess.CompletedProcess[str]) -> tuple[str, Any]:
    """The cluster's id and the head's test-bed host."""
    bed, fake, google = offline.bed, offline.fake, offline.google
    assert up.returncode == 0, up.stdout + up.stderr
    assert "tracking data lives on the head and goes with the cluster at autodown" in up.stderr
    heads = [i for i in fake.instances.values()
             if i["labels"].get("ray-node-type") == "head"]
    assert len(heads) == 1, heads
    labels = heads[0]["labels"]
    state = json.loads((home / "state" / f"{CLUSTER}.json").read_text())
    cluster_id = str(state["cluster_id"])
    assert labels["rayfleet-cluster"] == cluster_id and labels["ray-cluster-name"] == CLUSTER
    assert labels["rayfleet-name"] == CLUSTER and labels["rayfleet-owner"] == state["owner"]
    assert labels["course"] == "offline-test"
    nat_ip = heads[0]["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
    head_host = next(h for h in bed.hosts if h.ip == nat_ip)
    assert tpu_nodes(fake) == []
    # The head's autoscaler got its credentials from the metadata server, the client never.
    assert any(path.endswith("/token") for ip, path in google.identity.metadata_requests
               if ip == head_host.ip), google.identity.metadata_requests[-5:]
    assert not [r for r in google.identity.metadata_requests if r[0] == bed.client.ip]
    return cluster_id, head_host


def _the_dashboard_tunnel_needs_the_token(offline: Offline, home: Path, spec: Path) -> Path:
    """The cluster's token file (the job API behind `invoke dashboard` refuses a request
    without it, accepts ours)."""
    bed = offline.bed
    tunnel = subprocess.Popen(offline.argv("dashboard", "--cluster", str(spec)),
                              env=offline.env(home), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert tunnel.stdout is not None
        url = tunnel.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), url + (tunnel.stderr.read() if
                                                           tunnel.poll() is not None else "")
        # Token auth: the job API refuses a request without the token, accepts ours.
        token_file = home / "keys" / CLUSTER / "ray-token"
        refused = bed.client_run(f"curl -s -o /dev/null -w '%{{http_code}}' {url}/api/jobs/",
                                 timeout=30)
        assert refused.stdout.strip() == "401", refused
        version = bed.client_run(
            f"curl -sf -H \"Authorization: Bearer $(cat {token_file})\" {url}/api/jobs/",
            timeout=30)
        assert version.returncode == 0, version
    finally:
        # nsenter does not forward signals: Ctrl+C goes to the whole process group, as in a
        # terminal, so `invoke dashboard` inside the namespace gets it too.
        os.killpg(tunnel.pid, signal.SIGINT)
        tunnel.wait(timeout=30)
    return token_file


def _the_token_and_the_password_are_nowhere_else(home: Path, head_host: Any,
                                                 token_file: Path) -> None:
    token = token_file.read_text().strip()
    on_head = head_host.run(
        "stat -c %a ~/.rayfleet/ray-token; grep -rlF \"$(cat ~/.rayfleet/ray-token)\" "
        "~/ray_bootstrap_config.yaml /tmp/ray/session_latest/logs 2>/dev/null; true")
    assert on_head.stdout.split() == ["600"], on_head.stdout  # 0600, and in no config or log
    # ... and on no command line of the head's processes (the pattern comes from the file).
    cmdlines = head_host.run("grep -lFf ~/.rayfleet/ray-token /proc/[0-9]*/cmdline "
                             "2>/dev/null; grep -lFf ~/.rayfleet/mlflow-password "
                             "/proc/[0-9]*/cmdline 2>/dev/null; true")
    assert cmdlines.stdout.strip() == "", cmdlines.stdout
    # The tracking server listens on the head's internal address, not on every interface.
    # (`up` does not wait for it: it comes up beside Ray.)
    listening = wait_until(lambda: (lambda out: out if ":5000" in out else None)(
        head_host.run("ss -ltn 'sport = :5000'").stdout), "the tracking server on the head",
        timeout=120, interval=1)
    assert f"{head_host.ip}:5000" in listening and "0.0.0.0:5000" not in listening, listening
    assert not [p for p in home.rglob("*") if p.is_file() and p != token_file
                and token in p.read_text(errors="replace")]


def _demand_creates_a_tpu_node_preempted_mid_job(offline: Offline, tracked: TrackedCluster,
                                                 cluster_id: str, phase: Callable[[str], None]
                                                 ) -> gcp_autoscale.Demand:
    """The scale-up, timed by bench/gcp_autoscale.py's own round (so CI runs that bench's
    measurement on this cluster instead of on one of its own), its task holding the chips while
    Google preempts the node: one scale-up and one idle period serve both scenarios (they were
    two rounds of node boots).

    The hold only has to outlast, on the first node, the time from the task's start to the
    preemption's kill: the poll below (1 s apart, one `ps` in the host per round) sees the task,
    then `preempt` kills the host's processes from a thread (one more command in the host). That
    is a few seconds even at load; 12 s leaves twice that. The replacement holds as long again.

    test_e2e_privilege.py's probe job runs on the replacement too (tests/gcp_tpu/tracked.py's
    `probe`, recorded in `tracked.probe`): submitted once the replacement is asked for, its task
    queues for the node's chips beside this one's (the spec allows one TPU node), so it needs no
    node of its own. The idle period below then starts when the later of the two tasks ends:
    bench's idle->deleted, counted from this job's task, may include the probe's few seconds."""
    fake, google = offline.fake, offline.google
    home, spec = tracked.home, tracked.spec
    # Only the metadata requests from now on can be this round's TPU hosts' (the probe's check).
    seen_before = len(google.identity.metadata_requests)
    done: dict[str, Any] = {}

    def submit() -> None:
        try:
            done["scaled"] = gcp_autoscale.demand(offline, home, spec, offline.env(home), hold=12)
        except BaseException as exc:  # handed to the test's thread
            done["error"] = exc

    job = threading.Thread(target=submit, daemon=True)
    job.start()

    def holding() -> dict[str, Any] | None:
        if not job.is_alive():  # the job ended before any node held its task
            raise done.get("error") or AssertionError(f"the job ended unpreempted: {done}")
        return next((n for n in tpu_nodes(fake, "READY") if any(
            "placement_on_local_chips" in h.run("ps -eo args").stdout
            for h in google.machines.host_of(n["name"].rsplit("/", 1)[-1]))), None)

    first = wait_until(holding, "a TPU node holding the job's task", timeout=240, interval=1)
    # The node the demand made: ours, the spec's type, spot.
    assert first["labels"]["rayfleet-cluster"] == cluster_id, first["labels"]
    assert first["acceleratorType"] == "v4-8" and first["schedulingConfig"] == {"spot": True}
    first_name = first["name"].rsplit("/", 1)[-1]
    phase("demand -> TPU node created, running the task")
    preempted_at = time.time()
    fake.preempt(first_name)
    # Google removes the preempted node (404 from then on) once the autoscaler has asked for its
    # replacement: Ray's provider must not wedge on it (ray-project/ray#29698) while the
    # replacement runs the job and is scaled down.
    wait_until(lambda: [name for t, what, name in list(fake.events)
                        if what == "create" and t >= preempted_at and name != first_name] or None,
               "the replacement TPU node's create", timeout=240, interval=0.5)
    fake.preempt(first_name, delete=True)
    probed: dict[str, Any] = {}

    def run_probe() -> None:
        try:
            probed["run"] = probe(tracked, seen_before)
        except BaseException as exc:  # handed to the test's thread
            probed["error"] = exc

    prober = threading.Thread(target=run_probe, daemon=True)
    prober.start()
    job.join(timeout=400)
    if "error" in done:
        raise done["error"]
    assert not job.is_alive() and "scaled" in done, done
    scaled: gcp_autoscale.Demand = done["scaled"]
    (replacement,) = [n for n in tpu_nodes(fake) if n["name"].rsplit("/", 1)[-1] != first_name]
    assert replacement["state"] == "READY", tpu_nodes(fake)
    assert replacement["labels"]["rayfleet-cluster"] == cluster_id, replacement["labels"]
    second_host = google.machines.host_of(replacement["name"].rsplit("/", 1)[-1])[0]
    result = result_of(scaled.out)
    assert [r["host"] for r in result["results"]] == [second_host.hostname], result
    assert len(result["results"][0]["tpu_ids"]) == 4, result
    assert 0 < scaled.create <= scaled.joined <= scaled.job, scaled
    prober.join(timeout=660)
    if "error" in probed:
        raise probed["error"]
    assert not prober.is_alive() and "run" in probed, probed
    ran: ProbeRun = probed["run"]
    tracked.probe = ran  # test_e2e_privilege.py's to check
    phase("preempted -> replacement node ran the job (and the privilege probe)")
    return scaled


def _status_shows_the_head_alone(offline: Offline, home: Path, spec: Path,
                                 head_host: Any) -> None:
    status = offline.invoke(home, "status", "--cluster", str(spec), "--json", timeout=120)
    assert status.returncode == 0, status.stdout + status.stderr
    report = json.loads(status.stdout)
    assert report["running"], report
    assert [r["kind"] for r in report["provider_resources"]] == ["Compute VM"], report
    assert report["tracking"]["url"].startswith("http://127.0.0.1:"), report["tracking"]
    # The tracking part alone in the message: a whole report's repr is cut before its error
    # (a CI run once saw runs None here, the reason lost; it passed alone).
    assert report["tracking"]["runs"] == 0, report["tracking"]
    assert "never copied" in report["tracking_copy"], report["tracking_copy"]
    assert [n for n in report["nodes"] if n.get("state") == "ALIVE"] and all(
        n.get("ip") == head_host.ip for n in report["nodes"] if n.get("state") == "ALIVE"), report


def _print_post_mortem(offline: Offline) -> None:
    """What the head's Ray logged last (the test bed goes with the run)."""
    for host in offline.bed.hosts:
        print(f"--- {host.name} ---\n" + host.run(
            "cd /tmp/ray/session_latest/logs 2>/dev/null && tail -n 25 dashboard.log "
            "dashboard_agent.log monitor.log 2>/dev/null | cut -c1-300; "
            "tail -n 15 ~/rayfleet/mlflow.log ~/rayfleet/tracking.log 2>/dev/null").stdout,
            flush=True)
        sshd_log = host.log_path.read_text(errors="replace").splitlines()
        print("\n".join(line for line in sshd_log[-400:] if "logout" not in line
                        and "session" not in line.lower())[-3000:], flush=True)
