"""The sharing gateway's two JSON files as typed files (infra/node/wire.py): the members file and
the usage file. Both outlive a head (the owner's machine keeps copies), so what 84e0693 wrote loads.

- `members.json` (`MembersFile`), written by the owner's machine only (infra/core/sharing/term.py
  `write_book`, every `member-*` verb), read by the gateway at every change
  (gateway_state.Members): `members` by name, the owner's own gateway token's hash (`owner`), and
  the `removed` entries (gateway_removed.py). The owner's machine reads it back as a dict through
  `MembersFile` too (term.py `read_book`): its verbs move entries between sections as they are.
- `usage.json` (`UsageFile`), written by the gateway (gateway_state.Usage), read by the owner's
  `members`, `status` and `report`: each member job's record by submission id (its times, cost
  share and stop notes: `JobRecord`), each member's last request, the cluster's money, and the
  bytes each member uploaded.

Entries and sections are `Wire` dataclasses without a version of their own; entries keep every key
as read (`absent`), since the owner's code tells a missing key from a null. A section of the wrong
JSON type reads as empty, as the gateway always read it, never as a reason to refuse the file.
Standard library only (node rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from infra.node.wire import ABSENT, EXTRA, VERSION, Wire


@dataclass
class JobRecord(Wire):
    """A member job's record in the usage file (by its submission id), written by the gateway
    (gateway_state.Usage): who submitted it (`member`, `member_id`), Ray's view of it at the last
    tick (`status`, `start_time`, `end_time` in ms, `ray_job_id`), its cost share, and what the
    gateway did (its stop, its leftovers' reaping, its budget note). Keys are kept as read
    (`absent`): the owner's machine tells a record without `member_id` (written before members
    had ids) from one with a null. A field set here is written, as a key set in a dict was."""

    KIND = "a job record of the gateway's usage file"

    member: str | None = None
    member_id: str | None = None
    #: When the gateway submitted it (ISO 8601).
    submitted: str | None = None
    #: When the gateway first noted it (epoch seconds): gateway_usage.gone_records.
    noted_at: float | None = None
    #: Its cost share in dollars.
    cost: float = 0.0
    status: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    ray_job_id: str | None = None
    #: When a tick found Ray no longer listing it (ISO 8601).
    gone: str | None = None
    #: The last tick that saw its leftovers alive (ms since the epoch).
    leftover_until: float | None = None
    stopped_by: str | None = None
    stopped_reason: str | None = None
    #: Epoch seconds of the stop's steps (gateway_stops.py).
    stop_requested: float | None = None
    stop_confirmed: float | None = None
    stop_forced: float | None = None
    #: When its leftovers were reaped (ISO 8601), and why.
    leftovers_reaped: str | None = None
    leftovers_reason: str | None = None
    budget_note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        # A field set is a key written (a null too), as `record[name] = value` on a dict was.
        if name != ABSENT and name in self.__dict__.get(ABSENT, ()):
            object.__setattr__(self, ABSENT, self.__dict__[ABSENT] - {name})
        object.__setattr__(self, name, value)

    @classmethod
    def new(cls, **fields: Any) -> JobRecord:
        """A record with only `fields` as keys (unknown ones kept in `extra`)."""
        record = cls(absent=frozenset(JOB_FIELDS))
        record.update(**fields)
        return record

    def update(self, **fields: Any) -> None:
        """Set `fields` (JOB_FIELDS as attributes, any other key in `extra`)."""
        for name, value in fields.items():
            if name in JOB_FIELDS:
                setattr(self, name, value)
            else:
                self.extra[name] = value


#: The fields of a job's record in the usage file, as the gateway writes them (JobRecord).
JOB_FIELDS = tuple(f.name for f in dataclasses.fields(JobRecord) if f.name not in (EXTRA, ABSENT))


@dataclass(frozen=True)
class MemberEntry(Wire):
    """One member of `members` (its name is the key): what `member-add` wrote."""

    KIND = "an entry of the gateway's members file"

    role: str | None = "member"
    #: When their access ends (ISO 8601; the earlier of their own and the term's), or never.
    expires: str | None = None
    #: Random, made at `member-add`; None: added before members had ids (gateway_state.legacy_id).
    id: str | None = None
    #: The SHA-256 of their token, never the token.
    token_sha256: str | None = None
    added: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class RemovedEntry(MemberEntry):
    """One entry of `removed`: a member entry moved there by `member-remove`, its token's hash
    renamed `revoked_sha256` (the gateway accepts tokens of `members` only)."""

    KIND = "a removed entry of the gateway's members file"

    name: str | None = None
    removed: str | None = None
    revoked_sha256: str | None = None
    #: `member-remove --stop-jobs`: the gateway stops their jobs (gateway_removals.py).
    stop_jobs: bool = False


@dataclass(frozen=True)
class OwnerEntry(Wire):
    """The owner's own gateway token (its hash): never the cluster's Ray token."""

    KIND = "the owner's entry of the gateway's members file"

    token_sha256: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


@dataclass(frozen=True)
class MembersFile(Wire):
    """`members.json`: see the module's docstring."""

    KIND = "the gateway's members file"

    members: dict[str, MemberEntry] = field(default_factory=dict)
    owner: OwnerEntry | None = None
    removed: list[RemovedEntry] = field(default_factory=list)
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)
    absent: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def from_dict(cls, data: Any) -> MembersFile:
        loaded = super().from_dict(data)
        raw: Any = loaded
        members = raw.members if isinstance(raw.members, Mapping) else {}
        removed = raw.removed if isinstance(raw.removed, list) else []
        return dataclasses.replace(
            loaded,
            members={str(n): MemberEntry.from_dict(e) for n, e in members.items()
                     if isinstance(e, Mapping)},
            owner=OwnerEntry.from_dict(raw.owner) if isinstance(raw.owner, Mapping) else None,
            removed=[RemovedEntry.from_dict(e) for e in removed if isinstance(e, Mapping)])

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["members"] = {name: entry.to_dict() for name, entry in self.members.items()}
        if "owner" in data:
            data["owner"] = self.owner.to_dict() if self.owner is not None else None
        if "removed" in data:
            data["removed"] = [entry.to_dict() for entry in self.removed]
        return data


