"""What the sharing gateway (infra/node/gateway.py) keeps on the head: members, usage, audit, limits.

All of it lives in the gateway's data dir, outside the cluster's temp dir, so that it outlives a
gateway restart (and, on the owner's machine, a teardown):
- `members.json`, written by the owner's `member-add`/`member-remove` (infra/core/sharing/owner.py): names,
  roles, expiry and the SHA-256 of each member's token, never a token. The gateway stats it at
  every request and re-reads it when it changed, so a removal holds from the next request on.
- `usage.json`, written by the gateway: every member job it has seen, its hours and cost share,
  and when each member was last seen.
Both are typed files (gateway_files.py): read and written through their dataclasses.
- `audit.log`, JSON lines: who, what, when, which job, and the answer's status.
Standard library only (node rule).
"""

from __future__ import annotations

import collections
import datetime as dt
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.node import gateway_files as gf
from infra.node import gateway_removed as gr
from infra.node import gateway_usage as gu
from infra.node.files import SecretFile as SecretFile
from infra.node.files import atomic_write

# The usage's arithmetic, named here too: callers (the laptop's `members` among them) read it here.
from infra.node.gateway_usage import FINISHED as FINISHED
from infra.node.gateway_usage import job_hours as job_hours
from infra.node.gateway_usage import presence as presence
from infra.node.gateway_usage import split_cost as split_cost
from infra.node.wire import VERSION, WireError

MEMBERS_FILE = "members.json"
USAGE_FILE = "usage.json"
AUDIT_FILE = "audit.log"
#: Failed logins from one source address within WINDOW seconds before it is turned away for WINDOW.
MAX_FAILURES, WINDOW = 10, 60.0


def token_hash(token: str) -> str:
    """What the head stores of a member's token: tokens are 32 random bytes, so one SHA-256 is
    enough (no dictionary to guess from)."""
    return hashlib.sha256(token.encode()).hexdigest()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Member:
    name: str
    role: str  # "member", "admin" or "owner" (the holder of the owner's own gateway token)
    expires: str | None = None
    #: Random, made when the member was added: re-adding a name makes another member, who sees
    #: none of the first one's jobs. Registries from before ids: `legacy-<name>`.
    id: str = ""

    @property
    def sees_all(self) -> bool:
        return self.role in ("admin", "owner")


#: The owner's id in the gateway's records (no member's id: those are random hex).
OWNER_ID = "owner"
OWNER = Member("owner", "owner", id=OWNER_ID)


def legacy_id(name: str) -> str:
    """The id of a member added before members had ids (and of their recorded jobs)."""
    return f"legacy-{name}"


