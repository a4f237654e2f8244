"""The offline-Google test bed shared by the GCP e2e tests and bench/gcp_autoscale.py: three
test-bed hosts, the fake Google in the client namespace, and `invoke` run inside that namespace."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tests.conftest import ROOT
from tests.gcp_tpu.fake_gcp import FakeGcp
from tests.gcp_tpu.offline import GOOGLE_NAMES, BedMachines, OfflineGoogle, TestCa
from tests.testbed import Testbed

PROJECT = "test-project"
ZONE = "us-central2-b"
#: The zone a spec's `zones:` moves on to when ZONE has no capacity.
NEXT_ZONE = "us-central2-a"
CLUSTER = "gcpe2e"
#: Ray's documented knobs, in every test-bed host's environment (so in the head's autoscaler).
RAY_FAST = {"AUTOSCALER_UPDATE_INTERVAL_S": "1", "AUTOSCALER_HEARTBEAT_TIMEOUT_S": "10",
            "RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES": "100000000"}
IDLE_TIMEOUT_MINUTES = 0.2
#: The run's CA on every host, in the host's own /etc, as an image's trust store would hold it:
#: the nodes' users other than root (Ray's autoscaler runs as rayfleet-scaler) cannot read this
#: machine's pytest folders (0700).
NODE_CA = "/etc/ssl/certs/rayfleet-offline-google-ca.pem"


@dataclass
class Offline:
    bed: Testbed
    google: OfflineGoogle
    fake: FakeGcp
    work: Path
    timings: dict[str, float] = field(default_factory=dict)

    def env(self, home: Path) -> dict[str, str]:
        """The client's environment: no proxy, no gcloud config, no Google credential of this
        machine; the run's CA for httplib2 only."""
        drop = ("PROXY", "GOOGLE_", "CLOUDSDK_", "RAYFLEET_GCP")
        env = {k: v for k, v in os.environ.items() if not any(d in k.upper() for d in drop)}
        gcloud = self.work / "gcloud-config"
        gcloud.mkdir(exist_ok=True)
        env.update(self.google.ca.env(), RAYFLEET_HOME=str(home), CLOUDSDK_CONFIG=str(gcloud),
                   RAY_USAGE_STATS_ENABLED="0", PYTHONUNBUFFERED="1")
        env.pop("GCE_METADATA_IP", None)  # the client is no VM: it has no metadata server
        env.pop("GCE_METADATA_HOST", None)
        return env

    def argv(self, *args: str) -> list[str]:
        return [*self.bed.client.enter_argv(cwd=str(ROOT)), sys.executable, "-m", "invoke", *args]

    def invoke(self, home: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(self.argv(*args), env=self.env(home), capture_output=True, text=True,
                              timeout=timeout, check=False)


def spec_file(folder: Path, key: Path, name: str = CLUSTER, **changes: Any) -> Path:
    spec = {
        "provider": "gcp-tpu", "project": PROJECT, "zone": ZONE, "credentials_file": str(key),
        "ssh_user": "root", "labels": {"course": "offline-test"},
        "idle_timeout_minutes": IDLE_TIMEOUT_MINUTES,
        "head": {"machine_type": "n2-standard-4"},
        "cpu_workers": {"cpu": {"machine_type": "n2-standard-8", "cpus": 1, "max_workers": 1,
                                "provisioning": "spot"}},
        "tpu_workers": {"tpu": {"accelerator_type": "v4-8", "min_workers": 0, "max_workers": 1,
                                "cpus": 1, "provisioning": "spot"}},
        # The test bed has the CPU env's packages and no network; JAX on chips is not tested.
        "node_env": {"backend": "venv", "tpu_env": "cpu"},
        "ready_timeout_s": 120,
        # No Prometheus on the head: no test here reads a GCP head's metrics (the head's
        # Prometheus is core's, infra/core/metrics/remote.py, which the Lambda bed's autoscale
        # module reads), and it scraped Ray for every cluster's whole life.
        "metrics": "none",
        **changes,
    }
    spec = {k: v for k, v in spec.items() if v is not None}  # None removes a key (zone -> zones)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def add_next_zone(fake: FakeGcp) -> None:
    """NEXT_ZONE at the fake: ZONE's region, TPU types and runtime versions."""
    fake.zones[NEXT_ZONE] = fake.zones[ZONE]
    fake.accelerator_types[NEXT_ZONE] = list(fake.accelerator_types[ZONE])
    fake.runtime_versions[NEXT_ZONE] = list(fake.runtime_versions[ZONE])


@contextlib.contextmanager
def offline_bed(work: Path, hosts: int = 3) -> Iterator[Offline]:
    """Test bed + offline Google; asserts that every Google name resolves to the fake first."""
    started = time.monotonic()
    ca = TestCa(work / "ca")
    # Three machines by default: the head, a TPU host, and a second one for the node replacing a
    # preempted one.
    bed = Testbed(hosts, work / "bed", env={**ca.env(), "HTTPLIB2_CA_CERTS": NODE_CA, **RAY_FAST})
    for host in bed.hosts:
        host.run(f"install -m 0644 /dev/stdin {NODE_CA}", input=ca.ca_path.read_text(), check=True)
    # Operations finish on the first poll (Ray sleeps 5 s after every unfinished one), and by
    # themselves a moment later: a head deleting its own VM never polls its operation.
    # Pages of 2 wherever a caller asks for a page size (ours: every list runs its paging);
    # Google's documented default of 500 where it does not (Ray's first-page-only reads).
    fake = FakeGcp(PROJECT, op_polls=1, page_size=2, op_seconds=2.0, default_page_size=500)
    google = OfflineGoogle(bed, ca, fake, BedMachines(bed, list(bed.hosts)))
    try:
        google.start()
        # Never where real DNS answers: every Google name must be the fake, in the client
        # namespace (where `ray up` runs) and on a host (where the autoscaler runs).
        for node in (bed.client, bed.hosts[0]):
            resolved = google.resolves_here(node.enter_argv())
            assert resolved == {n: bed.client.ip for n in GOOGLE_NAMES}, resolved
        yield Offline(bed, google, fake, work, {"test bed + offline Google": round(
            time.monotonic() - started, 1)})
    finally:
        google.stop()
        bed.close()
