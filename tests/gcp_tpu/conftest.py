"""Fixtures for the gcp-tpu provider: the fake Google APIs, a dummy key file, a fake `ray` CLI, a
real sshd on loopback standing in for the head, and a stand-in dashboard behind it.

Nothing here reaches Google: the provider is handed the fake's loopback URL (anonymous
credentials), its `ray` runner is `FakeRay`, and the head's "external IP" is 127.0.0.1.
"""

from __future__ import annotations

import functools
import json
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.node import rayproc
from infra.node.gcp_tpu.api import ApiOptions
from tests.gcp_tpu import fake_gcp
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.offline_bed import Offline, add_next_zone, offline_bed
from tests.gcp_tpu.tracked import TrackedCluster, bring_up, tear_down
from tests.testbed.preflight import require
from tests.waiting import wait_until

PROJECT = "test-project"
ZONE = "us-central2-b"


@pytest.fixture(autouse=True)
def _no_google(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No gcloud config of this machine, no real key, no endpoint but the ones tests set."""
    gcloud = tmp_path / "gcloud-config"
    gcloud.mkdir()
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(gcloud))
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
    monkeypatch.delenv("RAYFLEET_GCP_API_ENDPOINT", raising=False)


@pytest.fixture(autouse=True)
def _google_contract() -> Iterator[None]:
    """Fail the test whose requests (or whose fake's answers) Google's discovery documents reject
    (tests/gcp_tpu/discovery.py), naming the field and the rule; fakes stopped since are forgotten."""
    yield
    found = list(dict.fromkeys(v for fake in fake_gcp.LIVE for v in fake.take_violations()))
    fake_gcp.LIVE[:] = [f for f in fake_gcp.LIVE if not f.stopped]
    if found:
        pytest.fail("Google API contract violated: " + " | ".join(found), pytrace=False)


@pytest.fixture(scope="package")
def offline(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Offline]:
    """The offline Google on the test bed (tests/gcp_tpu/offline_bed.py), one for every test of this
    folder that needs it (end to end, autodown, sweep): starting it costs a test bed of four
    hosts (autodown's cluster moves zones: a head and a worker VM of the refused zone are still
    powering off while the next zone's head, VM and TPU node take theirs). Each test uses its own
    cluster name and leaves nothing of it behind."""
    require("testbed")
    with offline_bed(tmp_path_factory.mktemp("gcp-offline-"), hosts=4) as bed:
        add_next_zone(bed.fake)
        yield bed


@pytest.fixture(scope="package")
def tracked_cluster(offline: Offline,
                    tmp_path_factory: pytest.TempPathFactory) -> Iterator[TrackedCluster]:
    """The MLflow-tracked cluster test_e2e_cluster.py and test_e2e_privilege.py share
    (tests/gcp_tpu/tracked.py): up at its first use; torn down, and checked to leave nothing, when
    test_e2e_privilege.py ends, else here."""
    cluster = bring_up(offline, tmp_path_factory.mktemp("gcp-tracked-"))
    try:
        yield cluster
    finally:
        tear_down(cluster)


@pytest.fixture
def fake() -> Iterator[FakeGcp]:
    server = FakeGcp(PROJECT).start()
    yield server
    server.stop()


@pytest.fixture
def options(fake: FakeGcp) -> ApiOptions:
    return ApiOptions(endpoint=fake.url, poll_interval=0.02, retry_base=0.01, retries=3,
                      timeout=10)


@functools.lru_cache(maxsize=1)
def _rsa_pem() -> str:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    # 1024 bits: google-auth checks no size, and every load of a 2048-bit key (each client the
    # tests build) costs ~50 ms of CPU in cryptography's key check, ~7 ms at 1024.
    key = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def write_service_account_key(path: Path) -> Path:
    """A syntactically real service-account key (made here) for a project that does not exist."""
    pem = _rsa_pem()
    path.write_text(json.dumps({
        "type": "service_account", "project_id": PROJECT, "private_key_id": "0" * 40,
        "private_key": pem, "client_email": f"tester@{PROJECT}.iam.gserviceaccount.com",
        "client_id": "1", "token_uri": "https://oauth2.googleapis.com/token",
    }))
    path.chmod(0o600)
    return path


@pytest.fixture
def key_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Application-default credentials: a dummy key named by GOOGLE_APPLICATION_CREDENTIALS."""
    path = write_service_account_key(tmp_path / "sa-key.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    return path


BASE_SPEC: dict[str, Any] = {
    "provider": "gcp-tpu",
    "project": PROJECT,
    "zone": ZONE,
    "ssh_user": "root",
    "head": {"machine_type": "n2-standard-4"},
    "cpu_workers": {"cpu": {"machine_type": "n2-standard-8", "max_workers": 2}},
    "tpu_workers": {"tpu": {"accelerator_type": "v4-8", "min_workers": 1, "max_workers": 2,
                            "provisioning": "spot"}},
}


def write_spec(folder: Path, name: str = "tpucls", **changes: Any) -> Path:
    """A spec file from BASE_SPEC; keyword values replace top-level keys (None removes one).

    `autodown: null` and `metrics: none` unless given: these tests' "head" is an sshd on this
    machine, where no autodown watcher or Prometheus may be installed."""
    data = {**BASE_SPEC, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    if "autodown" not in changes:
        data["autodown"] = None
    # Nor a Prometheus (`metrics: none` unless given): that head serves no SFTP to put it there.
    if "metrics" not in changes:
        data["metrics"] = "none"
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


class Sshd:
    """A real OpenSSH server on 127.0.0.1 playing the head node: keys added to `authorized_keys`
    are what Google's guest agent would install from the `ssh-keys` metadata."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port = rayproc.free_port()
        self.authorized_keys = folder / "authorized_keys"
        self.authorized_keys.write_text("")
        host_key = folder / "host_ed25519"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)],
                       check=True)
        config = folder / "sshd_config"
        config.write_text("\n".join([
            f"Port {self.port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}",
            f"PidFile {folder / 'sshd.pid'}", f"AuthorizedKeysFile {self.authorized_keys}",
            "StrictModes no", "UsePAM no", "PasswordAuthentication no",
            "KbdInteractiveAuthentication no", "PermitRootLogin prohibit-password",
            "AllowTcpForwarding yes", "LogLevel ERROR", ""]))
        Path("/run/sshd").mkdir(exist_ok=True)
        self.log = folder / "sshd.log"
        self.process = subprocess.Popen(
            [shutil.which("sshd") or "/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL, stderr=self.log.open("w"))

        def answers() -> bool:
            assert self.process.poll() is None, self.log.read_text()
            return rayproc.port_answers("127.0.0.1", self.port)

        wait_until(answers, "sshd to start", timeout=10, interval=0.05)

    def authorize(self, public_key: str) -> None:
        with self.authorized_keys.open("a") as handle:
            handle.write(public_key.strip() + "\n")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=10)


@pytest.fixture
def sshd(real_daemon: None, tmp_path: Path) -> Iterator[Sshd]:
    server = Sshd(tmp_path / "sshd")
    yield server
    server.stop()


class Dashboard:
    """What the head's dashboard answers on 127.0.0.1 (the far end of the SSH tunnel)."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.hits.append(self.path)
                data = b"[]"
                self.send_response(200 if self.path.startswith("/api/jobs") else 404)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def dashboard() -> Iterator[Dashboard]:
    server = Dashboard()
    yield server
    server.stop()


class FakeRay:
    """Stands in for Ray's CLI, acting on the fake APIs the way `ray up`/`ray down` act on GCP.

    `up` creates the head (labels from the config, as Ray's GCP provider merges them) and the
    min_workers of every type, and installs the config's SSH key on the sshd; `down` deletes the
    head only, like a `ray down` that misses autoscaler-launched workers.

    In a zone the fake lists in `stockout_zones`, `up` fails the way Ray reports Google's refusal
    (the insert operation's ZONE_RESOURCE_POOL_EXHAUSTED error, exit 1). It leaves the refused head
    behind TERMINATED, which Ray's `down` does not delete (it only stops RUNNING heads here), so
    only the provider's label sweep of that zone can make it go: tests see whether it ran.
    """

    def __init__(self, fake: FakeGcp, sshd: Sshd | None = None) -> None:
        self.fake = fake
        self.sshd = sshd
        self.calls: list[dict[str, Any]] = []
        #: Each start of the head's autoscaler after `ray up` (Provider's `head_monitor`): whether
        #: it replaced the running one. Recorded, not run: the stand-in head is this machine.
        self.monitors: list[bool] = []
        #: Text `ray up` prints before exiting 1 (None: succeed).
        self.up_failure: str | None = None
        #: Runs during `up` after nodes exist (e.g. to inject a later failure).
        self.during_up: Callable[[], None] | None = None

    def start_monitor(self, target: Any, replace: bool) -> None:
        self.monitors.append(replace)

    def __call__(self, args: list[str], env: dict[str, str], log: Path,
                 progress: Callable[[str], None]) -> int:
        config_path = Path(args[-1])
        text = config_path.read_text()
        self.calls.append({"args": list(args), "env": dict(env), "config": text})
        log.parent.mkdir(parents=True, exist_ok=True)
        config = yaml.safe_load(text)
        verb = args[1]
        if verb == "up":
            return self._up(config, log, progress)
        if verb == "down":
            name = config["cluster_name"]
            zone = config["provider"]["availability_zone"]
            with self.fake.lock:
                for (z, instance_name), instance in list(self.fake.instances.items()):
                    if z == zone and instance["labels"].get("ray-node-type") == "head" and \
                            instance["labels"].get("ray-cluster-name") == name and \
                            instance["status"] != "TERMINATED":
                        del self.fake.instances[(z, instance_name)]
            log.write_text("Destroying cluster. Confirm [y/N]: y [automatic, due to --yes]\n"
                           "Requested 1 nodes to shut down.\n")
            return 0
        raise AssertionError(f"unexpected ray command {args}")

    def _up(self, config: dict[str, Any], log: Path, progress: Callable[[str], None]) -> int:
        progress("Cluster: fake")
        name = config["cluster_name"]
        zone = config["provider"]["availability_zone"]
        types = config["available_node_types"]
        head = types[config["head_node_type"]]["node_config"]
        ray_labels = {"ray-cluster-name": name}
        if zone in self.fake.stockout_zones:
            self.fake.add_instance(zone, f"ray-{name}-head-0a1b2c3d-compute",
                                   {**head.get("labels", {}), **ray_labels, "ray-node-type": "head",
                                    "ray-user-node-type": "head"}, status="TERMINATED")
            log.write_text(
                f"Cluster: {name}\nAcquiring an up-to-date head node\n"
                "Exception: {'errors': [{'code': 'ZONE_RESOURCE_POOL_EXHAUSTED', 'message': "
                f"\"The zone 'projects/{self.fake.project}/zones/{zone}' does not have enough "
                "resources available to fulfill the request.  Try a different zone, or try again "
                "later.\"}]}\n")
            return 1
        if not self.fake.nodes_with({**ray_labels, "ray-node-type": "head"}):
            self.fake.add_instance(zone, f"ray-{name}-head-0a1b2c3d-compute",
                                   {**head.get("labels", {}), **ray_labels, "ray-node-type": "head",
                                    "ray-user-node-type": "head"}, internal_ip="10.128.0.2")
        if self.up_failure is not None:  # like a real `ray up`, it fails after the head exists
            log.write_text(f"Cluster: {name}\n{self.up_failure}\n")
            return 1
        for type_name, node_type in types.items():
            if type_name == config["head_node_type"]:
                continue
            node_config = node_type["node_config"]
            for index in range(node_type.get("min_workers", 0)):
                labels = {**node_config.get("labels", {}), **ray_labels,
                          "ray-node-type": "worker", "ray-user-node-type": type_name}
                if "machineType" in node_config:
                    self.fake.add_instance(zone, f"ray-{name}-worker-{index:08x}-compute", labels,
                                           internal_ip=f"10.128.0.{10 + index}")
                else:
                    self.fake.add_tpu_node(zone, f"ray-{name}-worker-{index:08x}-tpu",
                                           node_config.get("acceleratorType", "v4-8"), labels)
        if self.sshd is not None:
            user_and_key = head["metadata"]["items"][0]["value"]
            self.sshd.authorize(user_and_key.split(":", 1)[1])
        if self.during_up is not None:
            self.during_up()
        log.write_text(f"Cluster: {name}\nRay runtime started.\n")
        return 0


def assert_nothing_created(home: Path, name: str) -> None:
    """No resource recorded and no key made for cluster `name`. Core's `up` records the Ray token's
    path before the provider runs, so a state holding only that (no resources), and the token
    file itself, may remain after a refused `up`; nothing billable or reachable does."""
    path = home / "state" / f"{name}.json"
    if path.exists():
        assert json.loads(path.read_text()).get("resources") == [], path.read_text()
    keys = home / "keys" / name
    if keys.exists():
        assert sorted(p.name for p in keys.iterdir()) in ([], ["ray-token"]), list(keys.iterdir())