class Members:
    """The members file, re-read whenever its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int, int] | None = None
        self._by_hash: dict[str, Member] = {}
        self._book = gf.MembersFile()
        self._gone = gr.Gone()

    def _refresh(self) -> None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._by_hash, self._book = None, {}, gf.MembersFile()
            return
        # The inode too: every write replaces the file (atomic_write), and a same-size rewrite
        # within a coarse timestamp step (1 s on some file systems) must not go unseen.
        stamp = (info.st_mtime_ns, info.st_size, info.st_ino)
        if stamp == self._stamp:
            return
        try:
            book = gf.MembersFile.from_json(self.path.read_text())
        except (OSError, ValueError, WireError):
            return  # half-written by hand: keep the last good view
        self._by_hash = {str(entry.token_sha256): member_of(name, entry)
                         for name, entry in book.members.items()
                         if entry.token_sha256 and entry.role in ("member", "admin")}
        # The owner's own gateway token (sharing.py): never the cluster's Ray token, which every
        # node holds and so every member's job can read.
        if book.owner is not None and book.owner.token_sha256:
            self._by_hash[str(book.owner.token_sha256)] = OWNER
        self._gone.read(book.removed, legacy_id)
        self._book, self._stamp = book, stamp

    def named(self, name: str) -> Member | None:
        """The member of that name as the file now says, token or not (None: none, the owner's
        role, or expired)."""
        self._refresh()
        entry = self._book.members.get(name)
        if entry is None or entry.role not in ("member", "admin"):
            return None
        member = member_of(name, entry)
        return None if expired(member) else member

    def gone(self) -> gr.Gone:
        """The removed entries, as the file now says (gateway_removed.py)."""
        self._refresh()
        return self._gone

    def person_ids(self, member: Member) -> tuple[str, ...]:
        """`member`'s id and their earlier entries' (the same name, removed): one budget."""
        return (member.id, *self.gone().earlier_ids(member.name, member.id))

    def ids(self) -> set[str]:
        """The ids of every member who may still act (the owner's too)."""
        self._refresh()
        return {m.id for m in self._by_hash.values() if not expired(m)}

    def lookup(self, token: str) -> Member | None:
        self._refresh()
        wanted = token_hash(token)
        for digest, member in self._by_hash.items():
            if hmac.compare_digest(digest, wanted):
                return member
        return None


def member_of(name: str, entry: gf.MemberEntry) -> Member:
    return Member(name, str(entry.role), entry.expires, str(entry.id or legacy_id(name)))


def expired(member: Member) -> bool:
    if not member.expires:
        return False
    return dt.datetime.fromisoformat(member.expires) <= dt.datetime.now(dt.timezone.utc)


class FailedLogins:
    """Per source address: refuse it for WINDOW seconds after MAX_FAILURES failures in WINDOW."""

    def __init__(self) -> None:
        self._times: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)

    def _recent(self, source: str) -> collections.deque[float]:
        times = self._times[source]
        while times and times[0] < time.monotonic() - WINDOW:
            times.popleft()
        return times

    def prune(self) -> None:
        """Forget sources with no failure within WINDOW: a scan of many addresses must not grow
        the table for the gateway's lifetime."""
        for source in list(self._times):
            if not self._recent(source):
                del self._times[source]

    def __len__(self) -> int:
        return len(self._times)

    def blocked(self, source: str) -> float:
        """Seconds `source` must still wait (0: it may try)."""
        if source not in self._times:
            return 0.0
        times = self._recent(source)
        if len(times) < MAX_FAILURES:
            return 0.0
        return max(0.0, times[-1] + WINDOW - time.monotonic())

    def failed(self, source: str) -> None:
        self._recent(source).append(time.monotonic())


