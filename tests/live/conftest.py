"""The live suite's switches, refusals, cost cap and clean-up (see docs/live.md).

Never part of the default run (pyproject's `norecursedirs` skips this folder); run explicitly:

    python -m pytest tests/live --live=lambda --live-credentials=~/lambda.key --max-usd=5
    python -m pytest tests/live --live=lambda --live-fake --max-usd=5       # CI: the fakes

Without the provider, credentials (real accounts) or the cap it refuses in one line, exit 4,
before anything exists; under CI=true it runs only against the fakes. Every cluster gets a
name unique to the run and the run its own owner mark; whatever happens (a failure, Ctrl+C, the
--max-hours watchdog), the session's finalizer tears down every cluster that still has state,
then `invoke sweep --delete` removes anything else carrying this run's mark, and the money (or
node-hours) spent is printed.
"""

from __future__ import annotations

import _thread
import contextlib
import json
import os
import re
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.live.backends import Backend, Refused, backend_class
from tests.live.budget import Budget, CapExceeded

PROVIDERS = ("lambda", "gcp-tpu", "slurm")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("live", "the live suite (tests/live, docs/live.md)")
    group.addoption("--live", choices=PROVIDERS, default=None,
                    help="Run tests/live against this provider (a real account unless --live-fake).")
    group.addoption("--live-fake", action="store_true", default=False,
                    help="Run tests/live against the provider's fake and test bed (what CI does).")
    group.addoption("--live-credentials", default=None, metavar="FILE",
                    help="lambda: a file with the API key; gcp-tpu: your gcp-tpu spec (project, zone, "
                         "credentials_file); slurm: your Slurm spec (its submit: section).")
    group.addoption("--max-usd", type=float, default=None,
                    help="Cost cap in dollars (lambda, gcp-tpu): refuse any `up` whose worst case "
                         "exceeds it.")
    group.addoption("--max-node-hours", type=float, default=None,
                    help="Cap in node-hours (slurm, which bills your allocation, not money).")
    group.addoption("--max-hours", type=float, default=1.0,
                    help="The run's time limit (default 1): worst cases assume a cluster lives this "
                         "long; past it the run is interrupted and cleans up.")


def refusal(config: pytest.Config) -> str | None:
    """Why the run must not start, in one line; None when it may."""
    provider = config.getoption("live")
    fake = config.getoption("live_fake")
    if not provider:
        return ("tests/live runs only when asked: add --live=lambda|gcp-tpu|slurm with --live-credentials "
                "FILE and a cost cap (--max-usd / --max-node-hours), or --live-fake (docs/live.md)")
    if (config.getoption("numprocesses", None) or 0) != 0:
        # The steps build on each other (up, submit, autodown, teardown, sweep) in one session.
        return "the live suite runs in one process: add -n 0"
    if os.environ.get("CI") == "true" and not fake:
        return "CI=true: the live suite runs only against the fakes here; add --live-fake"
    credentials = config.getoption("live_credentials")
    if not fake and not credentials:
        return (f"--live={provider}: no credentials; add --live-credentials FILE "
                f"({'the API key file' if provider == 'lambda' else f'your {provider} spec'})")
    if not fake and not Path(credentials).expanduser().is_file():
        return f"--live-credentials={credentials}: no such file"
    cap_option = "max_node_hours" if backend_class(provider).unit == "node-hours" else "max_usd"
    cap = config.getoption(cap_option)
    if cap is None:
        return (f"--live={provider}: no cost cap; add --{cap_option.replace('_', '-')}=N "
                "(the run refuses any `up` whose worst case exceeds it)")
    if cap <= 0 or config.getoption("max_hours") <= 0:
        return "--max-usd, --max-node-hours and --max-hours must be > 0"
    return None


def pytest_configure(config: pytest.Config) -> None:
    try:
        why = refusal(config)
    except Refused as exc:
        why = str(exc)
    if why:
        raise pytest.UsageError(f"refusing to start: {why}")


@dataclass
class Cluster:
    name: str
    spec: Path
    run: Run

    def invoke(self, verb: str, *args: str, timeout: float = 900) -> Any:
        return self.run.backend.invoke(verb, "--cluster", str(self.spec), *args, timeout=timeout)

    def state_file(self) -> Path:
        return self.run.backend.home / "state" / f"{self.name}.json"

    def cluster_id(self) -> str | None:
        try:
            return str(json.loads(self.state_file().read_text())["cluster_id"]) or None
        except (OSError, ValueError, KeyError):
            return None

    def plan(self) -> dict[str, Any]:
        done = self.invoke("plan", "--json", timeout=300)
        assert done.returncode == 0, f"plan failed: {done.stdout}\n{done.stderr}"
        return dict(json.loads(done.stdout))

    def up(self) -> Any:
        """`invoke up`, once the provider's own estimate of its worst case fits the cap."""
        plan = self.plan()
        try:
            self.run.budget.reserve(self.name, plan)
        except CapExceeded as exc:
            pytest.exit(f"refusing to start: {exc}", returncode=3)
        self.run.budget.started(self.name, plan)
        done = self.invoke("up")
        log = re.search(r"full log: (\S+)", done.stderr)
        if done.returncode != 0 and log and Path(log.group(1)).is_file():
            # The run's home is a temporary directory: keep the tail of the log in the report.
            tail = Path(log.group(1)).read_text(errors="replace").splitlines()[-40:]
            done.stderr += "\n--- tail of " + log.group(1) + "\n" + "\n".join(tail)
        if self.cluster_id():
            self.run.ids.add(str(self.cluster_id()))
        return done

    def status(self) -> dict[str, Any]:
        done = self.invoke("status", "--json", timeout=300)
        assert done.stdout.strip(), done.stderr
        report = dict(json.loads(done.stdout))
        self.run.budget.observed(self.name, report)
        return report

    def teardown(self) -> Any:
        done = self.invoke("teardown")
        if done.returncode == 0:
            self.run.budget.ended(self.name)
        return done


