"""What a job can reach on a gcp-tpu cluster (issue 29), end to end on the offline Google.

One cluster, one `up` (the package's MLflow-tracked cluster, which test_e2e_cluster.py's
lifecycle runs on too: tests/gcp_tpu/tracked.py), two scenarios that each run alone: the head's setup
makes its two users (Ray's, the autoscaler's) in the host's own /etc and /home, Ray runs as the
first and Ray's monitor, with Ray's unpatched
GCP provider, as the second, as do the idle watcher and its supervisor; the node's firewall lets
only root and the autoscaler's user reach the metadata server. A job on the head and its task on
an autoscaled TPU host ask the metadata server for the VM's token (with Google's header) and are
refused, cannot sudo and find no SSH key, while the separated autoscaler creates that TPU node
for them (its attributes handed to Ray; that it deletes an idle one is test_e2e_cluster.py's).
That probe job runs on test_e2e_cluster.py's scale-up's node when that test ran first (the package
runs it first: tests/gcp_tpu/tracked.py's `probe`), else here with a scale-up of its own.

The bed (test-bed hosts as VMs and TPU hosts, the fake Google in the client namespace) is the
package's `offline` fixture, shared with test_e2e_cluster.py and the others.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.gcp_tpu.offline_bed import CLUSTER, Offline
from tests.gcp_tpu.tracked import TrackedCluster, probe, tear_down
from tests.testbed.hosts import Host

NAME = CLUSTER  # the package's tracked cluster (tests/gcp_tpu/tracked.py)
RAY_USER, SCALER_USER = "rayfleet-ray", "rayfleet-scaler"
TOKEN_PATH = "/computeMetadata/v1/instance/service-accounts/default/token"


@dataclass
class Cluster:
    offline: Offline
    home: Path
    spec: Path
    head: Host
    timings: dict[str, float] = field(default_factory=dict)

    def invoke(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.offline.invoke(self.home, *args, "--cluster", str(self.spec), timeout=timeout)

    def tpu_nodes(self) -> list[dict[str, Any]]:
        with self.offline.fake.lock:
            return [dict(n) for n in self.offline.fake.tpu_nodes.values()
                    if n["labels"].get("rayfleet-name") == NAME]


@pytest.fixture(scope="module")
def cluster(tracked_cluster: TrackedCluster) -> Iterator[Cluster]:
    """The package's MLflow-tracked cluster (test_e2e_cluster.py's lifecycle ran on it before,
    when the whole package runs): its spec is this module's but for tracking and a CPU worker
    type no job here asks for. Its teardown, checked to leave nothing, ends this module."""
    offline = tracked_cluster.offline
    try:
        up = tracked_cluster.up
        assert up.returncode == 0, up.stdout + up.stderr
        with offline.fake.lock:
            head = next(i for i in offline.fake.instances.values()
                        if i["labels"].get("rayfleet-name") == NAME
                        and i["labels"].get("ray-node-type") == "head")
        ip = head["networkInterfaces"][0]["networkIP"]
        yield Cluster(offline, tracked_cluster.home, tracked_cluster.spec,
                      next(h for h in offline.bed.hosts if h.ip == ip),
                      dict(tracked_cluster.timings))
    finally:
        tear_down(tracked_cluster)


def _owners(host: Host, pattern: str) -> set[str]:
    """Users that run processes whose command line matches `pattern` (pgrep -f)."""
    out = host.run(f"pgrep -f {pattern!r} | xargs -r ps -o user:20= -p").stdout
    return set(out.split())


@pytest.mark.slow
def test_ray_and_its_autoscaler_run_as_two_users_and_only_one_reaches_the_token(
        cluster: Cluster) -> None:
    head = cluster.head
    assert _owners(head, "[r]aylet/raylet") == {RAY_USER}
    assert _owners(head, "[g]cs_server") == {RAY_USER}
    assert _owners(head, "[r]ay.autoscaler._private.monitor") == {SCALER_USER}
    # The idle watcher (it deletes the cluster with the VM's service account) and its
    # supervisor run as the autoscaler's user too, and `status` reads its marker as that user.
    assert _owners(head, "[i]nfra.node.autodown --config") == {SCALER_USER}
    assert _owners(head, "[i]nfra.node.supervise run .*autodown.json.pid") == {SCALER_USER}
    status = cluster.invoke("status")
    assert status.returncode == 0 and "autodown: " in status.stdout, status.stdout + status.stderr
    assert "watcher not running" not in status.stdout, status.stdout
    assert "no report from the watcher" not in status.stdout, status.stdout
    assert head.run(f"id -Gn {RAY_USER}", check=True).stdout.split() == [RAY_USER]
    modes = head.run(f"stat -c '%U %a' /home/{RAY_USER} /home/{SCALER_USER} "
                     f"/home/{SCALER_USER}/ray_bootstrap_key.pem /root/ray_bootstrap_key.pem",
                     check=True).stdout.split("\n")
    assert [m for m in modes if m] == [f"{RAY_USER} 700", f"{SCALER_USER} 700",
                                       f"{SCALER_USER} 600", "root 600"], modes
    # The users are the node's own: this machine and the other hosts never saw them.
    here = subprocess.run(["getent", "passwd", RAY_USER, SCALER_USER], capture_output=True)
    assert here.returncode != 0 and not Path(f"/home/{RAY_USER}").exists()
    other = next(h for h in cluster.offline.bed.hosts if h is not head)
    assert other.run(f"getent passwd {SCALER_USER}").returncode != 0
    # The same request, on the same node, by each user: the server answers root and the
    # autoscaler's user; Ray's user, and an SSH user not going through sudo (`nobody` stands for
    # it: the bed's SSH user is root), never get a connection.
    ask = ("curl -s -o /dev/null -w '%{http_code}' -H 'Metadata-Flavor: Google' "
           f"http://metadata.google.internal{TOKEN_PATH}")
    answers = {user: head.run(f"runuser -u {user} -- {ask}" if user != "root" else ask).stdout
               for user in ("root", SCALER_USER, RAY_USER, "nobody")}
    assert answers == {"root": "200", SCALER_USER: "200", RAY_USER: "000", "nobody": "000"}, \
        answers
    # The guard names exactly root and the autoscaler's user (no SSH-user exception).
    table = head.run("nft list table inet rayfleet_guard", check=True).stdout
    allowed = {line.split("skuid != {", 1)[1].split("}", 1)[0].replace(" ", "")
               for line in table.splitlines() if "skuid != {" in line}
    scaler_uid = head.run(f"id -u {SCALER_USER}", check=True).stdout.strip()
    assert allowed == {f"0,{scaler_uid}"}, table
    # Google's metadata server answers at its IPv6 address too (no name resolves to it).
    v4 = [line for line in table.splitlines() if " ip daddr " in f" {line.strip()}"]
    assert v4 and all("169.254.169.254" in line for line in v4), table
    assert "ip6 daddr fd20:ce::254 " in table, table
    plan = cluster.invoke("plan")
    assert f"jobs run as {RAY_USER} (no sudo)" in plan.stdout, plan.stdout
    assert "the metadata server" in plan.stdout, plan.stdout


@pytest.mark.slow
def test_jobs_get_no_token_while_the_separated_autoscaler_scales_a_tpu_node(
        cluster: Cluster, tracked_cluster: TrackedCluster) -> None:
    google = cluster.offline.google
    run = tracked_cluster.probe  # run on test_e2e_cluster.py's scale-up's node, when it ran
    if run is None:
        assert cluster.tpu_nodes() == []
        # The offline Google serves the whole package's tests, and the bed hands a powered-off
        # host's address to the next machine: an earlier module's head (whose autoscaler asks for
        # the token, as it should) may have had the address this test's TPU host gets. Only what
        # was asked from now on is this TPU host's.
        run = probe(tracked_cluster, len(google.identity.metadata_requests))
    submit, seen_before = run.submit, run.seen_before
    assert submit.returncode == 0, submit.stdout + submit.stderr
    cluster.timings["job: TPU node created, joined, probed"] = run.seconds
    assert len(run.nodes) == 1 and run.tpu_host is not None, run.nodes
    node_name, tpu_host = run.nodes[0], run.tpu_host
    reports = json.loads(submit.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert [r["host"] for r in reports] == [tpu_host.hostname, cluster.head.hostname], reports
    for report in reports:
        where = report["host"]
        assert report["user"] == RAY_USER and report["uid"] != 0, where
        assert not set(report["groups"]) & {"sudo", "adm", "docker", "root", "wheel"}, where
        # No connection at all: not the token, not any other metadata.
        assert report["token"] == "ConnectionRefusedError", (where, report["token"])
        assert report["project"] == "ConnectionRefusedError", (where, report["project"])
        # sudo is there (as on Google's images) and refuses: exit 1, not "command not found".
        assert report["sudo"] == 1, (where, report["sudo"])
        assert report["private_keys"] == [], (where, report["private_keys"])
    head_keys = reports[1]["keys"]
    assert set(head_keys.values()) == {"PermissionError"}, head_keys
    # Ray still knows its TPU host: the attributes setup read as root, as Ray's own variables.
    tpu_env = reports[0]["tpu_env"]
    assert tpu_env["TPU_NAME"] == node_name and tpu_env["TPU_ACCELERATOR_TYPE"] == "v4-8", tpu_env
    assert tpu_env["TPU_WORKER_ID"] == "0", tpu_env
    # Nothing of the job's ever reached the metadata server from the TPU host (the guard
    # refuses the connection), while setup's root read the attributes there.
    from_tpu = [path for ip, path in google.identity.metadata_requests[seen_before:]
                if ip == tpu_host.ip]
    assert any("/attributes/accelerator-type" in p for p in from_tpu), from_tpu
    assert not [p for p in from_tpu if "/token" in p or "project-id" in p], from_tpu
    # That the same separated autoscaler deletes the node once idle (its monitor's log, as its
    # user, says so) is test_e2e_cluster.py::test_ray_autoscales_tpu_nodes_against_offline_google's
    # to prove: waiting for it here too cost an idle period; the teardown deletes this node.
    print(f"\n[gcp privilege] phases (s): {cluster.timings}", flush=True)
