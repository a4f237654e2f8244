"""Autoscaling Lambda clusters end to end on the test bed (issue 13): Ray's own autoscaler (v2) on
the head runs our node provider against the fake Lambda API, whose instances are test-bed hosts.

One cluster (with tracking and autodown) is shared by the scenarios of this module, each of which
can run alone: the module's `up` is the first scenario's subject, and every scenario starts from
the cluster up with the head alone and the fake's capacity and boot time as the bed sets them (the
`scaled` fixture brings it there, `up` again after the teardown scenario). Scenarios: up with only
the head -> `up` makes the head's two users (Ray's, the autoscaler's; issue 29) in the host's own
/etc and /home, Ray runs as the first, Ray's monitor and the idle watcher as the second -> the
monitor killed with -9 is back within seconds -> a job needing 2 workers' GPUs scales 0 -> 2 (the
first choice has room for one: the second choice takes the other), and while it holds them a probe
job on the head and on each of the two workers tries every way to the API key, root, the
autoscaler's home and the other machines, and finds none -> idle -> 0 -> no capacity at all: the
job waits, nothing is launched in a loop -> the API key is only in its 0600 file -> `status`
sees the watcher run as the autoscaler's user -> the autoscaler is stopped (with its supervisor)
right after it launched a worker `up` never saw, and `teardown` still removes every instance of
ours -> autodown (issue 15): a new `up` with a short idle period; a running job keeps the cluster,
idleness makes the head terminate every instance of it through the API, and `status` and
`teardown` say so.

A gpu worker offers Ray two GPUs (the spec's `resources`), so that the probe's two one-GPU bundles
fit beside the scaling job's on the same two workers: one scale-up serves both.

The world (test bed, fake, relays to the API for the head, spec) is autoscale_bed.py's.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from bench import lambda_autoscale
from infra.node.autodown import HEAD_MARKER
from infra.providers.lambda_cloud.autoscale import HEAD_TYPE
from tests.browser_metrics import check_report_page
from tests.kept_history import check_workers_went_0_2_0, kept_run
from tests.lambda_cloud.autoscale_bed import (
    API_KEY,
    CAPACITY,
    CLUSTER,
    Scaled,
    autoscale_bed,
    stop_autoscaler,
)
from tests.testbed.preflight import require
from tests.waiting import read_json, wait_until, watcher_checked

#: Launch interval 0.6 s; the head's provider sends a request every 0.1 s at most.
SCALE = 0.05
BOOT_S = 1.0
JOB = Path(__file__).resolve().parents[1] / "data" / "lambda_gpu_job.py"
PROBE = Path(__file__).resolve().parents[1] / "data" / "privilege_probe.py"
RAY_USER, SCALER_USER = "rayfleet-ray", "rayfleet-scaler"
#: Long enough that the watcher never removes this cluster between its scenarios (on a loaded
#: machine the key scan alone may take minutes); its removal is the last scenario's, whose `up`
#: makes a cluster of AUTODOWN_IDLE_MINUTES.
IDLE_MINUTES = 10.0
#: The supervisor's first pause (1 s) and the monitor's start (Ray's imports) on a busy machine.
RESTART_S = 30.0


@pytest.fixture(scope="module")
def bed(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    require("testbed")
    # With the cluster's MLflow tracking server: autoscaled workers must find it too.
    with autoscale_bed(tmp_path_factory.mktemp("lambda-autoscale"), scale=SCALE,
                       boot_delay=BOOT_S, tracking=True) as cluster:
        spec = yaml.safe_load(cluster.spec.read_text())
        spec["autodown"] = {"idle_minutes": IDLE_MINUTES}
        # Two GPUs a worker: the probe's bundles beside the scaling job's (the module's doc).
        spec["worker_types"]["gpu"]["resources"] = {"CPU": 1, "GPU": 2}
        cluster.spec.write_text(yaml.safe_dump(spec))
        yield cluster


@dataclass
class Probed:
    """The privilege probe's `invoke submit` (driver on the head, a task on each of two
    autoscaled workers), and the launches of the scale-up that brought it its workers."""
    submit: subprocess.CompletedProcess[str]
    launches: int


@dataclass
class FirstUp:
    """The module's `up` (the first scenario's subject), and what this cluster went through."""
    done: subprocess.CompletedProcess[str]
    seconds: float
    launches: int
    workers: list[dict[str, Any]]
    #: Set once the cluster scaled 0 -> 2 -> 0 (the kept history then shows it).
    went_0_2_0: bool = False
    #: The privilege probe's run on the two workers of a scale-up, once one ran it.
    probe: Probed | None = None
    #: The instance types of the 0 -> 2 scale-up, its first choice able to take one worker only.
    scaled_types: list[str] | None = None


@pytest.fixture(scope="module")
def first_up(bed: Scaled) -> FirstUp:
    started = time.monotonic()
    up = bed.invoke("up")
    return FirstUp(up, time.monotonic() - started, bed.launches(), bed.workers())


@pytest.fixture
def scaled(bed: Scaled, first_up: FirstUp) -> Scaled:
    """The cluster up with the head alone, the fake as the bed set it."""
    assert first_up.done.returncode == 0, first_up.done.stdout + first_up.done.stderr
    bed.fake.capacity.update(CAPACITY)
    bed.fake.boot_delay = BOOT_S
    if not (bed.home / "state" / f"{CLUSTER}.json").exists():  # the teardown scenario ran
        again = bed.invoke("up")
        assert again.returncode == 0, again.stdout + again.stderr
        first_up.went_0_2_0 = False
    bed.wait("the head alone", lambda: not bed.workers(), timeout=180)
    return bed


def _result(output: str) -> dict[str, Any]:
    return dict(json.loads(output.split("RESULT ", 1)[1].splitlines()[0]))


@pytest.mark.slow
def test_up_starts_only_the_head(scaled: Scaled, first_up: FirstUp) -> None:
    print(f"\n[lambda autoscale] up: {first_up.seconds:.1f}s")
    head = scaled.head()
    assert first_up.workers == [] and first_up.launches == 1
    data = json.loads((scaled.home / "state" / f"{CLUSTER}.json").read_text())
    cid = data["cluster_id"]
    assert head["tags"]["rayfleet-cluster"] == cid and head["name"] == f"{CLUSTER}-{cid}-head"
    ruleset = next(r for r in scaled.fake.firewall_rulesets.values()
                   if r["name"] == f"rayfleet-{CLUSTER}-{cid}")
    assert [r["source_network"] for r in ruleset["rules"]] == ["203.0.113.0/24"]
    assert head["firewall_rulesets"] == [ruleset["id"]]
    # The head's provider files: the API key only in its 0600 file, the token 0600, the package.
    host = scaled.host(head["ip"])
    # (cd inside: nsenter's --wd resolves /root before entering the host's mount namespace)
    # (The key's only copy is the autoscaler's user's: it left the SSH user's home once handed.)
    modes = host.run("cd /root && stat -c '%a %n' /home/rayfleet-scaler/.rayfleet/lambda-api-key "
                     ".rayfleet/ray-token .rayfleet/mlflow-password ray_bootstrap_key.pem "
                     "rayfleet/node/rayfleet-node-*.zip", check=True).stdout.split("\n")
    assert [m.split()[0] for m in modes if m] == ["600", "600", "600", "600", "644"], modes
    assert host.run("test -e /root/.rayfleet/lambda-api-key").returncode != 0
    # Another machine on the network reaches the head's GCS port, but Ray's own client is refused
    # without the cluster's token (and served with it). The dashboard is on the head's loopback.
    address = f"{head['ip']}:6379"
    token = scaled.home / "keys" / CLUSTER / "ray-token"
    refused = scaled.bed.client_run(f"timeout 60 ray status --address {address}",
                                    env={"RAY_AUTH_MODE": "disabled"}, timeout=90)
    assert refused.returncode != 0, refused.stdout
    served = scaled.bed.client_run(f"timeout 60 ray status --address {address}", timeout=90,
                                   env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)})
    assert served.returncode == 0 and "Active:" in served.stdout, served.stdout + served.stderr
    plan = scaled.invoke("plan")
    assert "$0.20/h at minimum size, $1.70/h at maximum size" in plan.stdout, plan.stdout
    assert f"jobs run as {RAY_USER} (no sudo)" in plan.stdout, plan.stdout


def _owners(host: Any, pattern: str) -> set[str]:
    """Users that run processes whose command line matches `pattern` (pgrep -f)."""
    out = host.run(f"pgrep -f {pattern!r} | xargs -r ps -o user:20= -p").stdout
    return set(out.split())


@pytest.mark.slow
def test_up_runs_ray_and_the_autoscaler_as_two_users_of_the_node(scaled: Scaled) -> None:
    head = scaled.host(scaled.head()["ip"])
    assert _owners(head, "[r]aylet/raylet") == {RAY_USER}
    assert _owners(head, "[g]cs_server") == {RAY_USER}
    assert _owners(head, "[r]ay.autoscaler.v2.monitor") == {SCALER_USER}
    groups = head.run(f"id -Gn {RAY_USER}", check=True).stdout.split()
    assert groups == [RAY_USER], groups
    modes = head.run(f"stat -c '%U %a %n' /home/{RAY_USER} /home/{SCALER_USER} "
                     f"/home/{SCALER_USER}/.rayfleet/lambda-api-key "
                     f"/home/{SCALER_USER}/ray_bootstrap_key.pem", check=True).stdout.split("\n")
    assert [m.split()[:2] for m in modes if m] == [
        [RAY_USER, "700"], [SCALER_USER, "700"], [SCALER_USER, "600"], [SCALER_USER, "600"]]
    # The users are the node's own: this machine and the other hosts never saw them.
    here = subprocess.run(["getent", "passwd", RAY_USER, SCALER_USER], capture_output=True)
    assert here.returncode != 0 and not Path(f"/home/{RAY_USER}").exists()
    other = next(h for h in scaled.bed.hosts if h is not head)
    assert other.run(f"getent passwd {SCALER_USER}").returncode != 0
    # (`plan` saying that jobs run as Ray's user is test_up_starts_only_the_head's.)
    # The idle watcher and its supervisor run as the autoscaler's user, reading the API key from
    # that user's 0700 home (its config names the file), which a job, as Ray's user, cannot read.
    assert _owners(head, "[i]nfra.node.autodown") == {SCALER_USER}
    watcher = json.loads(head.run(f"cat /home/{SCALER_USER}/.rayfleet/autodown.json",
                                  check=True).stdout)
    assert watcher["action_args"]["api_key_file"] == "~/.rayfleet/lambda-api-key", watcher
    as_job = head.run(f"runuser -u {RAY_USER} -- cat /home/{SCALER_USER}/.rayfleet/lambda-api-key")
    assert as_job.returncode != 0 and API_KEY not in as_job.stdout, as_job.stderr
    # A head an older rayfleet set up runs its watcher as the SSH user (root here), supervised
    # under the SSH user's pid file: the next `up` stops that one and keeps the scaler's.
    old = head.run("cd /root && PYTHONPATH=$(ls rayfleet/node/*.zip | head -n 1) python3 -m "
                   "infra.node.supervise ensure --pidfile /root/.rayfleet/autodown.json.pid "
                   "--log /root/.rayfleet/autodown.log -- sleep 3600", timeout=60)
    assert old.returncode == 0 and "started" in old.stdout, old.stdout + old.stderr
    again = scaled.invoke("up")
    assert again.returncode == 0, again.stdout + again.stderr
    assert head.run("pgrep -f '[s]leep 3600'").returncode != 0, "the SSH user's watcher runs on"
    assert head.run("ls -A /root/.rayfleet | grep autodown.json").stdout == ""
    assert _owners(head, "[i]nfra.node.autodown") == {SCALER_USER}


@pytest.mark.slow
def test_a_killed_autoscaler_is_back_within_seconds(scaled: Scaled) -> None:
    """Ray's monitor runs under the head's one supervisor (a dead autoscaler leaves workers
    running, or jobs pending forever): one killed with -9, as a crash or the OOM killer ends it,
    runs again within seconds, alone and as the autoscaler's user (in file order, the scaling
    scenario after it is served by the restarted one)."""
    head = scaled.host(scaled.head()["ip"])
    before = scaled.autoscaler_pids()
    assert len(before) == 1, before  # one monitor per head, however many `up`s
    head.run(f"kill -9 {before[0]}", check=True)
    started = time.monotonic()
    scaled.wait("the supervisor to start the autoscaler again",
                lambda: scaled.autoscaler_pids() not in ([], before), timeout=RESTART_S)
    print(f"\n[lambda privilege] autoscaler back after kill -9: {time.monotonic() - started:.1f}s")
    assert len(scaled.autoscaler_pids()) == 1, scaled.autoscaler_pids()
    assert _owners(head, "[r]ay.autoscaler.v2.monitor") == {SCALER_USER}


def _submit_probe(scaled: Scaled) -> subprocess.CompletedProcess[str]:
    """The privilege probe (tests/data/privilege_probe.py) on the head and two workers, waited
    for. The hosts' /home is a copy-on-write layer over this machine's: its users' homes are not
    the node's (the machine's /root is the host's too, but 0700 to everyone but root). The hosts
    see this machine's /opt and package caches (/var/cache) as they see its /usr, which the probe
    leaves alone too: this machine's toolchains and downloads, not where a node keeps a secret
    (each node read them all, hundreds of MB, three at once on the machine's cores)."""
    shared = [f"/home/{d}" for d in sorted(os.listdir("/home"))]
    shared += [f"/opt/{d}" for d in sorted(os.listdir("/opt"))] + ["/var/cache"]
    return scaled.invoke("submit", str(PROBE), "--", "2", *shared, timeout=900)


@pytest.mark.slow
def test_job_needing_two_gpus_scales_from_zero_then_idle_back_to_zero(
        scaled: Scaled, first_up: FirstUp, capsys: pytest.CaptureFixture[str]) -> None:
    before = scaled.launches()
    started = time.monotonic()
    # The job holds the two workers' GPUs until this file exists on the head, so that `status`
    # below sees them while the job still needs them: idle for only 6 s after a job, they may
    # be gone by the time `status` runs on a busy machine.
    release = f"/tmp/rayfleet-release-{secrets.token_hex(6)}"
    # The first choice has room for one worker: the second choice takes the other (what
    # test_first_choice_without_capacity_takes_the_second asserts of this scale-up).
    scaled.fake.capacity[("gpu_1x_a10", "us-west-1")] = 1
    # Submitted and timed until both workers joined by bench/lambda_autoscale.py's own measure
    # (CI runs that bench's measurement here, not on a bed of its own).
    timed = lambda_autoscale.scale_up(scaled, 2, BOOT_S, release)
    assert timed is not None, "the job's two workers did not join (the bench's lines above)"
    job_id = timed.job_id
    printed = capsys.readouterr().out
    print(printed)  # the bench's lines stay in the log
    assert re.search(r"submission -> 2 workers joined: [0-9.]+s; floor [0-9]+s", printed), printed

    def result_logged() -> str | None:
        shown = scaled.invoke("logs", job_id)
        return shown.stdout if shown.returncode == 0 and "RESULT " in shown.stdout else None

    logged = scaled.wait("the job's tasks on two new workers", result_logged, timeout=600)
    print(f"\n[lambda autoscale] 0 -> 2 workers and the job: {time.monotonic() - started:.1f}s")
    workers = scaled.workers()
    assert len(workers) == 2 and scaled.launches() - before == 2, workers
    first_up.scaled_types = sorted(w["type"] for w in workers)
    hosts = sorted(scaled.host(w["ip"]).hostname for w in workers)
    assert sorted(_result(logged)["hosts"]) == hosts
    # Each autoscaled worker's tasks found the head's tracking server and its login.
    head_ip = scaled.head()["ip"]
    assert _result(logged)["tracking"] == [[f"http://{head_ip}:5000", True]] * 2, logged
    for w in workers:
        assert w["tags"]["rayfleet-cluster"] == scaled.head()["tags"]["rayfleet-cluster"]
        assert w["firewall_rulesets"] == scaled.head()["firewall_rulesets"]
    status = scaled.invoke("status", "--json")
    assert status.returncode == 0, status.stderr
    rows = json.loads(status.stdout)["provider_resources"]
    assert sorted(r["state"].split()[-1] for r in rows) == ["active", "autoscaled", "autoscaled"]
    assert {r["id"] for r in rows if "autoscaled" in r["state"]} == {w["id"][:12] for w in workers}
    assert all(r["$/h"].startswith("$") and r["uptime"] != "?" for r in rows), rows
    # The head's Prometheus scrapes the autoscaler itself (what the kept history's nodes-by-type
    # series are made of), not only the nodes' agents.
    _wait_autoscaler_counts(scaled.host(head_ip), 2)
    # The probe's two bundles take each worker's second GPU: it needs no launch of its own
    # (test_jobs_on_head_and_workers_reach_no_credential_while_it_scales_0_2_0 checks it).
    first_up.probe = Probed(_submit_probe(scaled), scaled.launches() - before)
    # Released, the job ends well (`logs --follow` exits with the job's status).
    scaled.host(head_ip).run(f"touch {release}", check=True)
    released = time.monotonic()
    done = scaled.invoke("logs", "--follow", job_id)
    assert done.returncode == 0 and "released" in done.stdout, done.stdout + done.stderr
    # Idle for 0.1 min: the autoscaler terminates both workers; the head stays.
    scaled.wait("both workers terminated", lambda: not scaled.workers(), timeout=180)
    print(f"\n[lambda autoscale] job released -> 0 workers: {time.monotonic() - released:.1f}s")
    assert scaled.head()["status"] == "active"
    status = scaled.invoke("status", "--json")
    assert status.returncode == 0, status.stderr
    report = json.loads(status.stdout)
    assert [r["state"] for r in report["provider_resources"]] == ["active"]
    assert [n["state"] for n in report["nodes"] if n["state"] == "ALIVE"] == ["ALIVE"]
    scaled.fake.wait_powered_off()
    first_up.went_0_2_0 = True


@pytest.mark.slow
def test_jobs_on_head_and_workers_reach_no_credential_while_it_scales_0_2_0(
        scaled: Scaled, first_up: FirstUp) -> None:
    """The probe ran beside the scaling scenario's job on its two workers; alone, it scales the
    cluster 0 -> 2 itself. Either way the separated autoscaler launched exactly its two workers."""
    probed = first_up.probe
    if probed is None:
        before = scaled.launches()
        submit = _submit_probe(scaled)
        probed = first_up.probe = Probed(submit, scaled.launches() - before)
    submit = probed.submit
    assert submit.returncode == 0, submit.stdout + submit.stderr
    assert probed.launches == 2, "the separated autoscaler launched the two workers"
    reports = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    head_ip = scaled.head()["ip"]
    # Two tasks on two distinct workers (the workers' Ray, hence the tasks, run as Ray's user
    # there too), and the driver on the head.
    hosts = [r["host"] for r in reports]
    assert len(set(hosts)) == 3 and hosts[-1] == scaled.host(head_ip).hostname, hosts
    token = (scaled.home / "keys" / CLUSTER / "ray-token").read_text().strip()
    for report in reports:
        _check_probe_report(report, token, submit.stdout)
    assert scaled.host(head_ip).run(
        f"test -e /home/{SCALER_USER}/written-by-a-job").returncode != 0
    # Idle, the separated autoscaler scales back to zero, and says so in its own log.
    scaled.wait("both workers terminated", lambda: not scaled.workers(), timeout=180)
    log = scaled.host(head_ip).run(f"cat /home/{SCALER_USER}/rayfleet/logs/monitor.log").stdout
    assert "terminat" in log.lower(), log[-2000:]
    scaled.fake.wait_powered_off()


def _check_probe_report(report: dict[str, Any], token: str, said: str) -> None:
    """One node's probe report: it found no way to the API key, root, the autoscaler's home or
    the other machines, and the tracking server answered it."""
    where = report["host"]
    assert report["user"] == RAY_USER and report["uid"] != 0, where
    assert not set(report["groups"]) & {"sudo", "adm", "docker", "root", "wheel"}, where
    scan = report["scan"]
    assert scan["complete"] and scan["files_read"] > 100, (where, scan)
    assert API_KEY not in scan["keys"], (where, scan["keys"][API_KEY])
    assert scan["private_keys"] == [], (where, scan["private_keys"])
    # Every key it found, and none, is refused by the API.
    assert report["api"] and set(report["api"].values()) == {401}, (where, report["api"])
    # sudo is there (.ci/run installs it, as cloud images have it) and refuses: exit 1, not
    # "command not found".
    assert report["sudo"] == 1, (where, report["sudo"])
    assert report["write_scaler_home"] in ("PermissionError", "FileNotFoundError"), where
    assert report["ssh"] and all(code != 0 for code in report["ssh"].values()), \
        (where, report["ssh"])
    assert API_KEY not in report["ps"] and token not in report["ps"], where
    assert RAY_USER in report["ps"], where  # it did see the processes
    # The server still serves (a failure's reason is in the job's log, in submit's output).
    assert report["tracking"] == 200, (where, report["tracking"], said[-3000:])


@pytest.mark.slow
def test_metrics_report_of_the_running_cluster_renders(scaled: Scaled, first_up: FirstUp,
                                                       tmp_path: Path) -> None:
    """The head's Prometheus, through the cluster's tunnel: the live report opens in Chromium.
    Alone, the cluster has run no job (after the scaling scenario it ran two) and its Prometheus
    may not have scraped the autoscaler yet: a job of its own (on the head, it asks for nothing)
    and a wait for the head's count give every chart something to draw."""
    if not first_up.went_0_2_0:
        hello = tmp_path / "job" / "hello.py"
        hello.parent.mkdir()
        hello.write_text("print('hello from the head')\n")
        ran = scaled.invoke("submit", str(hello))
        assert ran.returncode == 0, ran.stdout + ran.stderr
    _wait_head_series(scaled.host(scaled.head()["ip"]),
                      f'sum(autoscaler_active_nodes{{NodeType="{HEAD_TYPE}"}}) > 0',
                      "the autoscaler's metric to count the head")
    _wait_head_series(scaled.host(scaled.head()["ip"]), "sum(ray_node_cpu_count) > 0",
                      "the head's agent's CPU count")
    out = tmp_path / "live.html"
    made = scaled.invoke("report", "--out", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    check_report_page(out)


@pytest.mark.slow
def test_first_choice_without_capacity_takes_the_second(scaled: Scaled, first_up: FirstUp) -> None:
    """The scaling scenario's first choice had room for one of its two workers: the first took
    it, the second took the second choice. Alone: one worker, the first choice without any."""
    if first_up.scaled_types is not None:
        assert first_up.scaled_types == ["gpu_1x_a10", "gpu_1x_a100_sxm4"], first_up.scaled_types
        return
    scaled.fake.capacity[("gpu_1x_a10", "us-west-1")] = 0
    submit = scaled.invoke("submit", str(JOB), "--", "1")
    assert submit.returncode == 0, submit.stdout + submit.stderr
    assert [w["type"] for w in scaled.workers()] == ["gpu_1x_a100_sxm4"]
    scaled.wait("the worker terminated", lambda: not scaled.workers(), timeout=180)
    scaled.fake.wait_powered_off()


@pytest.mark.slow
def test_no_capacity_anywhere_waits_without_a_launch_loop(scaled: Scaled) -> None:
    for key in list(scaled.fake.capacity):
        if key[0] != "cpu_4x_general":
            scaled.fake.capacity[key] = 0
    launches = scaled.launches()
    submit = scaled.invoke("submit", "--no-wait", str(JOB), "--", "1")
    assert submit.returncode == 0, submit.stdout + submit.stderr
    job_id = re.search(r"raysubmit_\w+", submit.stdout + submit.stderr)
    assert job_id, submit.stdout + submit.stderr
    submitted = time.time()
    head = scaled.host(scaled.head()["ip"])

    def attempts() -> list[float] | None:
        """The head provider's refused launch attempts since the submit, at the times its log
        gives (Ray's monitor runs apart as the autoscaler's user and logs into that user's
        home), once there are three: three attempts, two backoffs between them. The fake's
        capacity reads no longer tell them apart: while idle, the provider also reads every
        half launch interval."""
        said = head.run("grep -h 'cannot launch gpu' /home/rayfleet-scaler/rayfleet/logs/"
                        "monitor.* || true").stdout
        stamps = map(lambda_autoscale.log_time, said.splitlines())
        times = sorted(t for t in stamps if t and t >= submitted - 1)
        return times if len(times) >= 3 else None

    times = wait_until(attempts, "three launch attempts by the head's node provider",
                       timeout=120, interval=0.5)
    assert scaled.launches() == launches, "no capacity listed: nothing may be launched"
    # One attempt per failure_backoff_s (3 s here) at most, not one per autoscaler loop:
    # measured between the attempts themselves, not against a guessed window (the log's times
    # are whole milliseconds).
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert min(gaps) >= 60 * SCALE * 0.95, gaps
    assert scaled.workers() == []
    said = head.run("grep -h 'cannot launch gpu' /home/rayfleet-scaler/rayfleet/logs/monitor.* "
                    "| head -1")
    assert "no capacity listed" in said.stdout, said.stdout
    stop = scaled.invoke("stop-job", job_id.group(0))
    assert stop.returncode == 0, stop.stdout + stop.stderr


@pytest.mark.slow
def test_api_key_only_in_its_file(scaled: Scaled) -> None:
    head = scaled.host(scaled.head()["ip"])
    # Only the autoscaler's user's copy (issue 29): the SSH user's left once handed over.
    files = scaled.head_files_holding_the_key()
    assert files == ["/home/rayfleet-scaler/.rayfleet/lambda-api-key"], files
    monitor_logs = head.run("ls /home/rayfleet-scaler/rayfleet/logs/monitor*").stdout.split()
    assert monitor_logs, "the autoscaler wrote no log to scan"
    for path in scaled.home.rglob("*"):
        if path.is_file():
            assert API_KEY.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_status_sees_the_watcher_run_as_the_autoscalers_user(scaled: Scaled) -> None:
    """The watcher runs as the autoscaler's user; that it then removes the whole cluster through
    the API, from that user's key, is test_busy_head_stays_idle_head_removes_the_whole_cluster's
    (the last scenario: this cluster's idle period is long enough never to end it).
    A teardown of this cluster is test_teardown_right_after_a_launch_with_the_autoscaler_killed's."""
    status = scaled.invoke("status")
    assert status.returncode == 0, status.stderr
    assert f"jobs run as {RAY_USER} (no sudo)" in status.stdout, status.stdout
    # `status` asks the head as the watcher's user: it sees the watcher run.
    assert "autodown: " in status.stdout and "watcher not running" not in status.stdout, \
        status.stdout


@pytest.mark.slow
def test_teardown_right_after_a_launch_with_the_autoscaler_killed(scaled: Scaled,
                                                                  first_up: FirstUp) -> None:
    launches = scaled.launches()
    scaled.fake.boot_delay = 30.0  # the new worker stays "booting": Ray never sees it join
    submit = scaled.invoke("submit", "--no-wait", str(JOB), "--", "1")
    assert submit.returncode == 0, submit.stdout + submit.stderr
    scaled.wait("the autoscaler's launch", lambda: scaled.launches() > launches, timeout=120)
    head = scaled.host(scaled.head()["ip"])
    assert scaled.autoscaler_pids(), "no autoscaler process on the head"
    # Through its supervisor: a monitor killed alone (`kill -9`) is started again within
    # seconds, and this scenario is a head whose autoscaler is gone for good.
    stop_autoscaler(head)
    cid = scaled.head()["tags"]["rayfleet-cluster"]
    down = scaled.invoke("teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    left = [i for i in scaled.fake.inventory()
            if i["tags"].get("rayfleet-cluster") == cid and i["status"] != "terminated"]
    assert left == []
    assert [r["name"] for r in scaled.fake.firewall_rulesets.values()] == \
        [f"rayfleet-{CLUSTER}-colleague"]
    assert scaled.fake.ssh_keys == {}
    colleague = [i for i in scaled.fake.inventory() if i["foreign"]]
    assert [i["status"] for i in colleague] == ["active"]
    assert not (scaled.home / "state" / f"{CLUSTER}.json").exists()
    _check_metrics_kept(scaled, down, first_up.went_0_2_0)


def _wait_autoscaler_counts(head: Any, workers: int) -> None:
    """Wait until the head's Prometheus, asked on the head, has the autoscaler counting
    `workers` worker nodes; else say what it scrapes."""
    _wait_head_series(head, f'sum(autoscaler_active_nodes{{NodeType!="{HEAD_TYPE}"}}) == {workers}',
                      f"the autoscaler's metric to count {workers} workers")


def _wait_head_series(head: Any, promql: str, what: str) -> None:
    """Wait until the head's Prometheus, asked on the head, answers `promql` (a filter: no
    result until it holds); else say what it scrapes."""
    ask = ("cd /root && curl -sS --get localhost:9090/api/v1/query --data-urlencode "
           f"query={shlex.quote(promql)}")

    def answered() -> bool | None:
        found = json.loads(head.run(ask).stdout or "{}").get("data", {}).get("result", [])
        return True if found else None

    try:
        wait_until(answered, what, timeout=60, interval=1.0)
    except AssertionError as exc:
        targets = head.run("cd /root && curl -sS localhost:9090/api/v1/targets").stdout
        raise AssertionError(f"{exc}; the head's Prometheus targets: {targets[:3000]}") from None


def _check_metrics_kept(scaled: Scaled, down: subprocess.CompletedProcess[str],
                        went_0_2_0: bool) -> None:
    """Teardown kept the head's metrics history here; its worker series went 0 -> 2 -> 0 with the
    demand, and the report drawn from it (the cluster gone) renders. Alone, this scenario's
    cluster never had that demand: teardown then says what became of the history, in one line."""
    if not went_0_2_0:
        said = [line for line in (down.stdout + down.stderr).splitlines()
                if "metrics history" in line]
        assert len(said) == 1, down.stdout + down.stderr
        if "NOT kept" in said[0]:
            return
    else:
        check_workers_went_0_2_0(kept_run(scaled.home, CLUSTER), down.stdout, HEAD_TYPE)
    out = scaled.home / "kept.html"
    made = scaled.invoke("report", "--out", str(out))
    assert made.returncode == 0, made.stdout + made.stderr
    check_report_page(out)
    assert "from the copy kept at teardown" in out.read_text()


#: The autodown scenario's idle period (12 s): its own cluster removes itself within the test.
AUTODOWN_IDLE_MINUTES = 0.2
#: The watcher's marker on the head (it runs as the autoscaler's user), read as root there: a
#: cheap poll where each `invoke status` (which fetches it) costs a CLI process and an SSH session.
MARKER_ON_HEAD = HEAD_MARKER.replace("~", f"~{SCALER_USER}", 1)


def _head_marker(head: Any) -> dict[str, Any] | None:
    """The watcher's marker as the head holds it, or None while there is none."""
    try:
        found = json.loads(head.run(f"cat {MARKER_ON_HEAD}").stdout or "null")
    except json.JSONDecodeError:
        return None
    return found if isinstance(found, dict) else None


@pytest.mark.slow
def test_busy_head_stays_idle_head_removes_the_whole_cluster(
        bed: Scaled, monkeypatch: pytest.MonkeyPatch) -> None:
    """Autodown (issue 15): the watcher `up` starts beside the head asks Ray there; a running job
    keeps the cluster, idleness makes the head terminate every instance of the cluster through the
    API (from the autoscaler's user's key), itself included, and the laptop's next `status` and
    `teardown` say that it removed itself. Last in the module: the teardown scenario removed the
    module's cluster, and this `up` starts one with a short idle period (without Prometheus or
    tracking: nothing here reads them)."""
    if (bed.home / "state" / f"{CLUSTER}.json").exists():  # an earlier scenario left it up
        left = bed.invoke("teardown")
        assert left.returncode == 0, left.stdout + left.stderr
    bed.fake.capacity.update(CAPACITY)
    bed.fake.boot_delay = BOOT_S
    # A teardown took the cluster's key pair along: the instances "boot" with the new one
    # authorized, as Lambda's would (autoscale_bed did so for the first).
    from infra.core import ssh

    monkeypatch.setenv("RAYFLEET_HOME", str(bed.home))
    bed.bed.authorize_key(ssh.ensure_keypair(CLUSTER).public_key)
    module_spec = bed.spec.read_text()
    spec = yaml.safe_load(module_spec)
    spec["autodown"] = {"idle_minutes": AUTODOWN_IDLE_MINUTES}
    spec.pop("metrics_history", None)
    spec.pop("tracking", None)
    spec["metrics"] = "none"
    bed.spec.write_text(yaml.safe_dump(spec))
    try:
        _busy_then_idle_until_removed(bed)
    finally:
        bed.spec.write_text(module_spec)


def _busy_then_idle_until_removed(scaled: Scaled) -> None:
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
    checked = watcher_checked(lambda: _head_marker(host), AUTODOWN_IDLE_MINUTES, interval=1)
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
    def ours() -> list[dict[str, Any]]:
        return [i for i in scaled.fake.inventory() if not i["foreign"]]

    scaled.wait("every instance of the cluster terminated by its own head",
                lambda: all(i["status"] == "terminated" for i in ours()) or None, timeout=180)
    print(f"\n[lambda autodown] cluster gone {time.monotonic() - started:.1f}s after the job "
          f"stopped (idle_minutes={AUTODOWN_IDLE_MINUTES})")
    assert {i["name"] for i in ours()} >= {head["name"]}
    assert all(i["status"] == "active" for i in scaled.fake.inventory() if i["foreign"])

    status = scaled.invoke("status", "--json")
    assert status.returncode == 0, status.stderr
    reported = json.loads(status.stdout)
    assert reported["state"] == "removed itself" and reported["autodown"]["removed_at"]
    assert reported["cost"]["nodes"] == 0
    plain = scaled.invoke("status")
    assert f"removed itself after {AUTODOWN_IDLE_MINUTES:g} idle minutes at " in plain.stdout

    down = scaled.invoke("teardown")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"removed itself after {AUTODOWN_IDLE_MINUTES:g} idle minutes at " in down.stderr
    assert not (scaled.home / "state" / f"{CLUSTER}.json").exists()
