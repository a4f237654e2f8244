"""The MLflow-tracked cluster `gcpe2e` on the offline Google, shared by test_e2e_cluster.py's
lifecycle and test_e2e_privilege.py's scenarios (the package fixture `tracked_cluster`): one `up`
and one teardown for both (each was ~70 s of `up` and ~30 s of teardown in CI).

Its teardown checks that nothing of it is left (at the fake, in /tmp, running on any host). It
runs when test_e2e_privilege.py's module ends (after test_e2e_cluster.py's, before the modules
whose own clusters or sweeps must not meet it), or at the package's end when that module did not
run (a test picked alone with -k).

The privilege probe job (`probe`) needs an autoscaled TPU node: test_e2e_cluster.py's lifecycle
submits it while its own scale-up's replacement node is there (the probe's task queues behind the
lifecycle's on that node) and records the run here (`TrackedCluster.probe`), which
test_e2e_privilege.py then checks; alone, that test runs the probe with a scale-up of its own.
A node boot, setup and join less per run.
"""

from __future__ import annotations

import glob
import json
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.gcp_tpu.offline import write_service_account_key
from tests.gcp_tpu.offline_bed import CLUSTER, PROJECT, Offline, spec_file
from tests.testbed.hosts import LIVE_PROCESSES, Host

PROBE = Path(__file__).resolve().parents[1] / "data" / "gcp_privilege_probe.py"


@dataclass
class ProbeRun:
    """The privilege probe job (tests/data/gcp_privilege_probe.py) as it ran on the cluster."""
    submit: subprocess.CompletedProcess[str]
    #: How many metadata-server requests the offline Google had logged before the TPU node the
    #: probe ran on was created (only later ones can be that node's).
    seen_before: int
    #: The cluster's TPU nodes (short names) when the job had run, and the first one's host.
    nodes: list[str]
    tpu_host: Host | None
    seconds: float


@dataclass
class TrackedCluster:
    offline: Offline
    home: Path
    spec: Path
    #: What `invoke up` returned (test_e2e_cluster.py checks its output).
    up: subprocess.CompletedProcess[str]
    timings: dict[str, float] = field(default_factory=dict)
    #: The privilege probe's run, once test_e2e_cluster.py's scale-up ran it.
    probe: ProbeRun | None = None

    def invoke(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return self.offline.invoke(self.home, *args, "--cluster", str(self.spec), timeout=timeout)

    def is_up(self) -> bool:
        return (self.home / "state" / f"{CLUSTER}.json").exists()

    def cluster_id(self) -> str:
        return str(json.loads((self.home / "state" / f"{CLUSTER}.json").read_text())["cluster_id"])


#: The tracked clusters this process brought up (a module needing every host ends them first).
LIVE: list[TrackedCluster] = []


def tpu_node_names(offline: Offline) -> list[str]:
    """The tracked cluster's TPU nodes at the fake (short names)."""
    with offline.fake.lock:
        return [str(n["name"]).rsplit("/", 1)[-1] for n in offline.fake.tpu_nodes.values()
                if n["labels"].get("rayfleet-name") == CLUSTER]


def probe(cluster: TrackedCluster, seen_before: int) -> ProbeRun:
    """Submit the privilege probe and wait for it; what ran where, read once it is done (its
    TPU node is idle from then on, deleted only an idle period later)."""
    started = time.monotonic()
    submit = cluster.invoke("submit", str(PROBE), timeout=600)
    nodes = tpu_node_names(cluster.offline)
    hosts = cluster.offline.google.machines.host_of(nodes[0]) if nodes else []
    return ProbeRun(submit, seen_before, nodes, hosts[0] if hosts else None,
                    round(time.monotonic() - started, 1))


def bring_up(offline: Offline, work: Path) -> TrackedCluster:
    key = write_service_account_key(work / "sa-key.json", offline.google.identity,
                                    f"student@{PROJECT}.iam.gserviceaccount.com")
    # With the cluster's MLflow tracking server on the head (infra/core/tracking/remote.py).
    spec = spec_file(work, key, tracking="mlflow")
    home = work / "rayfleet-home"
    started = time.monotonic()
    up = offline.invoke(home, "up", "--provider", "gcp-tpu", "--cluster", str(spec), timeout=600)
    cluster = TrackedCluster(offline, home, spec, up, {"up": round(time.monotonic() - started, 1)})
    LIVE.append(cluster)
    return cluster


def tear_down(cluster: TrackedCluster) -> None:
    """`invoke teardown` of a cluster still up, and nothing of it left anywhere."""
    if not cluster.is_up():
        return
    cluster_id = cluster.cluster_id()
    started = time.monotonic()
    down = cluster.invoke("teardown", "--provider", "gcp-tpu", timeout=600)
    cluster.timings["teardown"] = round(time.monotonic() - started, 1)
    print(f"[gcp e2e] tracked cluster's phases (s): {cluster.timings}", flush=True)
    assert down.returncode == 0, down.stdout + down.stderr
    teardown_left_nothing(cluster.offline, cluster.home, down.stdout, cluster_id)


def ray_config_caches() -> list[str]:
    """Ray's /tmp/ray-config-<hash> files that belong to this cluster."""
    mine = []
    for path in glob.glob("/tmp/ray-config-*"):
        try:
            with open(path) as handle:
                cached = json.load(handle)
        except (OSError, ValueError):
            continue
        config = cached.get("config", cached)
        if config.get("cluster_name") == CLUSTER and config.get("provider", {}).get(
                "project_id") == PROJECT:
            mine.append(path)
    return mine


def teardown_left_nothing(offline: Offline, home: Path, said: str, cluster_id: str) -> None:
    bed, fake, google = offline.bed, offline.fake, offline.google
    # The tracking store was copied here before anything was deleted.
    assert f"tracking data copied to {home / 'tracking' / CLUSTER}" in said, said
    assert (home / "tracking" / CLUSTER / "mlflow.db").stat().st_size > 0
    assert fake.nodes_with({"rayfleet-cluster": cluster_id}) == []
    assert fake.nodes_with({"ray-cluster-name": CLUSTER}) == []
    assert not [n for n in fake.firewalls if CLUSTER in n]
    assert ray_config_caches() == []
    google.machines.wait_idle()
    for host in bed.hosts:
        left = host.run(f"{LIVE_PROCESSES} | grep -E '[r]aylet|[g]cs_server|[r]ay::|[m]onitor.py' "
                        "|| true").stdout.strip()
        assert left == "", f"Ray still running on {host.name}: {left}"
    client_left = bed.client.run("ps -eo args | grep -E '[r]ay |[s]sh |[i]nvoke' || true")
    assert client_left.stdout.strip() == "", client_left.stdout
