"""Cluster specs: `clusters/<name>.yaml`, one per cluster, validated strictly.

The common part lives here; each provider declares its own strict section as a subclass of
`ClusterSpec` in its module. Any problem becomes one line naming the file, the field and the fix,
with a did-you-mean for typos (worded by infra/core/spec_errors.py), and exit code 2 (see
`SpecError`).
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import typing
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from infra.core import paths
from infra.core.capabilities import Capabilities
from infra.core.errors import SpecError, UsageError
from infra.core.spec_errors import describe_error, did_you_mean, misspelt_required

#: The provider of `invoke` without --provider/--cluster: a real Ray cluster on this machine, no account.
DEFAULT_PROVIDER = "local"

# Cluster names end up in hostnames, GCP labels, Slurm job names and Ray's temp dir, whose unix
# socket paths must stay under 107 bytes: lowercase, digits and dashes, at most 31 characters.
NAME_PATTERN = re.compile(r"^[a-z](?:[a-z0-9-]{0,29}[a-z0-9])?$")


class StrictModel(BaseModel):
    """Base of every spec section: unknown keys are errors, values are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class Autodown(StrictModel):
    """`autodown: {idle_minutes: N}`: the cluster removes itself, head included, after N minutes
    without any job, task, actor, driver or Ray Client session (see infra/node/autodown.py)."""

    #: Minutes of idleness after which the whole cluster goes away (fractions allowed, e.g. 0.5).
    idle_minutes: float = Field(gt=0, le=7 * 24 * 60)


class WorkerRange(StrictModel):
    """A kind of worker the autoscaler keeps between `min_workers` and `max_workers`; each
    provider's section declares the two with its own defaults and bounds."""

    if typing.TYPE_CHECKING:
        # Declared by each section, where they stand in its reference (docs/reference/spec.md).
        min_workers: int
        max_workers: int

    @model_validator(mode="after")
    def _min_not_above_max(self) -> typing.Self:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) is above max_workers "
                             f"({self.max_workers}); lower min_workers or raise max_workers")
        return self


def existing_file(value: str | None, fix: str) -> Path | None:
    """The file a spec names (`~` expanded), or one line saying it is not there and `fix`."""
    if value is None:
        return None
    path = Path(value).expanduser()
    if not path.is_file():
        raise ValueError(f"no such file {value!r}; {fix}")
    return path


def source_ranges(ranges: list[str], what: str, fix: str) -> list[str]:
    """`ranges` when each is a CIDR range with zero host bits and none is the whole internet
    (which would open `what` to anyone: `fix` says what to list instead)."""
    for text in ranges:
        try:
            network = ipaddress.ip_network(text, strict=True)
        except ValueError:
            raise ValueError(f"{text!r} is not a CIDR range like 203.0.113.0/24 (host bits "
                             "must be zero)") from None
        if network.prefixlen == 0:
            raise ValueError(f"{text!r} opens {what} to the whole internet; {fix}")
    return ranges


#: The most addresses a site's ranges cover, per IP version, before the spec must acknowledge them
#: (`sharing.allowed_source_ranges_ack_wide`): a /16 of IPv4 (a large campus), a /48 of IPv6 (one
#: site's prefix). Two /1s are not a site: they are the internet.
SITE_ADDRESSES = {4: 2 ** 16, 6: 2 ** 80}


def too_wide(ranges: list[str]) -> str | None:
    """What the union of `ranges` covers beyond SITE_ADDRESSES of either IP version, in words, or
    None (overlapping ranges count once)."""
    networks = [ipaddress.ip_network(r) for r in ranges]
    unions: dict[int, list[ipaddress.IPv4Network] | list[ipaddress.IPv6Network]] = {
        4: list(ipaddress.collapse_addresses(
            n for n in networks if isinstance(n, ipaddress.IPv4Network))),
        6: list(ipaddress.collapse_addresses(
            n for n in networks if isinstance(n, ipaddress.IPv6Network)))}
    for version, limit in SITE_ADDRESSES.items():
        total = sum(n.num_addresses for n in unions[version])
        if total > limit:
            site = "/16" if version == 4 else "/48"
            return (f"together cover {total:,} IPv{version} addresses, more than a site's {site} "
                    f"({limit:,})")
    return None


