"""The live suite on Slurm: a real login host (your spec's `submit:` section) or the 2-node Slurm
cluster of the test bed (the `slurm_cluster` fixture, reached through its login host over SSH as
tests/slurm does). Slurm bills node-hours of an allocation, not money: the cap is in node-hours."""

from __future__ import annotations

import os
from typing import Any

import yaml

from tests.live.backends import Backend, your_spec

#: What the suite takes from your spec: how to reach Slurm and where Ray comes from.
FROM_YOUR_SPEC = ("submit", "environment", "partition", "account", "qos", "constraint")


class SlurmBackend(Backend):
    name = "slurm"
    unit = "node-hours"

    def start(self) -> None:
        if self.fake:
            from tests.slurm.conftest import login_spec
            from tests.testbed.hosts import ray_bin_dir

            slurm = self.request.getfixturevalue("slurm_cluster")
            self.base: dict[str, Any] = yaml.safe_load(
                login_spec(self.work, slurm, "bed").read_text())
            # Jobs inherit the submitter's PATH: the tests' Ray first (as tests/slurm does).
            self.env["PATH"] = f"{ray_bin_dir()}:{os.environ.get('PATH', '')}"
            # One head per host: the worker then needs the other host, as on a real cluster.
            self.exclusive = True
        else:
            assert self.credentials is not None
            self.base = {**your_spec(self.credentials, "slurm", FROM_YOUR_SPEC,
                                     "with its submit: section"),
                         "cpus_per_node": 1, "object_store_memory_mb": 100}
            self.exclusive = False
        # The smallest thing Slurm runs: one CPU per node, a short time limit.
        self.base.update({"time_limit": "0:30:00"})

    def fixed_spec(self) -> dict[str, Any]:
        return {**self.base, "nodes": self.fixed_nodes,
                "autodown": {"idle_minutes": self.autodown_minutes}}

    def autoscale_spec(self) -> dict[str, Any]:
        environment = dict(self.base.get("environment") or {})
        environment["env_vars"] = {**(environment.get("env_vars") or {}),
                                   "AUTOSCALER_UPDATE_INTERVAL_S": "1"}
        return {**self.base, "exclusive": self.exclusive, "environment": environment,
                "idle_timeout_minutes": self.worker_idle_minutes,
                "worker_types": {"cpu": {"cpus_per_node": 1, "max_workers": 1}}}

    def leftovers(self, cluster_ids: set[str]) -> list[str]:
        """Jobs in the queue carrying one of the run's cluster ids (Slurm has no `sweep`)."""
        from infra.cli import loading
        from infra.providers.slurm import remote

        path = self.work / "leftovers.yaml"
        path.write_text(yaml.safe_dump({**self.base, "nodes": 1}))
        submit = loading.load_spec(path).submit  # type: ignore[attr-defined]
        with remote.opened(submit) as runner:
            rows = runner.check("squeue -h -o '%i|%T|%k'").splitlines()
        return [row for row in rows if any(f"rayfleet-cluster={cid}" in row for cid in cluster_ids)]
