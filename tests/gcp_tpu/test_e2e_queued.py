"""Queued TPU slices joined to a running cluster, against the offline Google (issue 16).

One cluster for every scenario (module fixture, on the package's bed of four test-bed hosts, the
`offline` fixture: the head, a v4-8 slice and a 2-host v4-16 slice): `invoke up` queues a request
per slice and returns once the head answers; the fake keeps each slice's request
WAITING_FOR_RESOURCES until its scenario lets it go, then moves it PROVISIONING -> ACTIVE; the
head's joiner (a real daemon on the head, started by `up`) sets the slices' hosts up over SSH and
starts Ray there. Each scenario can run alone (the `cluster` fixture
brings the cluster up again after the teardown scenario): a job submitted before ACTIVE waits and
runs on the queued slice; the 2-host slice joins with the slice-head resource on host 0; a spot slice
the fake SUSPENDs is reported and queued again in the next zone; teardown with requests still
WAITING deletes them all. No patching: `invoke` runs as a user would, in the client namespace.
(min_workers refused for capacity in the first zone: test_e2e_autodown.py's cluster moves zones.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bench import gcp_queued
from infra.core.privilege import SCALER_USER
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.offline import write_service_account_key
from tests.gcp_tpu.offline_bed import NEXT_ZONE, PROJECT, ZONE, Offline, spec_file
from tests.gcp_tpu.tracked import LIVE as tracked_clusters
from tests.gcp_tpu.tracked import tear_down
from tests.testbed.hosts import LIVE_PROCESSES, Host
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

NAME = "gcpqueued"
#: How long the fake keeps a request PROVISIONING. Nothing waits a fixed time in WAITING: each
#: slice is held there (`queue_held`) until its scenario lets it go, so a job is submitted before
#: ACTIVE however long `up` and the scenarios before took (a 30 s wait was most of one scenario).
PROVISION_S = 2.0


@dataclass
class Cluster:
    offline: Offline
    home: Path
    spec: Path
    cluster_id: str
    timings: dict[str, float]

    @property
    def fake(self) -> FakeGcp:
        return self.offline.fake

    def invoke(self, command: str, *args: str, timeout: float = 300) -> Any:
        return self.offline.invoke(self.home, command, "--cluster", str(self.spec), *args,
                                   timeout=timeout)

    def qr(self, slice_name: str, attempt: int = 0) -> str:
        return f"rf-{self.cluster_id}-{slice_name}-0-{attempt}"

    def hosts_of(self, qr_id: str) -> list[Host]:
        return self.offline.google.machines.host_of(qr_id)

    def head(self) -> Host:
        heads = [i for i in self.fake.instances.values()
                 if i["labels"].get("ray-node-type") == "head"
                 and i["labels"].get("rayfleet-name") == NAME]
        ip = heads[0]["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
        return next(h for h in self.offline.bed.hosts if h.ip == ip)

    def ray_nodes(self) -> list[dict[str, Any]]:
        """Ray's own node list, asked on the head (its dashboard binds 127.0.0.1 there)."""
        script = ("import json, os, requests; "
                  "t = open(os.path.expanduser('~/.rayfleet/ray-token')).read().strip(); "
                  "r = requests.get('http://127.0.0.1:8265/api/v0/nodes', timeout=10, "
                  "params={'detail': 'true', 'limit': '100'}, "
                  "headers={'Authorization': 'Bearer ' + t}); "
                  "print(json.dumps(r.json()['data']['result']['result']))")
        done = self.head().run(f"~/rayfleet/env/bin/python -c {json.dumps(script)}", timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        nodes: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
        return nodes


#: The joiner's pid (the daemon its supervisor's pid file names, infra/node/supervise.py), the
#: users its supervisor and it run as, then "alive" while it runs. It runs as the autoscaler's
#: user (it queues slices with the VM's service account), whose home holds the pid file.
JOINER_ALIVE = ("pid=$(python3 -c 'import json; print(json.load(open("
                f"\"/home/{SCALER_USER}/.rayfleet/queued.json.pid\"))[\"child\"][\"pid\"])') && "
                "echo $pid && sup=$(ps -o ppid= -p $pid | tr -d ' ') && "
                "ps -o user:20= -p $pid,$sup | tr -d ' ' | sort -u | paste -sd, && "
                "kill -0 $pid && echo alive")

def result_of(output: str) -> dict[str, Any]:
    assert "RESULT " in output, output
    found: dict[str, Any] = json.loads(output.split("RESULT ", 1)[1].splitlines()[0])
    return found


@pytest.fixture(scope="module")
def bed(offline: Offline) -> Iterator[Offline]:
    """The package's offline Google (a bed of its own cost one more test bed and Google per run),
    its queue as this module's scenarios want it while they run, as it was after. The cluster
    takes all four hosts: the package's tracked cluster, when still up (test_e2e_cluster.py picked
    without test_e2e_privilege.py, whose end tears it down), goes first."""
    for tracked in tracked_clusters:
        tear_down(tracked)
    fake = offline.fake
    fake.queue_provision_s = PROVISION_S
    fake.queue_held_zones.add(NEXT_ZONE)  # no capacity there: requests keep waiting
    try:
        yield offline
    finally:
        fake.queue_provision_s = 0.0
        fake.queue_held_zones.discard(NEXT_ZONE)
        fake.queue_held.clear()


def _up(offline: Offline, work: Path) -> Cluster:
    """`invoke up` of the module's cluster, its slices held until their scenarios let them go."""
    offline.fake.queue_held.update({"-pod-", "-single-"})
    home = work / "rayfleet-home"
    key = write_service_account_key(work / "sa-key.json", offline.google.identity,
                                    f"student@{PROJECT}.iam.gserviceaccount.com")
    # No Prometheus on the head (`metrics: none`, spec_file's default): nothing here reads it.
    spec = spec_file(work, key, name=NAME, zone=None, zones=[ZONE, NEXT_ZONE],
                     tpu_workers={}, metrics="none", queued_slices={
                         "single": {"accelerator_type": "v4-8", "provisioning": "spot",
                                    "cpus": 1},
                         "pod": {"accelerator_type": "v4-16", "zones": [ZONE], "cpus": 1},
                         "parked": {"accelerator_type": "v4-8", "zones": [NEXT_ZONE],
                                    "valid_until_hours": 2}})
    started = time.monotonic()
    up = offline.invoke(home, "up", "--provider", "gcp-tpu", "--cluster", str(spec), timeout=600)
    assert up.returncode == 0, up.stdout + up.stderr
    state = json.loads((home / "state" / f"{NAME}.json").read_text())
    return Cluster(offline, home, spec, state["cluster_id"],
                   {"up": round(time.monotonic() - started, 1)})


@pytest.fixture(scope="module")
def module_cluster(bed: Offline, tmp_path_factory: pytest.TempPathFactory
                   ) -> Iterator[list[Cluster]]:
    """The module's cluster, in a list the `cluster` fixture replaces it in after a teardown."""
    made = [_up(bed, tmp_path_factory.mktemp("gcp-queued-"))]
    try:
        yield made
    finally:
        if (made[0].home / "state" / f"{NAME}.json").exists():  # the teardown scenario did not run
            made[0].invoke("teardown", timeout=600)
        print(f"[gcp queued e2e] phases (s): {made[0].timings}", flush=True)


@pytest.fixture
def cluster(module_cluster: list[Cluster]) -> Cluster:
    """The module's cluster, up (again, after the teardown scenario)."""
    if not (module_cluster[0].home / "state" / f"{NAME}.json").exists():
        module_cluster[0] = _up(module_cluster[0].offline, module_cluster[0].home.parent)
    return module_cluster[0]


def test_up_queues_a_request_per_slice_recorded_in_state(cluster: Cluster) -> None:
    state = json.loads((cluster.home / "state" / f"{NAME}.json").read_text())
    recorded = {r["id"]: r["attrs"]["zone"] for r in state["resources"]
                if r["kind"] == "gcp-queued-resource"}
    assert recorded == {cluster.qr("single"): ZONE, cluster.qr("pod"): ZONE,
                        cluster.qr("parked"): NEXT_ZONE}
    states = cluster.fake.queued_states()
    assert {k: v for k, v in states.items() if k in recorded} == {
        cluster.qr("single"): (ZONE, "WAITING_FOR_RESOURCES"),
        cluster.qr("pod"): (ZONE, "WAITING_FOR_RESOURCES"),
        cluster.qr("parked"): (NEXT_ZONE, "WAITING_FOR_RESOURCES")}
    with cluster.fake.lock:
        body = cluster.fake.queued[
            f"projects/{PROJECT}/locations/{ZONE}/queuedResources/{cluster.qr('single')}"]
    node = body["tpu"]["nodeSpec"][0]["node"]
    assert body["spot"] == {} and node["labels"]["rayfleet-cluster"] == cluster.cluster_id
    assert node["labels"]["rayfleet-owner"] == state["owner"] and node["labels"][
        "rayfleet-name"] == NAME
    # The joiner runs on the head, detached from this laptop.
    pid = cluster.head().run(JOINER_ALIVE)
    assert pid.stdout.strip().endswith("alive"), pid.stdout + pid.stderr
    # The joiner and its supervisor run as the autoscaler's user (issue 29), which the metadata
    # server answers besides root: no exception for the SSH user is needed.
    assert pid.stdout.split()[1] == SCALER_USER, pid.stdout


def test_a_second_up_queues_nothing_new_and_restarts_the_joiner(cluster: Cluster) -> None:
    head = cluster.head()
    before = head.run(JOINER_ALIVE).stdout.split()[0]
    requests = len(cluster.fake.queued)
    started = time.monotonic()
    again = cluster.invoke("up", timeout=600)
    cluster.timings["second up"] = round(time.monotonic() - started, 1)
    assert again.returncode == 0, again.stdout + again.stderr
    assert len(cluster.fake.queued) == requests
    after = head.run(JOINER_ALIVE).stdout.split()
    assert after[-1] == "alive" and after[0] != before, (before, after)


def test_a_job_submitted_before_active_waits_and_runs_on_the_queued_slice(cluster: Cluster) -> None:
    assert cluster.fake.queued_states()[cluster.qr("single")][1] != "ACTIVE"
    started = time.monotonic()
    submit = subprocess.Popen(cluster.offline.argv(
        "submit", "--cluster", str(cluster.spec), "examples/tpu_example.py", "--",
        "--wait-for-tpu", "420", "--placement-only"), env=cluster.offline.env(cluster.home),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        # The job's driver on the head waits for a TPU host: only now may the slice come.
        wait_until(lambda: submit.poll() is not None or cluster.head().run(
            "grep -l 'waiting up to 420 s' /tmp/ray/session_latest/logs/job-driver-*.log "
            "2>/dev/null").stdout.strip(), "the job's driver to wait for a TPU host",
            timeout=300, interval=1)
        cluster.fake.queue_held.discard("-single-")
        out, err = submit.communicate(timeout=600)
    finally:
        if submit.poll() is None:
            os.killpg(submit.pid, signal.SIGKILL)
            submit.wait()
    cluster.timings["job waited for the queued slice"] = round(time.monotonic() - started, 1)
    assert submit.returncode == 0, out + err
    assert "waiting up to 420 s" in out, out  # it was submitted before ACTIVE
    (host,) = cluster.hosts_of(cluster.qr("single"))
    result = result_of(out)
    assert [r["host"] for r in result["results"]] == [host.hostname], result
    assert len(result["results"][0]["tpu_ids"]) == 4, result
    # The token reached the host as a 0600 file, and is on no command line there.
    check = host.run("stat -c %a ~/.rayfleet/ray-token; grep -lFf ~/.rayfleet/ray-token "
                     "/proc/[0-9]*/cmdline 2>/dev/null; true")
    assert check.stdout.split() == ["600"], check.stdout
    # Ray runs there as Ray's user, which gets no connection to the metadata server (issue 29).
    owners = host.run("pgrep -f '[r]aylet/raylet' | xargs -r ps -o user:20= -p").stdout.split()
    assert owners == ["rayfleet-ray"], owners
    ask = ("curl -s -o /dev/null -w '%{http_code}' -H 'Metadata-Flavor: Google' http://"
           "metadata.google.internal/computeMetadata/v1/instance/service-accounts/default/token")
    answers = [host.run(f"{who}{ask}").stdout for who in ("", "runuser -u rayfleet-ray -- ")]
    # Root gets the server's answer (this fake node has no service account: 404), Ray's user no
    # connection at all (curl's 000).
    assert answers[0] != "000" and answers[1] == "000", answers


def test_a_two_host_slice_joins_with_the_slice_head_resource_on_host_0(cluster: Cluster) -> None:
    started, released = time.monotonic(), time.time()
    cluster.fake.queue_held.discard("-pod-")
    qr_id = cluster.qr("pod")
    # Timed by bench/gcp_queued.py's own measure (CI runs that bench's measurement here, not on
    # a bed of its own): from ACTIVE until a raylet runs on both hosts, and the joiner's account.
    took = gcp_queued.hosts_up(cluster.offline, ("pod",), released)
    print(f"[gcp queued e2e] bench/gcp_queued.py on this cluster: {took}", flush=True)
    assert 0 < took["pod: ACTIVE -> hosts up"] < 420, took
    gcp_queued.print_joiner(cluster.head())
    wait_until(lambda: cluster.fake.queued_states()[qr_id][1] == "ACTIVE",
             "the 2-host slice to be ACTIVE", timeout=120, interval=0.5)
    hosts = cluster.hosts_of(qr_id)
    assert len(hosts) == 2

    def joined() -> list[dict[str, Any]] | None:
        nodes = [n for n in cluster.ray_nodes() if n["state"] == "ALIVE"
                 and n["node_ip"] in {h.ip for h in hosts}]
        return nodes if len(nodes) == 2 else None

    nodes = wait_until(joined, "both hosts of the slice in Ray", timeout=420, interval=3)
    cluster.timings["2-host slice released -> both hosts in Ray"] = round(
        time.monotonic() - started, 1)
    by_ip = {n["node_ip"]: n for n in nodes}
    first, second = by_ip[hosts[0].ip], by_ip[hosts[1].ip]
    assert first["resources_total"]["TPU"] == 4 and second["resources_total"]["TPU"] == 4
    assert first["resources_total"].get("TPU-v4-16-head") == 1, first["resources_total"]
    assert "TPU-v4-16-head" not in second["resources_total"], second["resources_total"]
    assert first["labels"].get("rayfleet-queued") == qr_id, first["labels"]


def test_a_suspended_spot_slice_is_reported_and_queued_again_in_the_next_zone(
        cluster: Cluster) -> None:
    lost, again = cluster.qr("single"), cluster.qr("single", attempt=1)
    cluster.fake.queue_held.discard("-single-")  # (the job's scenario let it go if it ran)
    wait_until(lambda: cluster.fake.queued_states()[lost][1] == "ACTIVE",
               "the spot slice to be ACTIVE", timeout=120, interval=0.5)
    started = time.monotonic()
    cluster.fake.suspend(lost)
    wait_until(lambda: cluster.fake.queued_states().get(again) == (NEXT_ZONE,
                                                                 "WAITING_FOR_RESOURCES"),
             "a new request in the next zone",
             timeout=120, interval=0.5)
    cluster.timings["suspended -> re-queued"] = round(time.monotonic() - started, 1)

    def reported() -> dict[str, Any] | None:
        status = cluster.invoke("status", "--json", timeout=180)
        assert status.returncode == 0, status.stdout + status.stderr
        report: dict[str, Any] = json.loads(status.stdout)
        return report if any(again in w for w in report["warnings"]) else None

    report = wait_until(reported, "status to report the re-queued request", timeout=120, interval=3)
    rows = {r["name"]: r for r in report["provider_resources"]
            if r["kind"] == "queued TPU request"}
    assert (rows[lost]["state"], rows[lost]["zone"]) == ("SUSPENDED", ZONE), rows
    assert (rows[again]["state"], rows[again]["zone"]) == ("WAITING_FOR_RESOURCES", NEXT_ZONE)
    # Every other request as the fake has it (the 2-host one is ACTIVE once its scenario ran).
    pod = cluster.qr("pod")
    assert rows[pod]["state"] == cluster.fake.queued_states()[pod][1] and rows[lost]["since"], rows
    assert [w for w in report["warnings"] if lost in w and "SUSPENDED" in w], report["warnings"]


def test_teardown_with_requests_still_waiting_deletes_them_all(cluster: Cluster) -> None:
    # The request parked in the zone without capacity waits for good; which others still wait
    # depends on the scenarios that ran before (after all of them: the re-queued spot slice).
    waiting = [k for k, (_, s) in cluster.fake.queued_states().items()
               if s == "WAITING_FOR_RESOURCES"]
    assert cluster.qr("parked") in waiting, waiting
    started = time.monotonic()
    down = cluster.invoke("teardown", timeout=900)
    cluster.timings["teardown"] = round(time.monotonic() - started, 1)
    assert down.returncode == 0, down.stdout + down.stderr
    assert cluster.fake.queued_states() == {}
    assert cluster.fake.nodes_with({"rayfleet-cluster": cluster.cluster_id}) == []
    assert not (cluster.home / "state" / f"{NAME}.json").exists()
    cluster.offline.google.machines.wait_idle()
    for host in cluster.offline.bed.hosts:
        left = host.run(f"{LIVE_PROCESSES} | grep -E '[r]aylet|[g]cs_server|[j]oiner' || true")
        assert left.stdout.strip() == "", f"still running on {host.name}: {left.stdout}"
