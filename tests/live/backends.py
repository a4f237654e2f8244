"""What differs between targets of the live suite: how to reach the account (real or fake), the
cheapest specs for a fixed and an autoscaling cluster, and how to look for leftovers.

The scenarios in test_live.py use only `invoke` (through `Backend.invoke`) and what it prints;
a backend never reaches into a provider's internals. A fake backend builds on the public test
beds of tests/lambda_cloud, tests/slurm and tests/gcp_tpu, so the same scenarios run in CI.
"""

from __future__ import annotations

import abc
import contextlib
import os
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from tests.conftest import ROOT, run_invoke


class Refused(Exception):
    """The run cannot start as asked (no credentials, a broken credentials file): one line."""


class Backend(abc.ABC):
    """One target of the live suite. `start` before anything, `close` always."""

    #: --live=<name>: the provider's registry name.
    name: ClassVar[str]
    #: "usd", or "node-hours" where the provider bills an allocation (Slurm).
    unit: ClassVar[str] = "usd"
    #: Nodes of the fixed cluster (head included), as Ray must list them alive.
    fixed_nodes: ClassVar[int] = 2

    def __init__(self, request: pytest.FixtureRequest, work: Path, fake: bool,
                 credentials: Path | None) -> None:
        self.request = request
        self.work = work
        self.fake = fake
        self.credentials = credentials
        self.home = work / "rayfleet-home"
        #: The run's specs; `invoke sweep` looks where the specs in RAYFLEET_CLUSTERS point (GCP).
        self.specs = work / "clusters"
        self.specs.mkdir(exist_ok=True)
        #: One run = one owner mark: `invoke sweep` then lists only this run's leftovers.
        self.owner = f"rayfleet-live-{secrets.token_hex(6)}"
        self.env: dict[str, str] = {"RAYFLEET_HOME": str(self.home), "RAYFLEET_OWNER": self.owner,
                                    "RAYFLEET_CLUSTERS": str(self.specs), "COLUMNS": "200"}
        self._stack = contextlib.ExitStack()
        #: Arguments of tests/data/spread_job.py that need one worker more than the head has.
        self.scale_job_args: tuple[str, ...] = ("2",)
        # Short idle periods on the fakes; minutes on a real account (boots take minutes there).
        self.worker_idle_minutes = 0.1 if fake else 1.0
        self.autodown_minutes = 0.3 if fake else 2.0

    # --- life ---------------------------------------------------------------------------------

    @abc.abstractmethod
    def start(self) -> None:
        """Reach the account (a fake: build its world) and pick the cheapest kinds. Creates
        nothing billed."""

    def close(self) -> None:
        self._stack.close()

    # --- specs --------------------------------------------------------------------------------

    @abc.abstractmethod
    def fixed_spec(self) -> dict[str, Any]:
        """A fixed-size cluster of `fixed_nodes` nodes of the cheapest kind."""

    @abc.abstractmethod
    def autoscale_spec(self) -> dict[str, Any]:
        """An autoscaling cluster: the head only, 0..1 workers of the cheapest kind; a
        STRICT_SPREAD group of two one-CPU bundles needs that worker."""

    def prepare(self, name: str) -> None:
        """Anything the target needs before `up` of cluster `name` (a fake's hosts trust its key).
        Nothing by default."""
        return None

    # --- looking ------------------------------------------------------------------------------

    def invoke(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return run_invoke(*args, env=self.env, timeout=timeout)

    def popen(self, *args: str) -> subprocess.Popen[str]:
        """`invoke ARGS` left running (the dashboard's tunnel), in its own process group."""
        return subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=ROOT,
                                env={**os.environ, **self.env}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)

    def http_get(self, url: str, token: Path | None) -> tuple[int, str]:
        """GET `url` where `invoke` runs (with the cluster's token when given): status, body."""
        import requests

        headers = {"Authorization": f"Bearer {token.read_text().strip()}"} if token else {}
        got = requests.get(url, headers=headers, timeout=30)
        return got.status_code, got.text

    def leftovers(self, cluster_ids: set[str]) -> list[str]:
        """Billed things of these clusters that `invoke sweep` cannot see on this target."""
        return []

    def _with_home(self) -> contextlib.AbstractContextManager[None]:
        return _env(RAYFLEET_HOME=str(self.home))


@contextlib.contextmanager
def _env(**values: str) -> Any:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def your_spec(path: Path, provider: str, keys: tuple[str, ...], expected: str) -> dict[str, Any]:
    """`provider:` and the `keys` of your own spec (--live-credentials): how to reach your account;
    Refused in one line when it is not such a spec."""
    import yaml

    try:
        yours = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise Refused(f"--live-credentials={path}: not a readable spec ({exc})") from None
    if not isinstance(yours, dict) or yours.get("provider") != provider:
        raise Refused(f"--live-credentials={path}: expected your {provider} spec ({expected})")
    return {"provider": provider, **{k: yours[k] for k in keys if k in yours}}


def backend_class(name: str) -> type[Backend]:
    if name == "lambda":
        from tests.live.lambda_backend import LambdaBackend

        return LambdaBackend
    if name == "gcp-tpu":
        from tests.live.gcp_backend import GcpBackend

        return GcpBackend
    if name == "slurm":
        from tests.live.slurm_backend import SlurmBackend

        return SlurmBackend
    raise Refused(f"--live={name}: the live suite runs against lambda, gcp-tpu or slurm")
