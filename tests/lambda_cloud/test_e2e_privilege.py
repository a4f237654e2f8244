"""What a job can reach on a Lambda cluster (issue 29), end to end on the test bed with real Ray.

One autoscaling cluster with tracking and autodown serves every scenario, each of which can run
alone (the `scaled` fixture hands it the cluster up with its head alone, again after the teardown
scenario): `up` makes the head's two users
(Ray's, the autoscaler's) in the host's own /etc and /home, Ray runs as the first and Ray's
monitor as the second, under the head's supervisor (killed with -9, it is back within seconds);
a job on the head and one on each of two autoscaled workers try every way to the API key, root,
the autoscaler's home and the other machines, and find none, while the separated autoscaler
scales 0 -> 2 -> 0 for them and the tracking server answers them; `status` sees the idle watcher
run as the autoscaler's user (its removing the cluster is test_e2e_autodown.py's).

The world (test bed hosts as instances, the fake API reached through relays) is autoscale_bed.py's.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.lambda_cloud.autoscale_bed import API_KEY, CLUSTER, Scaled, autoscale_bed
from tests.testbed.preflight import require

SCALE = 0.05
#: Long enough that the watcher never removes this cluster between its scenarios (on a loaded
#: machine the key scan alone may take minutes); its removal is test_e2e_autodown.py's.
IDLE_MINUTES = 10.0
#: The supervisor's first pause (1 s) and the monitor's start (Ray's imports) on a busy machine.
RESTART_S = 30.0
PROBE = Path(__file__).resolve().parents[1] / "data" / "privilege_probe.py"
RAY_USER, SCALER_USER = "rayfleet-ray", "rayfleet-scaler"


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scaled]:
    require("testbed")
    with autoscale_bed(tmp_path_factory.mktemp("lambda-privilege"), scale=SCALE, boot_delay=1.0,
                       hosts=3, tracking=True) as cluster:
        spec = yaml.safe_load(cluster.spec.read_text())
        spec["autodown"] = {"idle_minutes": IDLE_MINUTES}
        cluster.spec.write_text(yaml.safe_dump(spec))
        yield cluster


@pytest.fixture(scope="module")
def first_up(bed: Scaled) -> subprocess.CompletedProcess[str]:
    """The module's `up`: the first scenario's subject."""
    return bed.invoke("up")


@pytest.fixture
def scaled(bed: Scaled, first_up: subprocess.CompletedProcess[str]) -> Scaled:
    """The cluster up (again, after the teardown scenario) with its head alone."""
    assert first_up.returncode == 0, first_up.stdout + first_up.stderr
    if not (bed.home / "state" / f"{CLUSTER}.json").exists():
        again = bed.invoke("up")
        assert again.returncode == 0, again.stdout + again.stderr
    bed.wait("the head alone", lambda: not bed.workers(), timeout=180)
    return bed


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
    plan = scaled.invoke("plan")
    assert f"jobs run as {RAY_USER} (no sudo)" in plan.stdout, plan.stdout
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


@pytest.mark.slow
def test_jobs_on_head_and_workers_reach_no_credential_while_it_scales_0_2_0(scaled: Scaled) -> None:
    before = scaled.launches()
    # The hosts' /home is a copy-on-write layer over this machine's: its users' homes are not the
    # node's (the machine's /root is the host's too, but 0700 to everyone but root).
    shared = [f"/home/{d}" for d in sorted(os.listdir("/home"))]
    submit = scaled.invoke("submit", str(PROBE), "--", "2", *shared, timeout=900)
    assert submit.returncode == 0, submit.stdout + submit.stderr
    assert scaled.launches() - before == 2, "the separated autoscaler launched the two workers"
    reports = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    head_ip = scaled.head()["ip"]
    # Two tasks on two distinct workers (the workers' Ray, hence the tasks, run as Ray's user
    # there too), and the driver on the head.
    hosts = [r["host"] for r in reports]
    assert len(set(hosts)) == 3 and hosts[-1] == scaled.host(head_ip).hostname, hosts
    token = (scaled.home / "keys" / CLUSTER / "ray-token").read_text().strip()
    for report in reports:
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
        assert report["tracking"] == 200, (where, report["tracking"], submit.stdout[-3000:])
    assert scaled.host(head_ip).run(
        f"test -e /home/{SCALER_USER}/written-by-a-job").returncode != 0
    # Idle, the separated autoscaler scales back to zero, and says so in its own log.
    scaled.wait("both workers terminated", lambda: not scaled.workers(), timeout=180)
    log = scaled.host(head_ip).run(f"cat /home/{SCALER_USER}/rayfleet/logs/monitor.log").stdout
    assert "terminat" in log.lower(), log[-2000:]
    scaled.fake.wait_powered_off()


@pytest.mark.slow
def test_the_api_key_on_the_head_is_only_the_autoscalers(scaled: Scaled) -> None:
    # The SSH user's home (root's on the bed) included: the key went there over SFTP and left once
    # handed over, for the autoscaler and for the idle watcher alike.
    files = scaled.head_files_holding_the_key()
    assert files == [f"/home/{SCALER_USER}/.rayfleet/lambda-api-key"], files


@pytest.mark.slow
def test_status_sees_the_watcher_run_as_the_autoscalers_user(scaled: Scaled) -> None:
    """The watcher runs as the autoscaler's user; that it then removes the whole cluster through
    the API, from that user's key, is test_e2e_autodown.py's scenario on the same separated head
    (this module's cluster would only repeat it: its idle period is long enough never to end it)."""
    status = scaled.invoke("status")
    assert status.returncode == 0, status.stderr
    assert f"jobs run as {RAY_USER} (no sudo)" in status.stdout, status.stdout
    # `status` asks the head as the watcher's user: it sees the watcher run.
    assert "autodown: " in status.stdout and "watcher not running" not in status.stdout, \
        status.stdout
    down = scaled.invoke("teardown")
    assert down.returncode == 0, down.stdout + down.stderr