class Sharing(StrictModel):
    """`sharing:`: members with their own credentials reach the cluster through a TLS gateway on
    the head (infra/node/gateway.py); see docs/concepts/sharing.md."""

    #: The gateway's TLS port on the head.
    port: int = Field(8443, ge=1024, le=65535)
    #: Networks (CIDR) allowed to reach the gateway: a firewall rule for this port only. Required
    #: on providers whose head has a public address (`Capabilities.sharing_needs_ranges`).
    #: Together at most a /16 of IPv4 addresses and a /48 of IPv6 (a campus or a VPN) unless
    #: `allowed_source_ranges_ack_wide` says otherwise.
    allowed_source_ranges: list[str] = Field(default_factory=list, max_length=64)
    #: `true`: open the gateway's port to `allowed_source_ranges` even where together they cover
    #: more than a /16 of IPv4 or a /48 of IPv6 addresses (the whole internet stays refused).
    allowed_source_ranges_ack_wide: bool = False
    #: A member's next submit is refused while this many of their jobs are pending or running.
    max_running_jobs_per_member: int = Field(2, ge=1, le=1000)
    #: The head stops a member's job that has run longer than this (hours); None: no limit.
    max_job_hours: float | None = Field(None, gt=0, le=24 * 31)
    #: Members may open the dashboard through the gateway (job views filtered to their own jobs).
    members_see_dashboard: bool = True
    #: A DNS name the owner controls, pointed at the head: the certificate names it and bundles
    #: use it, so a new head (after autodown: a new address) needs a new DNS record, not new
    #: bundles for every member. `up` prints the record to set.
    hostname: str | None = Field(None, max_length=253)
    #: The largest working-dir package (zip) one upload of a member may be, in MB.
    max_upload_mb: float = Field(100, gt=0, le=10 * 1024)
    #: What all of one member's uploads may add up to, in MB.
    max_member_upload_mb: float = Field(2048, gt=0, le=1024 * 1024)
    #: Connections one member may hold open to the gateway at once (each carries one request at a
    #: time; a log tail holds one while it runs); past it the gateway answers 429.
    max_member_connections: int = Field(16, ge=2, le=1000)
    #: Working-dir uploads one member may stream through the gateway at once; past it 429.
    max_member_uploads: int = Field(2, ge=1, le=100)
    #: Log tails (`ray job logs --follow`, the dashboard's log view) one member may hold open at
    #: once; past it 429.
    max_member_tails: int = Field(4, ge=1, le=100)
    #: Members' jobs may install packages (runtime_env `pip`, `uv`). A package installs by
    #: running its own code on the node, outside the job and beyond its stop: off unless the
    #: owner trusts every member with that.
    members_may_pip: bool = False
    #: Where rayfleet cannot create a separate Unix user for Ray (slurm, local), members' jobs
    #: run as the owner's own account: the owner says so here, knowingly.
    members_run_as_owner: bool = False
    #: The end of the term: no member's access lasts past it (a date is the end of that day,
    #: UTC; a datetime without an offset is UTC). Written into the registry at `up`,
    #: `member-add` and `member-update`.
    ends: dt.datetime | dt.date | None = None
    #: Job-hours each member may use; past it their next submit is refused (the gateway's).
    member_budget_hours: float | None = Field(None, gt=0, le=1_000_000)
    #: Dollars of the cluster's cost each member's jobs may take (the gateway's cost share).
    member_budget_usd: float | None = Field(None, gt=0, le=10_000_000)
    #: Dollars the whole cluster may cost (the gateway's estimate): `members` and `status` warn
    #: from 80 %; at 100 % the gateway stops every job and autodown (required) takes it down.
    budget_usd: float | None = Field(None, gt=0, le=10_000_000)
    #: `shared`: members' jobs run on the one cluster, behind the gateway's filter. `cluster`:
    #: each member gets a Ray cluster of their own, as a Unix user of its own, behind the same
    #: gateway (infra/node/member_clusters.py; where the provider's table allows it).
    isolation: Literal["shared", "cluster"] = "shared"
    #: With `isolation: cluster`: member clusters running at once; one more member waits.
    max_active_members: int = Field(8, ge=1, le=64)
    #: With `isolation: cluster`: a member's cluster stops after this many idle minutes (no job,
    #: actor or driver), its files kept; their next request starts it again.
    member_idle_minutes: float = Field(20, gt=0, le=7 * 24 * 60)

    @field_validator("ends", mode="before")
    @classmethod
    def _ends(cls, value: object) -> object:
        # YAML gives a date or a datetime unquoted; a quoted one arrives as text.
        if isinstance(value, str):
            try:
                return dt.datetime.fromisoformat(value) if "T" in value or " " in value.strip() \
                    else dt.date.fromisoformat(value)
            except ValueError:
                raise ValueError(f"{value!r} is not a date like 2026-12-18 or a datetime like "
                                 "2026-12-18T17:00:00+01:00") from None
        return value

    @field_validator("hostname")
    @classmethod
    def _hostname(cls, name: str | None) -> str | None:
        label = r"(?!-)[a-z0-9-]{1,63}(?<!-)"
        if name is not None and not re.fullmatch(rf"{label}(\.{label})+", name.lower()):
            raise ValueError(f"{name!r} is not a DNS name; give the full name you point at the "
                             "head, e.g. ray.class.example.edu")
        return name.lower() if name else None

    @field_validator("allowed_source_ranges")
    @classmethod
    def _cidrs(cls, ranges: list[str]) -> list[str]:
        return source_ranges(ranges, "the gateway", "list the class's VPN or campus range")

    def wide_ranges(self) -> str | None:
        """Why `allowed_source_ranges` is wider than a site (None: it is not, or the spec said
        `allowed_source_ranges_ack_wide`)."""
        if self.allowed_source_ranges_ack_wide:
            return None
        return too_wide(self.allowed_source_ranges)


