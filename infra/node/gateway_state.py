"""What the sharing gateway (infra/node/gateway.py) keeps on the head: members, usage, audit, limits.

All of it lives in the gateway's data dir, outside the cluster's temp dir, so that it outlives a
gateway restart (and, on the owner's machine, a teardown):
- `members.json`, written by the owner's `member-add`/`member-remove` (infra/sharing.py): names,
  roles, expiry and the SHA-256 of each member's token, never a token. The gateway stats it at
  every request and re-reads it when it changed, so a removal holds from the next request on.
- `usage.json`, written by the gateway: every member job it has seen, its hours and cost share,
  and when each member was last seen.
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

from infra.node.files import atomic_write

MEMBERS_FILE = "members.json"
USAGE_FILE = "usage.json"
AUDIT_FILE = "audit.log"
#: Failed logins from one source address within WINDOW seconds before it is turned away for WINDOW.
MAX_FAILURES, WINDOW = 10, 60.0
#: Ray's final job states: a job in one never runs again.
FINISHED = ("SUCCEEDED", "FAILED", "STOPPED")


def token_hash(token: str) -> str:
    """What the head stores of a member's token: tokens are 32 random bytes, so one SHA-256 is
    enough (no dictionary to guess from)."""
    return hashlib.sha256(token.encode()).hexdigest()


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Member:
    name: str
    role: str  # "member", "admin" or "owner" (the cluster token's holder)
    expires: str | None = None

    @property
    def sees_all(self) -> bool:
        return self.role in ("admin", "owner")


OWNER = Member("owner", "owner")


class Members:
    """The members file, re-read whenever its modification time or size changes."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self._by_hash: dict[str, Member] = {}

    def _refresh(self) -> None:
        try:
            info = self.path.stat()
        except FileNotFoundError:
            self._stamp, self._by_hash = None, {}
            return
        stamp = (info.st_mtime_ns, info.st_size)
        if stamp == self._stamp:
            return
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return  # half-written by hand: keep the last good view
        self._by_hash = {
            str(entry["token_sha256"]): Member(name, str(entry.get("role", "member")),
                                               entry.get("expires"))
            for name, entry in (data.get("members") or {}).items()
        }
        self._stamp = stamp

    def lookup(self, token: str) -> Member | None:
        self._refresh()
        wanted = token_hash(token)
        for digest, member in self._by_hash.items():
            if hmac.compare_digest(digest, wanted):
                return member
        return None


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

    def blocked(self, source: str) -> float:
        """Seconds `source` must still wait (0: it may try)."""
        times = self._recent(source)
        if len(times) < MAX_FAILURES:
            return 0.0
        return max(0.0, times[-1] + WINDOW - time.monotonic())

    def failed(self, source: str) -> None:
        self._recent(source).append(time.monotonic())


class Usage:
    """Per-member usage, accounted on the head: job-hours and the cost share (at each tick, the
    cluster's $/h split evenly among the member jobs running then)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data: dict[str, Any] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.data.setdefault("jobs", {})
        self.data.setdefault("members", {})
        cluster = self.data.setdefault("cluster", {})
        for name in ("hourly_usd", "accrued_usd", "owner_usd", "idle_usd"):
            cluster.setdefault(name, 0.0)
        self._dirty = False
        #: Counts `note` calls: what the gateway shows of a job beside Ray's view (its stop
        #: reason) changes only there, so a rendering made at the same version is still true.
        self.version = 0

    def seen(self, member: str) -> None:
        entry = self.data["members"].setdefault(member, {})
        stamp = now_iso()
        if entry.get("last_seen", "")[:16] != stamp[:16]:  # written at most once a minute
            self._dirty = True
        entry["last_seen"] = stamp

    def tick(self, jobs: list[dict[str, Any]], seconds: float, price_per_hour: float) -> None:
        """Record every member job Ray lists (its start and end: the job-hours) and account
        `seconds` of the cluster at `price_per_hour` (the cost share): split evenly among the
        jobs running now, a member job's part to that job and the owner's jobs' to the owner;
        with nothing running, it is idle cost. Member jobs, owner and idle sum to the accrued."""
        running = {_key(j) for j in jobs if j.get("status") == "RUNNING"}
        cost = price_per_hour * seconds / 3600
        share = cost / len(running) if running else 0.0
        cluster = self.data["cluster"]
        if cost or cluster["hourly_usd"] != price_per_hour:
            self._dirty = True
        cluster["hourly_usd"] = price_per_hour
        cluster["accrued_usd"] += cost
        if not running:
            cluster["idle_usd"] += cost
        for job in jobs:
            member, key = _member_of(job), _key(job)
            if not member:
                if key in running:
                    cluster["owner_usd"] += share
                continue
            entry = self.data["jobs"].setdefault(key, {"member": member, "cost": 0.0})
            before = dict(entry)
            entry.update(member=member, status=job.get("status"), start_time=job.get("start_time"),
                         end_time=job.get("end_time"))
            if key in running:
                entry["cost"] = float(entry.get("cost", 0.0)) + share
            if entry != before:
                self._dirty = True

    def maybe_active(self, member: str) -> int:
        """How many of `member`'s recorded jobs may still be pending or running: all but those
        last seen in a final state. Once a tick has recorded every member job Ray lists, and
        every submit since was noted, this bounds the member's active jobs from above."""
        return sum(1 for entry in self.data["jobs"].values()
                   if entry.get("member") == member and entry.get("status") not in FINISHED)

    def note(self, job_id: str, **fields: Any) -> None:
        self.data["jobs"].setdefault(job_id, {"cost": 0.0}).update(fields)
        self._dirty = True
        self.version += 1

    def reason(self, job_id: str) -> str | None:
        entry = self.data["jobs"].get(job_id)
        return entry.get("stopped_reason") if entry else None

    def save(self) -> None:
        if self._dirty:
            atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=True), mode=0o600)
            self._dirty = False


def _key(job: dict[str, Any]) -> str:
    return str(job.get("submission_id") or job.get("job_id"))


def _member_of(job: dict[str, Any]) -> str | None:
    metadata = job.get("metadata") or {}
    return metadata.get("rayfleet_member") if isinstance(metadata, dict) else None


def job_hours(entry: dict[str, Any], now_ms: float | None = None) -> float:
    """Hours a job has run (Ray's start and end times, in ms); 0 before it starts."""
    start = entry.get("start_time")
    if start is None:
        return 0.0
    end = entry.get("end_time") or now_ms or time.time() * 1000
    return max(0.0, (float(end) - float(start)) / 3.6e6)


def member_of(job: dict[str, Any]) -> str | None:
    """The member a job belongs to, as the gateway recorded it (None: the owner's)."""
    return _member_of(job)


class Audit:
    """One JSON line per request: who, what, when, which job, and the status answered."""

    def __init__(self, path: Path) -> None:
        self.path = path
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._file = os.fdopen(fd, "a", buffering=1)

    def write(self, **fields: Any) -> None:
        self._file.write(json.dumps({"at": now_iso(), **fields}, sort_keys=True) + "\n")
