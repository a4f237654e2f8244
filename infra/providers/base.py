"""The provider interface: the few verbs every target implements, and the types they return.

A provider turns a validated spec into a running Ray cluster and back into nothing. It receives the
cluster's `State` (already locked by the caller for `up` and `teardown`) and records every resource
it creates there *before* its next step, so any failure leaves a state that `teardown` can finish.
Providers return these dataclasses, never raw API payloads, and never import each other.
"""

from __future__ import annotations

import abc
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

from infra.spec import ClusterSpec
from infra.state import State


@dataclass(frozen=True)
class PlannedResource:
    """One thing `up` would create (or finds already there)."""

    #: Human kind, e.g. "Ray head (local processes)", "Lambda instance", "firewall rule".
    kind: str
    #: The name it will carry (our naming scheme makes ownership visible in every console).
    name: str
    #: Type, region, ports, price: whatever lets a user judge it before paying.
    detail: str = ""
    #: True when state shows it already exists; `up` will reuse it.
    exists: bool = False


@dataclass
class Plan:
    """What `up` would do, worked out without creating anything."""

    resources: list[PlannedResource] = field(default_factory=list)
    #: Rendered files by file name (a Ray cluster YAML, an sbatch script); validated already.
    files: dict[str, str] = field(default_factory=dict)
    #: Extra facts for the user: capacity now, price per hour, warnings.
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Endpoint:
    """How this machine reaches a running cluster (through a tunnel for remote clusters)."""

    #: Dashboard / job submission URL reachable from here, e.g. http://127.0.0.1:28265.
    dashboard_url: str
    #: The Ray address as nodes of the cluster see it (host:gcs_port), for `ray start --address`.
    address: str
    #: True when `dashboard_url` is the local end of a tunnel that lives as long as the block.
    tunneled: bool = False
    #: The cluster's Ray token file (0600) that every request presents; None when auth is off.
    token_path: Path | None = None


@dataclass
class ProviderStatus:
    """The provider's view of a cluster (instances, jobs), next to what Ray itself reports."""

    #: True when the provider believes the cluster is up and reachable.
    running: bool
    #: One line, e.g. "Slurm job 42 RUNNING on n[1-2], 0:05:12 of 1:00:00".
    summary: str
    #: Table rows of provider resources (each a column -> value mapping), in display order.
    rows: list[dict[str, str]] = field(default_factory=list)
    #: Things a user must act on: orphans, mismatches, cost alarms.
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UpOptions:
    """Options of `invoke up` that change how a provider behaves."""

    #: Keep the instances of a cluster that could not be completed instead of terminating them.
    keep_partial: bool = False


SpecT = TypeVar("SpecT", bound=ClusterSpec)


class Provider(abc.ABC, Generic[SpecT]):
    """One target (local machine, GCP TPU, Lambda, Slurm). Construct with a validated spec."""

    #: The value of `provider:` in specs.
    name: ClassVar[str]

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec

    @abc.abstractmethod
    def plan(self, state: State | None) -> Plan:
        """Render and validate everything `up` needs, query (read-only) what is there now.

        Must create nothing. May call read-only provider APIs (capacity, prices).
        """

    @abc.abstractmethod
    def up(self, state: State, plan: Plan, options: UpOptions) -> Endpoint:
        """Create what is missing and wait until Ray answers; return how to reach it.

        Idempotent: resources already in `state` and alive are reused, so a second `up` reports
        the running cluster. Each created resource is added to `state` before the next call.
        Records `address` and `dashboard_url` (as nodes see it) in `state.info`.
        """

    @abc.abstractmethod
    def status(self, state: State) -> ProviderStatus:
        """What the provider's own view says about the cluster; read-only."""

    @abc.abstractmethod
    def connect(self, state: State) -> AbstractContextManager[Endpoint]:
        """Make the dashboard reachable from this machine for the duration of the block.

        Remote providers open an SSH tunnel to a free local port; local returns its URL.
        Raises ClusterNotRunningError when there is nothing to connect to.
        """

    @abc.abstractmethod
    def teardown(self, state: State) -> None:
        """Remove every resource in `state`, verify with the provider that none is left, and
        remove each from `state` as it goes. Safe to run twice; touches nothing not ours."""

