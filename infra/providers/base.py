"""The provider interface: the few verbs every target implements, and the types they return.

A provider turns a validated spec into a running Ray cluster and back into nothing. It receives the
cluster's `State` (already locked by the caller for `up` and `teardown`) and records every resource
it creates there *before* its next step, so any failure leaves a state that `teardown` can finish.
Providers return these dataclasses, never raw API payloads, and never import each other.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import ClassVar, Generic, TypeVar, final

from infra.core.autodown import view as autodown_view
from infra.core.autodown.view import AutodownView
from infra.core.capabilities import Capabilities
from infra.core.costs import Cost, CostRange
from infra.core.endpoint import Endpoint
from infra.core.errors import RayfleetError, UsageError
from infra.core.head import HeadAccess
from infra.core.progress import Progress, ignore, warn
from infra.core.spec import ClusterSpec
from infra.core.state import Attrs, Resource, State
from infra.providers import features
from infra.providers.features import HeadServices


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


ExtraT = TypeVar("ExtraT")


@dataclass(frozen=True, kw_only=True)
class Plan(Generic[ExtraT]):
    """What `up` would do, worked out without creating anything, and everything `up` needs to do
    it: `up` and `cost_range` read this hand-off, never what a provider remembers of an earlier
    call. Frozen, its sequences tuples and its files a read-only mapping: nobody changes a plan.
    """

    resources: Sequence[PlannedResource] = ()
    #: Rendered files by file name (a Ray cluster YAML, an sbatch script); validated already.
    files: Mapping[str, str] = field(default_factory=dict)
    #: Extra facts for the user: capacity now, price per hour, warnings.
    notes: Sequence[str] = ()
    #: Pre-flight checks that failed (no credentials, an API off): `up` would fail on them, so
    #: `plan` shows them and exits non-zero. Each is one line naming the fix.
    problems: Sequence[str] = ()
    #: The provider's own findings that `up` acts on (a pre-flight report and zone order, a
    #: capacity snapshot); each provider defines its frozen type, None when it needs none.
    extra: ExtraT

    def __post_init__(self) -> None:
        object.__setattr__(self, "resources", tuple(self.resources))
        object.__setattr__(self, "files", MappingProxyType(dict(self.files)))
        object.__setattr__(self, "notes", tuple(self.notes))


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
class Readiness:
    """One thing a provider needs on this machine (credentials, an API, Slurm's commands), as
    `invoke check` reports it."""

    #: What is checked, e.g. "API key", "Compute Engine API", "Slurm commands".
    what: str
    ok: bool
    #: What was found ("LAMBDA_API_KEY", "slurm 23.11.4") or what went wrong.
    detail: str
    #: One line that fixes it; empty when `ok`.
    fix: str = ""

    @classmethod
    def failed(cls, what: str, error: Exception | str, default_fix: str) -> Readiness:
        """A failed check from a one-line error "what is wrong; how to fix it" (our errors'
        shape): the part after the first "; " is the fix, else `default_fix`."""
        detail, _, fix = str(error).partition("; ")
        return cls(what, False, detail, fix or default_fix)


@dataclass(frozen=True)
class UpOptions:
    """Options of `invoke up` that change how a provider behaves."""

    #: Keep what a failed `up` created (in state, for `invoke teardown`) instead of removing it.
    keep_partial: bool = False
    #: Where the base's `up` reports its steps (the head's services, a rollback's warnings): the
    #: library's callback (infra/core/progress.py); by default nowhere.
    progress: Progress = ignore


SpecT = TypeVar("SpecT", bound=ClusterSpec)


def _label(resource: Resource[Attrs]) -> str:
    return resource.attrs.name or resource.id


class Provider(abc.ABC, Generic[SpecT, ExtraT]):
    """One target (local machine, GCP TPU, Lambda, Slurm). Construct with a validated spec,
    which no verb changes; `ExtraT` is the type of the provider's `Plan.extra`."""

    #: The value of `provider:` in specs.
    name: ClassVar[str]
    #: One line for `plan` and `status`: what a job on this provider's clusters can reach (its
    #: user, the credentials it cannot read); empty where the provider has not said.
    job_reach: ClassVar[str] = ""

    def __init__(self, spec: SpecT) -> None:
        self.spec = spec

    @abc.abstractmethod
    def plan(self, state: State | None) -> Plan[ExtraT]:
        """Render and validate everything `up` needs, query (read-only) what is there now.

        Must create nothing. May call read-only provider APIs (capacity, prices). Returns all
        `up` and `cost_range` need as data; keeps nothing of it on the provider.
        """

    @final
    def up(self, state: State, plan: Plan[ExtraT], options: UpOptions | None = None) -> Endpoint:
        """`create`, then the head's services (tracking, metrics, the autodown watcher:
        infra/providers/features.py, from the provider's `head_services`), under the one rollback
        policy for a failed `up` (Ctrl+C included):

        - what existed before this run is never removed (`created` says what the run made);
        - with `--keep-partial` everything stays in state for `invoke teardown`;
        - otherwise what the run created is removed (`remove_created`); if that fails too, it
          stays in state and the warning names `invoke teardown`.
        The failure itself is re-raised either way.
        """
        options = options or UpOptions()
        before = frozenset((r.kind, r.id) for r in state.resources())
        try:
            endpoint = self.create(state, plan)
            features.start(self, state, options.progress)
            return endpoint
        except BaseException as exc:
            self._roll_back(state, before, options, exc)
            raise

    @abc.abstractmethod
    def create(self, state: State, plan: Plan[ExtraT]) -> Endpoint:
        """Create what is missing and wait until Ray answers; return how to reach it.

        Reads `plan` (never changes it) and the spec; `up` wraps it in the rollback policy.
        Idempotent: resources already in `state` and alive are reused, so a second `up` reports
        the running cluster. Each created resource is added to `state` before the next call.
        Records `address` and `dashboard_url` (as nodes see it) in `state.info`.
        """

    def created(self, state: State, before: frozenset[tuple[str, str]]) -> list[Resource[Attrs]]:
        """What this run of `up` created and a rollback removes, in removal order. `before` holds
        (kind, id) of every resource in state when the run began.

        Default: every resource in state now that was not there before. Providers leave out what
        they adopted rather than created, and free things the next `up` reuses.
        """
        return [r for r in state.resources() if (r.kind, r.id) not in before]

    def remove_created(self, state: State, created: list[Resource[Attrs]]) -> None:
        """Remove exactly `created` (from `created`) and forget each in state; raise a
        RayfleetError naming what is left when that cannot be done.

        Default: a run that created everything in state is torn down whole; anything else is a
        provider's to remove piece by piece.
        """
        mine = {(r.kind, r.id) for r in created}
        if all((r.kind, r.id) in mine for r in state.resources()):
            self.teardown(state)
            return
        raise RayfleetError(f"{self.name} cannot remove {', '.join(map(_label, created))} alone")

    def _roll_back(self, state: State, before: frozenset[tuple[str, str]], options: UpOptions,
                   exc: BaseException) -> None:
        created = self.created(state, before)
        if not created:
            return
        names = ", ".join(_label(r) for r in created)
        if options.keep_partial:
            warn(options.progress, f"kept {names} (--keep-partial): `invoke teardown` removes them")
            return
        if isinstance(exc, KeyboardInterrupt):
            warn(options.progress, f"interrupted; removing what this run created: {names} "
                 "(--keep-partial keeps them)")
        else:
            why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
            warn(options.progress, f"the cluster could not be completed ({why}); terminating what "
                 f"this run created: {names} (--keep-partial keeps them)")
        try:
            self.remove_created(state, created)
        except (RayfleetError, KeyboardInterrupt) as cleanup:
            warn(options.progress, f"could not remove all of {names} ({cleanup}); what is left is "
                 "in state: `invoke teardown` removes it")

    @abc.abstractmethod
    def status(self, state: State) -> ProviderStatus:
        """What the provider's own view says about the cluster; read-only."""

    def connect(self, state: State) -> AbstractContextManager[Endpoint]:
        """Make the dashboard reachable from this machine for the duration of the block.

        Default: through the head (`head_access`), one SSH login's tunnels to the dashboard,
        Serve and, where the cluster has them, the tracking server and Prometheus; local returns
        its URL. Raises ClusterNotRunningError when there is nothing to connect to.
        """
        from infra.core import auth
        from infra.core.tracking import remote as tracking_remote

        head = self.head_access(state)
        return tracking_remote.connect(state, head, head.dashboard_port or 0,
                                       str(state.info.address or ""), auth.token_file(state))

    def head_access(self, state: State) -> HeadAccess:
        """The cluster's head (infra/core/head.py: `LocalHead`, `SshHead` or `SharedFsHead`), through
        which sharing, `invoke ssh|exec|sync|env` and the rest run commands, put and read files,
        tunnel and supervise daemons there, with the same key, proxy and host-key rules as the
        provider's own SSH; read-only.

        Raises ClusterNotRunningError when there is no head to reach.
        """
        from infra.core.errors import ProviderError

        raise ProviderError(f"the {self.name} provider gives no access to its head")

    #: True where `teardown` then `up` restarts Ray and nothing else (the cluster is Ray's
    #: processes on this machine: no machine is lost or billed), so `restart_ray` does that;
    #: elsewhere a new token takes a new cluster.
    restarts_by_recreating: ClassVar[bool] = False

    @final
    def restart_ray(self, state: State, progress: Progress) -> Endpoint:
        """Ray started again on the cluster, every node reading the cluster's token file anew
        (`rotate-token` has just replaced it). Every running job, actor and Serve app ends."""
        if not self.restarts_by_recreating:
            raise UsageError(f"rotate-token: not available on the {self.name} provider yet; "
                             f"`invoke teardown` then `invoke up` give the cluster a new token")
        self.teardown(state)
        return self.up(state, self.plan(state), UpOptions(progress=progress))

    def readiness(self) -> list[Readiness]:
        """Whether this machine can use the provider with this spec: credentials found, APIs
        answering, Slurm reachable. Read-only (at most a listing call per API); never raises for
        a missing piece, which is a `Readiness` with its fix."""
        return []

    #: How long `invoke list` waits for this provider's `status` before it reports the provider
    #: unreachable (the call keeps running in a daemon thread and is abandoned).
    status_timeout_s: ClassVar[float] = 20.0

    @property
    @final
    def capabilities(self) -> Capabilities:
        """What this provider does: its spec class's table (infra/core/capabilities.py)."""
        return type(self.spec).CAPABILITIES

    def cost_range(self, plan: Plan[ExtraT] | None) -> CostRange | None:
        """$/h at the spec's minimum and maximum size, for `plan` and `up`, and of each node
        type (`node_prices`, for the sharing gateway's cost share); read-only, no request.

        From the spec and what `plan` found (e.g. Lambda's prices in `plan.extra`); None (the
        default) when the provider knows nothing about cost, or needs a plan and got none.
        """
        return None

    # --- small questions: the base starts, reads and decides the head's services ---------------

    def head_services(self, state: State) -> HeadServices | None:
        """The head's services as this provider has them (infra/providers/features.py): which
        head, the tracking server's address and store, the autodown watcher and what removes the
        cluster, or where the watcher's marker is read. None (the default): none at all.
        Read-only; no request beyond reading what state records."""
        return None

    def listed(self, state: State) -> bool | None:
        """Whether the provider still lists anything of the cluster (None: it cannot say). Asked
        only when the answer can change the autodown report."""
        return None

    @abc.abstractmethod
    def teardown(self, state: State) -> None:
        """Remove every resource in `state`, verify with the provider that none is left, and
        remove each from `state` as it goes. Safe to run twice; touches nothing not ours."""


def with_autodown(status: ProviderStatus, report: AutodownView | None,
                  gone: str) -> ProviderStatus:
    """`status` with the watcher's report (features.autodown_report); when the cluster removed
    itself, `status` says so (`gone`: what the provider saw, e.g. "no job of the cluster is in
    the queue")."""
    if report is None or not report.removed_at:
        return dataclasses.replace(status, autodown=report)
    return dataclasses.replace(
        status, running=False, state="removed itself", autodown=report,
        summary=f"{gone}: it {autodown_view.describe(report)}; `invoke teardown` verifies and "
                "clears its state")


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

    Lives in `<provider package>/sweep.py` as `Sweeper` (named in the registry's table);
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