class Usage:
    """Per-member usage, accounted on the head: job-hours and the cost share (at each tick, the
    cluster's $/h split among the jobs present then by the resources they held)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.file = gf.UsageFile.from_json(path.read_text())
        except (OSError, ValueError, WireError):
            self.file = gf.UsageFile()
        #: Each member job's record by submission id (gf.JobRecord); the cluster's money.
        self.jobs, self.cluster = self.file.jobs, self.file.cluster
        self._dirty = False
        #: Counts `note` calls: what the gateway shows of a job beside Ray's view (its stop
        #: reason) changes only there, so a rendering made at the same version is still true.
        self.version = 0
        #: CPU-equivalents held by the live actors and placement groups of each Ray job id (hex),
        #: as the gateway's last survey found them (gateway_leftovers.py); not kept on disk.
        self.holdings: dict[str, float] = {}
        #: Ray job id -> (when its last reaper was started, time.monotonic(); how many were).
        self.reaping: dict[str, tuple[float, int]] = {}

    def seen(self, member: str) -> None:
        entry = self.file.members.setdefault(member, gf.Seen())
        stamp = now_iso()
        if (entry.last_seen or "")[:16] != stamp[:16]:  # written at most once a minute
            self._dirty = True
        entry.last_seen = stamp

    def tick(self, jobs: list[dict[str, Any]], seconds: float, price_per_hour: float,
             now: float | None = None) -> None:
        """Update every job the gateway recorded at its submit (its start and end: the job-hours)
        and account the last `seconds` of the cluster (until `now`, epoch seconds; the head's
        clock, Ray's too) at `price_per_hour` (the cost share): at every moment, split among the
        jobs present then by the resources each held (gateway_usage.py), a member job's part to
        that job, and the part of every job without a record of ours (the owner's through their
        tunnel, or started inside the cluster: "unattributed") to the owner; with nothing
        present, it is idle cost. A job that started and ended between two ticks pays for its
        time too; one Ray no longer lists is closed (`gone_records`), and one whose leftovers
        live on (`holdings`, the last survey) counts as running. Member jobs, owner and idle sum
        to the accrued. Who a job is comes only from our record: the metadata Ray shows can be
        set by any code inside the cluster."""
        until = time.time() if now is None else now
        since = until - seconds
        records = self.jobs
        gone = gu.gone_records(records, {gu.key(j) for j in jobs}, since, until)
        everything = [*jobs, *gone.values()]
        lingering, weights = self._holding(everything)
        shares, idle = split_cost(presence(everything, since, until, lingering), since, until,
                                  price_per_hour, weights)
        cost = price_per_hour * seconds / 3600
        cluster = self.cluster
        if cost or cluster.hourly_usd != price_per_hour:
            self._dirty = True
        cluster.hourly_usd = price_per_hour
        cluster.accrued_usd += cost
        cluster.idle_usd += idle
        unattributed = self.file.unattributed
        for job in everything:
            key = gu.key(job)
            entry = records.get(key)
            times = {"status": job.get("status"), "start_time": job.get("start_time"),
                     "end_time": job.get("end_time")}
            if entry is None or not entry.member:
                cluster.owner_usd += shares.get(key, 0.0)
                if unattributed.get(key) != times:
                    unattributed[key] = times
                    self._dirty = True
                continue
            before = entry.to_dict()
            entry.update(**times)
            if job.get("job_id"):
                entry.ray_job_id = job["job_id"]
            if key in gone:
                entry.gone = now_iso()
            if key in lingering:
                entry.leftover_until = until * 1000
            if key in shares:
                entry.cost = float(entry.cost) + shares[key]
            if entry.to_dict() != before:
                self._dirty = True

    def _holding(self, jobs: list[dict[str, Any]]) -> tuple[frozenset[str], dict[str, float]]:
        """From the last survey (`holdings`: CPU-equivalents held by each Ray job id's live actors
        and placement groups): the keys of jobs that ended but whose leftovers live on (added to
        `jobs`, from their records, when Ray lists them no more), and every job's weight."""
        listed = {gu.key(j) for j in jobs}
        for name, entry in self.jobs.items():
            if name not in listed and entry.ray_job_id in self.holdings:
                jobs.append({"submission_id": name, "job_id": entry.ray_job_id,
                             "status": entry.status, "start_time": entry.start_time,
                             "end_time": entry.end_time})
        lingering, weights = set(), {}
        for job in jobs:
            name, active = gu.key(job), job.get("status") in gu.ACTIVE
            held = self.holdings.get(str(job.get("job_id") or ""))
            weights[name] = (gu.entrypoint_units(job) if active else 0.0) + (held or 0.0)
            if held is not None and not active:
                lingering.add(name)
        return frozenset(lingering), weights

    def maybe_active(self, member_id: str) -> int:
        """How many of the member's recorded jobs may still be pending or running: all but
        those last seen in a final state. Once a tick has recorded every member job Ray lists,
        and every submit since was noted, this bounds the member's active jobs from above."""
        return sum(1 for key, entry in self.jobs.items()
                   if self.member_id_of(key) == member_id and entry.status not in FINISHED)

    def lingering(self, member_id: str, since_ms: float) -> set[str]:
        """The member's ended jobs whose actors or placement groups a tick at or after `since_ms`
        (ms since the epoch) saw alive: they hold the cluster as a running job does."""
        return {key for key, entry in self.jobs.items()
                if self.member_id_of(key) == member_id and entry.status in FINISHED
                and float(entry.leftover_until or 0) >= since_ms}

    def member_id_of(self, job_id: str) -> str | None:
        """The id of the member who submitted `job_id` through the gateway, from its own record
        (None: no record of ours; the owner's own jobs through the gateway: OWNER_ID)."""
        entry = self.jobs.get(job_id)
        if entry is None or not entry.member:
            return None
        return str(entry.member_id or legacy_id(str(entry.member)))

    def spent(self, *member_ids: str) -> tuple[float, float]:
        """The job-hours and dollars of every job the gateway recorded as one of `member_ids`'."""
        own = [entry for key, entry in self.jobs.items()
               if self.member_id_of(key) in member_ids]
        return (sum(job_hours(entry) for entry in own),
                sum(float(entry.cost) for entry in own))

    def recorded(self, job_id: str) -> bool:
        return job_id in self.jobs

    def uploaded(self, member_id: str) -> int:
        """Bytes of working-dir packages `member_id` has uploaded through the gateway."""
        return int(self.file.uploads.get(member_id, 0))

    def add_upload(self, member_id: str, size: int) -> None:
        uploads = self.file.uploads
        uploads[member_id] = int(uploads.get(member_id, 0)) + size
        self._dirty = True

    def package_digest(self, member_id: str, name: str) -> str | None:
        """The SHA-256 of what `member_id` uploaded as package `name` (None: no upload of theirs
        through this gateway recorded it)."""
        entry = self.file.packages.get(member_id, {}).get(name)
        return str(entry["sha256"]) if isinstance(entry, dict) and entry.get("sha256") else None

    def add_package(self, member_id: str, name: str, digest: str, size: int) -> None:
        """Record `member_id`'s upload of package `name` (its digest) and count its bytes."""
        self.file.packages.setdefault(member_id, {})[name] = {
            "sha256": digest, "bytes": size, "at": now_iso()}
        self.add_upload(member_id, size)

    def reach_budget(self) -> bool:
        """Record the first moment the cluster's budget was reached (kept with the usage, so a
        restarted gateway knows it); True only that first time."""
        if self.cluster.budget_reached_at:
            return False
        self.cluster.budget_reached_at = now_iso()
        self._dirty = True
        return True

    def pending_stops(self) -> list[tuple[str, gf.JobRecord]]:
        """Jobs a stop was asked for whose end (and reaping) is not yet confirmed."""
        return [(key, entry) for key, entry in self.jobs.items()
                if entry.stop_requested and not entry.stop_confirmed]

    def note(self, job_id: str, **fields: Any) -> None:
        # When it was first noted: a job Ray no longer lists is closed only once a list asked
        # for after that could have shown it (gateway_usage.gone_records).
        record = self.jobs.get(job_id)
        if record is None:
            record = self.jobs[job_id] = gf.JobRecord.new(cost=0.0, noted_at=time.time())
        record.update(**fields)
        self._dirty = True
        self.version += 1

    def reason(self, job_id: str) -> str | None:
        entry = self.jobs.get(job_id)
        return entry.stopped_reason if entry is not None else None

    def save(self) -> None:
        if self._dirty:
            # This code's version (a newer one's number kept: its keys are kept too).
            self.file.version = max(self.file.version, VERSION)
            atomic_write(self.path, json.dumps(self.file.to_dict(), indent=1, sort_keys=True),
                         mode=0o600)
            self._dirty = False


class RequestRate:
    """Per member: at most RATE requests a second on average, BURST at once (a token bucket).
    A member's runaway script must not take the gateway (and Ray's dashboard) from the class."""

    RATE, BURST = 20.0, 200.0

    def __init__(self, rate: float = RATE, burst: float = BURST) -> None:
        self.rate, self.burst = rate, burst
        self._buckets: dict[str, tuple[float, float]] = {}

    def take(self, member_id: str) -> float:
        """0 when `member_id` may go on (one request taken), else the seconds until it may."""
        now = time.monotonic()
        level, then = self._buckets.get(member_id, (self.burst, now))
        level = min(self.burst, level + (now - then) * self.rate)
        if level < 1:
            self._buckets[member_id] = (level, now)
            return (1 - level) / self.rate
        self._buckets[member_id] = (level - 1, now)
        return 0.0


class Audit:
    """One JSON line per request: who, from where, what, when, which job, and the status
    answered. Rotated by size (`audit.log.1` ... `.KEEP`), so a long term cannot fill the disk."""

    MAX_BYTES, KEEP = 20 * 1024 * 1024, 5

    def __init__(self, path: Path, max_bytes: int = MAX_BYTES, keep: int = KEEP) -> None:
        self.path, self.max_bytes, self.keep = path, max_bytes, keep
        self._file = self._open()

    def _open(self) -> Any:
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return os.fdopen(fd, "a", buffering=1)

    def write(self, **fields: Any) -> None:
        self._file.write(json.dumps({"at": now_iso(), **fields}, sort_keys=True) + "\n")
        if self._file.tell() >= self.max_bytes:
            self._rotate()

    def _rotate(self) -> None:
        self._file.close()
        for n in range(self.keep - 1, 0, -1):
            older = self.path.with_name(f"{self.path.name}.{n}")
            if older.exists():
                older.replace(self.path.with_name(f"{self.path.name}.{n + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = self._open()