@dataclass
class Seen(Wire):
    """A member's entry in the usage file's `members` (by name): their last request."""

    KIND = "a member's entry of the gateway's usage file"

    last_seen: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class ClusterUsage(Wire):
    """The usage file's `cluster`: its price now and its money since the usage began. Member
    jobs' shares, `owner_usd` and `idle_usd` sum to `accrued_usd`."""

    KIND = "the cluster section of the gateway's usage file"

    hourly_usd: float = 0.0
    accrued_usd: float = 0.0
    #: The share of jobs without a record of ours (the owner's, or started inside the cluster).
    owner_usd: float = 0.0
    #: Time with no job present.
    idle_usd: float = 0.0
    #: The first moment the cluster's budget was reached (ISO 8601), or not yet (not written).
    budget_reached_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        if data.get("budget_reached_at") is None:
            del data["budget_reached_at"]
        return data


@dataclass
class UsageFile(Wire):
    """`usage.json`: see the module's docstring."""

    KIND = "the gateway's usage file"

    #: A member job's record by its submission id.
    jobs: dict[str, JobRecord] = field(default_factory=dict)
    members: dict[str, Seen] = field(default_factory=dict)
    cluster: ClusterUsage = field(default_factory=ClusterUsage)
    #: Jobs without a record of ours, by key: Ray's status and times at the last tick.
    unattributed: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: Bytes of working-dir packages uploaded, by member id.
    uploads: dict[str, int] = field(default_factory=dict)
    #: By member id, by package name: {sha256, bytes, at} of each upload.
    packages: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Any) -> UsageFile:
        loaded = super().from_dict(data)
        raw: Any = loaded

        def section(value: Any) -> dict[str, Any]:
            return dict(value) if isinstance(value, Mapping) else {}

        return dataclasses.replace(
            loaded,
            jobs={k: JobRecord.from_dict(v) for k, v in section(raw.jobs).items()
                  if isinstance(v, Mapping)},
            members={k: Seen.from_dict(v) for k, v in section(raw.members).items()
                     if isinstance(v, Mapping)},
            cluster=ClusterUsage.from_dict(section(raw.cluster)),
            unattributed=section(raw.unattributed), uploads=section(raw.uploads),
            packages=section(raw.packages))

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        data["jobs"] = {key: record.to_dict() for key, record in self.jobs.items()}
        data["members"] = {name: seen.to_dict() for name, seen in self.members.items()}
        data["cluster"] = self.cluster.to_dict()
        return data