class MetricsHistory(StrictModel):
    """`metrics_history:` how much the head's Prometheus keeps and how often it scrapes; both
    bounds hold, whichever is reached first drops the oldest data (infra/node/metrics.py)."""

    #: Days of history kept on the head.
    days: int = Field(30, ge=1, le=3650)
    #: Disk the history may take on the head, in MiB.
    size_mb: int = Field(1024, ge=64, le=1024 * 1024)
    #: Seconds between two scrapes of every node.
    scrape_interval_s: int = Field(10, ge=1, le=300)


class ClusterSpec(StrictModel):
    """What every cluster spec has. `name` is the file's stem, not a key in the file."""

    #: What the provider does: its one table (infra/core/capabilities.py); each provider's spec sets its
    #: own, and a new provider starts with nothing but the defaults.
    CAPABILITIES: ClassVar[Capabilities] = Capabilities()

    name: str
    provider: str
    #: Ray token authentication on every node and every client of ours. `none` leaves Ray's job API
    #: open to anyone who can reach it (a warning at every `up`): only for debugging.
    auth: Literal["token", "none"] = "token"
    #: Whole-cluster idle shutdown, enforced on the cluster itself; `autodown: null` turns off a
    #: provider's default (with a warning at every `up`).
    autodown: Autodown | None = None
    #: `mlflow`: `up` starts an MLflow tracking server beside the head (SQLite store, served
    #: artifacts, MLflow's basic auth) and every job on every node finds it through
    #: MLFLOW_TRACKING_URI; `none` starts nothing (see docs/train-track-serve.md).
    tracking: Literal["none", "mlflow"] = "none"
    #: Members with their own credentials, through a TLS gateway on the head; None: owner only.
    sharing: Sharing | None = None
    #: `prometheus`: a Prometheus on the head scrapes every node (Ray's own service discovery),
    #: Ray's dashboard reads it, `invoke top` and `invoke report` show it, and teardown keeps a
    #: copy of its history (docs/metrics.md); `none` starts nothing.
    metrics: Literal["prometheus", "none"] = "prometheus"
    metrics_history: MetricsHistory = MetricsHistory()
    #: The file the spec came from, for messages; set by the loader.
    source: str = ""

    @field_validator("sharing")
    @classmethod
    def _sharing_ranges(cls, value: Sharing | None) -> Sharing | None:
        if value is None or not cls.CAPABILITIES.sharing_needs_ranges:
            return value
        if not value.allowed_source_ranges:
            raise ValueError("allowed_source_ranges is required on this provider (the gateway's "
                             "port is opened to exactly these networks); add e.g. "
                             "`allowed_source_ranges: [198.51.100.0/24]` (your class's range) "
                             "under sharing:")
        wide = value.wide_ranges()
        if wide:
            # Only where the ranges open a firewall: elsewhere they are refused or unused.
            raise ValueError(f"allowed_source_ranges {wide}: list the class's campus or VPN "
                             "ranges, or add `allowed_source_ranges_ack_wide: true` under "
                             "sharing: to open the gateway's port that widely on purpose")
        return value

    @field_validator("sharing")
    @classmethod
    def _isolation_holds(cls, value: Sharing | None) -> Sharing | None:
        # From the provider's table (capabilities.py), never from its name.
        if value is None or value.isolation != "cluster" or cls.CAPABILITIES.member_clusters:
            return value
        provider = typing.get_args(cls.model_fields["provider"].annotation) or ("this",)
        why = cls.CAPABILITIES.member_clusters_refusal.format(provider=provider[0])
        raise ValueError(f"isolation: cluster: {why}; use `isolation: shared` or remove the key")

    @model_validator(mode="before")
    @classmethod
    def _default_autodown(cls, data: Any) -> Any:
        minutes = cls.CAPABILITIES.autodown_default_minutes
        if isinstance(data, dict) and "autodown" not in data and minutes:
            return {**data, "autodown": {"idle_minutes": minutes}}
        return data

    @model_validator(mode="before")
    @classmethod
    def _default_metrics(cls, data: Any) -> Any:
        if isinstance(data, dict) and "metrics" not in data:
            return {**data, "metrics": cls.CAPABILITIES.metrics_default}
        return data

    @field_validator("metrics_history")
    @classmethod
    def _history_needs_metrics(cls, value: MetricsHistory, info: ValidationInfo) -> MetricsHistory:
        # Runs only when the spec names metrics_history (defaults are not validated).
        if info.data.get("metrics") == "none":
            raise ValueError("set while metrics is none; remove metrics_history or set "
                             "`metrics: prometheus`")
        return value

    @model_validator(mode="after")
    def _budget_needs_autodown(self) -> ClusterSpec:
        # At its budget the gateway stops every job; autodown is what then takes the idle
        # cluster down. Without a watcher the cluster would bill on, idle, until a teardown.
        if self.sharing is not None and self.sharing.budget_usd and self.autodown is None:
            raise ValueError("sharing.budget_usd takes the cluster down through autodown, which "
                             "is off: add `autodown: {idle_minutes: 10}` (any period), or remove "
                             "budget_usd")
        return self

    @property
    def autodown_turned_off(self) -> bool:
        """True when the spec says `autodown: null` explicitly (against a provider's default)."""
        return self.autodown is None and "autodown" in self.model_fields_set

    @field_validator("name")
    @classmethod
    def _name_is_portable(cls, value: str) -> str:
        if not NAME_PATTERN.fullmatch(value):
            raise ValueError(
                f"cluster name {value!r} must be 1-31 lowercase letters, digits or dashes, "
                "starting with a letter; rename the file"
            )
        return value


