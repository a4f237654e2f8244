"""The live suite on Google Cloud (gcp-tpu): a real project (your gcp-tpu spec names it, its zone
and its credentials) or the offline Google of tests/gcp_tpu (tests/gcp_tpu/offline_bed.py: the fake's VMs
are test-bed hosts, and `invoke` runs inside the test bed's client namespace, whose resolver sends
Google's names to the fake; never outside it)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.live.backends import Backend, your_spec

#: What the suite takes from your spec: where to create, with which credentials.
FROM_YOUR_SPEC = ("project", "zone", "zones", "credentials_file", "network", "ssh_user", "labels")
#: Ray needs two vCPUs on a node; the cheapest VM with them comes from rayfleet's price table.
MIN_VCPUS = 2


def cheapest_machine() -> str:
    """The cheapest machine type of at least MIN_VCPUS in rayfleet's GCP price table (the source
    of `invoke plan`'s estimate)."""
    from infra.providers.gcp_tpu import prices

    def vcpus(name: str) -> int:
        match = re.search(r"-(\d+)$", name)
        return int(match.group(1)) if match else 0

    return min((price, name) for name, price in prices.MACHINE_TYPES.items()
               if vcpus(name) >= MIN_VCPUS)[1]


class GcpBackend(Backend):
    name = "gcp-tpu"

    def start(self) -> None:
        # The head runs no task (CPU 0): one one-CPU bundle already needs a worker.
        self.scale_job_args = ("1",)
        if self.fake:
            from tests.gcp_tpu.offline import write_service_account_key
            from tests.gcp_tpu.offline_bed import PROJECT, offline_bed, spec_file
            from tests.testbed.preflight import require

            require("testbed")
            self.offline = self._stack.enter_context(offline_bed(self.work / "bed", hosts=3))
            key = write_service_account_key(self.work / "sa-key.json", self.offline.google.identity,
                                            f"live@{PROJECT}.iam.gserviceaccount.com")
            base = yaml.safe_load(spec_file(self.work, key, name="base").read_text())
            self.base: dict[str, Any] = {k: base[k] for k in (
                *FROM_YOUR_SPEC, "provider", "node_env", "ready_timeout_s") if k in base}
            self.full_env = {**self.offline.env(self.home), **self.env}
        else:
            assert self.credentials is not None
            self.base = your_spec(self.credentials, "gcp-tpu", FROM_YOUR_SPEC,
                                  "project:, zone:, credentials_file:")
            self.full_env = {}
        self.machine = cheapest_machine()
        self.base["head"] = {"machine_type": self.machine}

    def fixed_spec(self) -> dict[str, Any]:
        return {**self.base, "tpu_workers": {},
                "cpu_workers": {"cpu": {"machine_type": self.machine, "cpus": 1, "min_workers": 1,
                                        "max_workers": 1}},
                "idle_timeout_minutes": self.worker_idle_minutes,
                "autodown": {"idle_minutes": self.autodown_minutes}}

    def autoscale_spec(self) -> dict[str, Any]:
        return {**self.base, "tpu_workers": {},
                "cpu_workers": {"cpu": {"machine_type": self.machine, "cpus": 1, "min_workers": 0,
                                        "max_workers": 1, "provisioning": "spot"}},
                "idle_timeout_minutes": self.worker_idle_minutes,
                "autodown": {"idle_minutes": 30}}

    def prepare(self, name: str) -> None:
        if self.fake:
            # A VM deleted (autodown, teardown) frees its test-bed host only once it is wiped.
            self.offline.google.machines.wait_idle()

    # Against the offline Google everything runs in the client namespace (its resolver).

    def invoke(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        if not self.fake:
            return super().invoke(*args, timeout=timeout)
        return subprocess.run(self.offline.argv(*args), env=self.full_env, capture_output=True,
                              text=True, timeout=timeout, check=False)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        if not self.fake:
            return super().popen(*args)
        return subprocess.Popen(self.offline.argv(*args), env=self.full_env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def http_get(self, url: str, token: Path | None) -> tuple[int, str]:
        if not self.fake:
            return super().http_get(url, token)
        header = self.work / "auth-header"
        option = ""
        if token is not None:
            # The token travels in a 0600 file (curl -H @file), never on a command line.
            header.touch(mode=0o600)
            header.write_text(f"Authorization: Bearer {token.read_text().strip()}\n")
            option = f"-H @{header}"
        done = self.offline.bed.client_run(
            f"curl -s -w '\\n%{{http_code}}' {option} {url}", timeout=60)
        header.unlink(missing_ok=True)
        body, _, code = done.stdout.rpartition("\n")
        return int(code or 0), body
