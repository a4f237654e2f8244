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
    #: The MLflow tracking server reachable from here (`tracking: mlflow`), else None.
    tracking_url: str | None = None
    #: Its password file (0600; the user is `infra.tracking.USERNAME`).
    tracking_password: Path | None = None
    #: Ray Serve's HTTP endpoint reachable from here; None where the provider does not offer one.
    serve_url: str | None = None
    #: (host, port) Serve's proxy binds to on the head (`http_options` of every deploy).
    serve_bind: tuple[str, int] | None = None


@dataclass(frozen=True)
class Cost:
    """What a cluster costs right now, as the provider knows it. Unknown figures are None."""

    #: Nodes that count now (instances, VMs, TPU hosts, Slurm nodes), head included.
    nodes: int
    #: Dollars per hour now; None where the provider bills no money (Slurm) or knows no price.
    hourly_usd: float | None = None
    #: Seconds since the cluster's oldest running node started.
    uptime_s: float | None = None
    #: Dollars spent so far by the nodes running now (each node's price times its uptime).
    accrued_usd: float | None = None
    #: Node-hours used so far, for providers that account in time rather than money (Slurm).
    node_hours: float | None = None
    #: Where the prices come from, e.g. "Lambda /instance-types" or "estimate: rayfleet's GCP
    #: price table of 2026-11-01"; shown next to every figure.
    source: str = ""


@dataclass(frozen=True)
class CostRange:
    """What an autoscaling cluster costs per hour at its smallest and at its largest."""

    min_nodes: int
    max_nodes: int
    #: $/h at min and at max size; None when there is no price (Slurm) or it is unknown.
    min_hourly_usd: float | None = None
    max_hourly_usd: float | None = None
    #: As `Cost.source`.
    source: str = ""
    #: True when the provider bills node-hours, not money (Slurm): the range is shown in
    #: node-hours per hour, one per node.
    node_hours: bool = False


@dataclass(frozen=True)
class AutodownView:
    """The cluster's own idle watcher as this machine sees it (see infra/autodown.py)."""

    #: The spec's setting: the cluster removes itself after this many idle minutes.
    idle_minutes: float
    #: How long Ray has been idle now, by the watcher's last report; None when busy or unknown.
    idle_s: float | None = None
    #: When the cluster removed itself (ISO 8601, UTC), from the marker it left; None if it has not.
    removed_at: str | None = None
    #: One line on what the watcher saw or did last (e.g. "2 jobs running"), for `status`.
    detail: str = ""
    #: The watcher's last check (ISO 8601) when that is too long ago for a watcher that still runs
    #: (it died, or its head is unreachable): its countdown is then no longer true.
    silent_since: str | None = None


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
    #: A word or two for `invoke list`'s state column ("running", "PENDING", "3/3 active");
    #: empty means "running" or "not running" by `running`.
    state: str = ""
    #: What it costs now; None when the provider knows nothing about cost.
    cost: Cost | None = None
    #: The idle watcher's countdown or the marker of a self-removal; None without autodown.
    autodown: AutodownView | None = None

    @property
    def state_label(self) -> str:
        return self.state or ("running" if self.running else "not running")


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

    #: How long `invoke list` waits for this provider's `status` before it reports the provider
    #: unreachable (the call keeps running in a daemon thread and is abandoned).
    status_timeout_s: ClassVar[float] = 20.0
    #: True when `up` starts the head-side idle watcher (infra/autodown.py) for `autodown:` specs.
    supports_autodown: ClassVar[bool] = False
    #: True when `up` starts an MLflow tracking server (infra/tracking.py) for `tracking: mlflow`
    #: and its endpoints carry `tracking_url`.
    supports_tracking: ClassVar[bool] = False

    def cost_range(self, state: State | None) -> CostRange | None:
        """$/h at the spec's minimum and maximum size, for `plan` and `up`; read-only.

        None (the default) when the provider knows nothing about cost. May call read-only price
        APIs (Lambda's /instance-types).
        """
        return None

    def autodown_report(self, state: State) -> AutodownView | None:
        """The idle watcher's last report: its countdown, or the marker of a self-removal.

        Default: the marker this machine holds for the cluster (`infra.autodown.marker_path`, which
        a local watcher writes and remote providers refresh from the head in `status`); None when
        the spec has no autodown and no marker exists. Read-only and cheap: `up` and `teardown`
        call it to say "removed itself after N idle minutes at HH:MM".
        """
        from infra import autodown

        marker = autodown.read_marker(autodown.marker_path(state.cluster))
        if marker is None and (self.spec.autodown is None or not self.supports_autodown):
            return None
        if marker is not None and marker.get("cluster_id") not in (None, state.cluster_id):
            marker = None  # another cluster of the same name, from before
        minutes = self.spec.autodown.idle_minutes if self.spec.autodown else 0.0
        if marker is None and not minutes:
            return None
        view: AutodownView = autodown.view(marker, minutes)
        return view

    @abc.abstractmethod
    def teardown(self, state: State) -> None:
        """Remove every resource in `state`, verify with the provider that none is left, and
        remove each from `state` as it goes. Safe to run twice; touches nothing not ours."""



@dataclass(frozen=True)
class Marked:
    """A resource in a provider account that carries a rayfleet cluster id (found by `sweep`)."""

    #: The provider's registry name ("lambda", "gcp-tpu").
    provider: str
    #: Human kind, e.g. "Lambda instance", "Compute VM", "TPU node".
    kind: str
    #: The provider's identifier, which `Sweeper.delete` takes back.
    id: str
    name: str
    #: The value of its `identity.TAG_CLUSTER` tag/label.
    cluster_id: str
    #: The value of its `identity.TAG_OWNER` tag/label ("" when it has none).
    owner: str
    #: The value of its `identity.TAG_NAME` tag/label, when present.
    cluster_name: str = ""
    status: str = ""
    #: Region or zone.
    where: str = ""
    #: What it bills per hour now; None when unknown.
    hourly_usd: float | None = None
    #: Anything `delete` needs besides the id (zone, project), never secrets.
    attrs: dict[str, str] = field(default_factory=dict, compare=False, hash=False)


class Sweeper(abc.ABC):
    """A provider's side of `invoke sweep`: find resources carrying a rayfleet cluster id in the
    account this machine has credentials for, and remove chosen ones.

    Lives in `<provider package>/sweep.py` as `Sweeper` (found by `infra.providers.sweeper`);
    providers without one are simply not swept. Constructed without a spec: credentials come from
    the environment and the specs/state files this checkout has.
    """

    #: The provider's registry name.
    provider: ClassVar[str]
    #: How long `sweep` waits for `marked` before reporting the provider unreachable.
    timeout_s: ClassVar[float] = 30.0

    @abc.abstractmethod
    def credentials(self) -> str | None:
        """Where this machine's credentials for the provider come from (for messages), or None
        when it has none (the provider is then skipped, without any request)."""

    @abc.abstractmethod
    def marked(self) -> list[Marked]:
        """Every live resource carrying a valid cluster id tag, whoever's. Never resources without
        it: those are not rayfleet's to list. Read-only."""

    @abc.abstractmethod
    def delete(self, items: list[Marked]) -> None:
        """Remove exactly `items` (each from `marked`) and wait until the provider reports them
        gone; raise a RayfleetError naming what is left if that does not happen."""
