"""The live suite on Lambda Cloud: a real account (an API key file) or the fake Lambda API whose
instances are test-bed hosts (tests/lambda_cloud/autoscale_bed.py, the bed of the Lambda e2e
tests)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tests.live.backends import Backend, Refused

#: Lambda applies no firewall ruleset here (its docs); rayfleet refuses it unless acknowledged.
OPEN_REGIONS = {"us-south-1"}
#: The fake's rate limits at 1/20 (as the autoscaling e2e tests): 0.6 s between launches.
FAKE_SCALE = 0.05
FAKE_CAPACITY = {("cpu_4x_general", "us-west-1"): 2, ("gpu_1x_a10", "us-west-1"): 2}


def read_key(path: Path) -> str:
    """The key in a file holding just the key, or `api_key = <key>` (lambda-cli's file)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise Refused(f"--live-credentials={path}: cannot read it ({exc.strerror})") from None
    for line in text.splitlines():
        match = re.match(r"\s*(?:api_key\s*=\s*)?['\"]?(secret_[A-Za-z0-9_]+)['\"]?\s*$", line)
        if match:
            return match.group(1)
    raise Refused(f"--live-credentials={path}: no Lambda API key in it (expected a line "
                  "`secret_...` or `api_key = secret_...`)")


class LambdaBackend(Backend):
    name = "lambda"

    def start(self) -> None:
        if self.fake:
            from tests.lambda_cloud.autoscale_bed import autoscale_bed
            from tests.testbed.preflight import require

            require("testbed")
            scaled = self._stack.enter_context(autoscale_bed(
                self.work / "bed", scale=FAKE_SCALE, boot_delay=1.0, hosts=2,
                capacity=dict(FAKE_CAPACITY)))
            self.bed = scaled.bed
            self.fake_api = scaled.fake
            self.env.update({k: v for k, v in scaled.env.items() if k != "RAYFLEET_HOME"})
            self.extra: dict[str, Any] = {
                "ssh_user": "root", "ssh_proxy_command": scaled.bed.proxy_command, "env": "none",
                "object_store_memory_mb": 100, "boot_timeout_s": 120, "ray_timeout_s": 300}
        else:
            assert self.credentials is not None
            self.env["LAMBDA_API_KEY"] = read_key(self.credentials)
            self.extra = {}
        self.choices = self._cheapest()

    def _client(self) -> Any:
        from infra.node.lambda_cloud import api

        limits = api.Limits.scaled(FAKE_SCALE) if self.fake else api.Limits()
        return api.LambdaClient(self.env["LAMBDA_API_KEY"],
                                api.base_url(self.env.get("LAMBDA_API_URL")), limits)

    def leftovers(self, cluster_ids: set[str]) -> list[str]:
        """`invoke sweep` lists instances; the SSH keys and firewall rulesets of the run's clusters
        (their names carry the cluster id) must be gone too."""
        client = self._client()
        found = [f"instance {i.name} ({i.status})" for i in client.instances()
                 if i.tags.get("rayfleet-cluster") in cluster_ids and i.status != "terminated"]
        found += [f"firewall ruleset {r.name}" for r in client.firewall_rulesets()
                  if any(cid in r.name for cid in cluster_ids)]
        found += [f"SSH key {k.name}" for k in client.ssh_keys()
                  if any(cid in k.name for cid in cluster_ids)]
        return found

    def _cheapest(self) -> list[dict[str, str]]:
        """Up to three (type, region) pairs with capacity now, cheapest first, from Lambda's own
        prices (/instance-types, as `invoke plan` reads them)."""
        offers = sorted(
            (t.price_cents_per_hour, t.name, region)
            for t in self._client().instance_types().values()
            for region in t.regions_with_capacity if region not in OPEN_REGIONS)
        if not offers:
            raise Refused("Lambda lists no instance type with capacity in a region with firewall "
                          "rulesets now; try again later")
        return [{"instance_type": name, "region": region} for _, name, region in offers[:3]]

    def _base(self) -> dict[str, Any]:
        return {"provider": "lambda", "head": {"choices": self.choices}, **self.extra}

    def fixed_spec(self) -> dict[str, Any]:
        return {**self._base(), "workers": {"count": self.fixed_nodes - 1, "choices": self.choices},
                "autodown": {"idle_minutes": self.autodown_minutes}}

    def autoscale_spec(self) -> dict[str, Any]:
        return {**self._base(),
                "worker_types": {"cpu": {"choices": self.choices, "min_workers": 0,
                                         "max_workers": 1}},
                "idle_timeout_minutes": self.worker_idle_minutes,
                # A safety net only: the scenario tears it down long before.
                "autodown": {"idle_minutes": 30}}

    def prepare(self, name: str) -> None:
        if self.fake:
            # The fake's instances "boot" with the cluster's key authorized, as Lambda's would.
            from infra.core import ssh

            with self._with_home():
                self.bed.authorize_key(ssh.ensure_keypair(name).public_key)