def parse_spec(path: Path, data: Any, provider_names: typing.Sequence[str],
               spec_class: typing.Callable[[str], type[ClusterSpec]]) -> ClusterSpec:
    """Validate already-loaded YAML `data` as the spec of the cluster named by the file; the
    caller (infra/cli/loading.py) passes the registry's provider names and spec classes."""
    where = _display(path)
    if not isinstance(data, dict):
        raise SpecError(f"{where}: expected a mapping of keys (provider: ..., ...), got {data!r}")
    provider = data.get("provider")
    if provider is None:
        raise SpecError(
            f"{where}: provider: required key is missing; add one of {', '.join(provider_names)}"
        )
    if provider not in provider_names:
        hint = did_you_mean(str(provider), provider_names)
        raise SpecError(
            f"{where}: provider: unknown provider {provider!r}; "
            f"{hint + ' ' if hint else ''}choose one of {', '.join(provider_names)}"
        )
    if "name" in data or "source" in data:
        key = "name" if "name" in data else "source"
        raise SpecError(f"{where}: {key}: the cluster name is the file name; remove this key")
    model = spec_class(provider)
    try:
        return model.model_validate({**data, "name": path.stem, "source": where})
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        if tuple(first["loc"]) == ("name",):
            raise SpecError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None
        typo = misspelt_required(errors)
        raise SpecError(f"{where}: {typo or describe_error(model, first)}") from None