@dataclass
class Run:
    backend: Backend
    budget: Budget
    token: str = field(default_factory=lambda: secrets.token_hex(3))
    clusters: list[Cluster] = field(default_factory=list)
    #: The fixed ("f") and autoscaling ("a") specs of this run.
    specs: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Every cluster id this run drew (read from state after each `up`).
    ids: set[str] = field(default_factory=set)
    #: Seconds per phase, printed at the end (what each step costs in CI's time budget).
    timings: dict[str, float] = field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, phase: str) -> Iterator[None]:
        started = time.monotonic()
        try:
            yield
        finally:
            self.timings[phase] = round(time.monotonic() - started, 1)

    def cluster(self, kind: str, spec: dict[str, Any]) -> Cluster:
        """A cluster named uniquely for this run (`lv<token><kind>`), registered for clean-up
        before anything of it exists."""
        name = f"lv{self.token}{kind}"
        path = self.backend.specs / f"{name}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        cluster = Cluster(name, path, self)
        self.clusters.append(cluster)
        self.backend.prepare(name)
        return cluster

    def clean_up(self) -> list[str]:
        """Tear down every cluster with state, then sweep this run's mark; what went wrong."""
        if not self.clusters:
            return []  # refused before the first cluster existed: nothing can have been made
        problems = []
        for cluster in self.clusters:
            if cluster.cluster_id():
                self.ids.add(str(cluster.cluster_id()))
            if cluster.state_file().exists():
                done = cluster.teardown()
                if done.returncode != 0:
                    problems.append(f"teardown {cluster.name}: {done.stderr.strip()[-300:]}")
            else:
                self.budget.ended(cluster.name)
        listed = self.backend.invoke("sweep", "--json", timeout=300)
        if listed.returncode == 0 and json.loads(listed.stdout)["resources"]:
            swept = self.backend.invoke("sweep", "--delete", "--yes", timeout=600)
            problems.append(f"swept leftovers: {swept.stdout.strip()} {swept.stderr.strip()}")
        left = self.backend.leftovers(self.ids)
        if left:
            problems.append(f"left on {self.backend.name}: {left}")
        return problems


@pytest.fixture(scope="session")
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    config = request.config
    provider = config.getoption("live")
    cls = backend_class(provider)
    credentials = config.getoption("live_credentials")
    backend = cls(request, tmp_path_factory.mktemp(f"live-{provider}"), config.getoption("live_fake"),
                  Path(credentials).expanduser() if credentials else None)
    cap = config.getoption("max_node_hours" if cls.unit == "node-hours" else "max_usd")
    run = Run(backend, Budget(cls.unit, float(cap), float(config.getoption("max_hours"))))
    # Past the time limit, interrupt the run as Ctrl+C would: the finalizer below cleans up.
    watchdog = threading.Timer(run.budget.hours * 3600, _thread.interrupt_main)
    watchdog.daemon = True
    watchdog.start()
    try:
        try:
            with run.timed(f"starting {'the fake' if backend.fake else 'the account'}"):
                backend.start()
        except Refused as exc:
            pytest.exit(f"refusing to start: {exc}", returncode=3)
        # The whole run's worst case, before the first `up`: a cap too low for the second cluster
        # must not let the first one be created.
        run.specs = {"f": backend.fixed_spec(), "a": backend.autoscale_spec()}
        for kind, spec in run.specs.items():  # (plans are cheap: no `timed`)
            name = f"lv{run.token}{kind}"
            path = backend.specs / f"{name}.yaml"
            path.write_text(yaml.safe_dump(spec, sort_keys=False))
            try:
                run.budget.reserve(name, Cluster(name, path, run).plan())
            except CapExceeded as exc:
                pytest.exit(f"refusing to start: {exc}", returncode=3)
        yield run
    finally:
        watchdog.cancel()
        try:
            with run.timed("clean-up"):
                problems = run.clean_up()
        finally:
            with run.timed("closing the backend"):
                backend.close()
            summary = (f"{run.budget.summary()}\nseconds: "
                       + ", ".join(f"{k} {v}" for k, v in run.timings.items()))
            # Past pytest's capture: an exit (the cap, Ctrl+C) skips the terminal summary.
            capture = config.pluginmanager.getplugin("capturemanager")
            with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
                print(f"\n{summary}", file=sys.stderr, flush=True)
        assert not problems, "; ".join(problems)