def read_spec(path: Path) -> Any:
    """The YAML of a spec file, not yet validated (infra/cli/loading.py validates it)."""
    import yaml

    where = _display(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(f"{where}: no such spec; create it or pick another --cluster") from None
    except IsADirectoryError:
        raise SpecError(f"{where}: is a directory; --cluster takes a spec file "
                        f"(e.g. {where.rstrip('/')}/<name>.yaml) or a name in clusters/") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise SpecError(f"{where}{line}: {problem}; fix the YAML syntax") from None
    if data is None:
        raise SpecError(f"{where}: the file is empty; add at least `provider: local`")
    return data


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def spec_path(cluster: str) -> Path:
    """`--cluster` takes a name in clusters/ or a path to a YAML file."""
    if cluster.endswith((".yaml", ".yml")) or "/" in cluster:
        return Path(cluster)
    return paths.clusters_dir() / f"{cluster}.yaml"


def selected_path(provider: str | None, cluster: str | None,
                  provider_names: typing.Sequence[str]) -> Path:
    """The spec file `--provider`/`--cluster` select: cluster wins, provider picks its default spec.

    With neither, the embedded default `local` is used, so a first `invoke up` needs no account.
    """
    if provider is not None and provider not in provider_names:
        hint = did_you_mean(provider, provider_names)
        raise UsageError(
            f"--provider: unknown provider {provider!r}; "
            f"{hint + ' ' if hint else ''}choose one of {', '.join(provider_names)}"
        )
    if cluster is not None:
        return spec_path(cluster)
    path = paths.clusters_dir() / f"{provider or DEFAULT_PROVIDER}.yaml"
    if not path.exists():
        said = f"--provider {provider}" if provider else "no --cluster or --provider given"
        raise UsageError(
            f"{said}: no default spec {_display(path)}; "
            f"create it (see clusters/*.yaml for examples) or pass --cluster"
        )
    return path


def check_provider(spec: ClusterSpec, provider: str | None) -> ClusterSpec:
    """`spec`, when `--provider` (if given) agrees with it."""
    if provider is not None and spec.provider != provider:
        raise UsageError(
            f"--provider {provider} disagrees with {spec.source} (provider: {spec.provider}); "
            "drop --provider or pick a spec of that provider"
        )
    return spec
