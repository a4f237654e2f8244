"""What each member's own cluster uses (`sharing.isolation: cluster`), and the limits on it.

A member's cluster is theirs alone, so what it uses is theirs, whatever their jobs' metadata or
environment say: its node time, from its start to its stop, at the head machine's $/h times the
share of that machine the cluster may hold (its CPU limit over the machine's CPUs; on `local`
the head machine is the only node, whatever the spec prices it at). The record is kept per
member id in the gateway's data dir (0600), across stops and gateway restarts:
`state` (running, stopped), `since` (when it became so), `hours`, `usd`, `uploaded` (bytes),
`reason` (why it stopped). The limits that act on it, by the member's cluster (their Unix
user), not by what a job says: `member_budget_hours` and `member_budget_usd` (the cluster stops;
its next start is refused), the cluster's `budget_usd` (every member cluster stops), and
`max_job_hours` (a job of theirs running longer is stopped through their cluster's job API).
Standard library only (node rule); the job API calls take the gateway's aiohttp session.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infra.node.files import atomic_write

USAGE_FILE = "member-clusters-usage.json"
ACTIVE = ("PENDING", "RUNNING")


@dataclass(frozen=True)
class Limits:
    """What the gateway's config says of members' usage (gateway_config.Config)."""

    #: The head machine's $/h (its type's price, else the fixed price).
    head_price_per_hour: float = 0.0
    max_job_hours: float | None = None
    member_budget_hours: float | None = None
    member_budget_usd: float | None = None
    max_running_jobs_per_member: int = 2
    max_upload_mb: float = 100.0
    max_member_upload_mb: float = 2048.0
    #: Whether the cluster's `budget_usd` is reached (the gateway's usage says).
    budget_reached: Callable[[], bool] = lambda: False


def machine_share(cpus: float) -> float:
    """The share of the head machine a member cluster may hold: its CPU limit over the CPUs."""
    return max(0.0, min(1.0, cpus / float(os.cpu_count() or 1)))


def iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class MemberUsage:
    def __init__(self, path: Path, limits: Limits, share: float) -> None:
        self.path = path
        self.limits = limits
        self.share = share
        try:
            self.data: dict[str, dict[str, Any]] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}

    def _entry(self, member_id: str) -> dict[str, Any]:
        return self.data.setdefault(member_id, {"state": "stopped", "since": None, "hours": 0.0,
                                                "usd": 0.0, "uploaded": 0})

    def started(self, member_id: str, now: float | None = None) -> None:
        now = time.time() if now is None else now
        entry = self._entry(member_id)
        entry.update(state="running", since=iso(now), accrued_to=now, reason=None)
        self.save()

    def accrue(self, member_id: str, now: float | None = None) -> None:
        """Add the running cluster's node time since the last accrual, at its price share."""
        now = time.time() if now is None else now
        entry = self._entry(member_id)
        if entry.get("state") != "running":
            return
        hours = max(0.0, now - float(entry.get("accrued_to") or now)) / 3600
        entry["hours"] = float(entry["hours"]) + hours
        entry["usd"] = float(entry["usd"]) + hours * self.limits.head_price_per_hour * self.share
        entry["accrued_to"] = now

    def stopped(self, member_id: str, reason: str, now: float | None = None) -> None:
        if member_id not in self.data:  # never started through this record: nothing to close
            return
        now = time.time() if now is None else now
        self.accrue(member_id, now)
        entry = self._entry(member_id)
        if entry.get("state") == "running":
            entry.update(state="stopped", since=iso(now), reason=reason)
        entry.pop("accrued_to", None)
        self.save()

    def spent(self, *member_ids: str) -> tuple[float, float]:
        """The hours and dollars of the clusters of `member_ids` (a person's entries), accrued
        to the last check; what the member's own usage view adds to their jobs'."""
        found = [self.data[m] for m in member_ids if m in self.data]
        return (sum(float(e.get("hours") or 0.0) for e in found),
                sum(float(e.get("usd") or 0.0) for e in found))

    def close_stale(self, running: set[str]) -> None:
        """Records still `running` of clusters this gateway does not run (a previous gateway's,
        stopped at this one's start): stopped as of their last accrual; the time between is not
        known, so not counted."""
        for member_id, entry in self.data.items():
            if entry.get("state") == "running" and member_id not in running:
                self.stopped(member_id, "the gateway restarted",
                             float(entry.get("accrued_to") or time.time()))

    def refusal(self, member_id: str) -> str | None:
        """Why the member's cluster may not run (one line naming the key), or None."""
        limits, entry = self.limits, self._entry(member_id)
        if limits.budget_reached():
            return ("the cluster's budget (sharing.budget_usd) is used up; no member cluster "
                    "runs until the owner raises it")
        hours, usd = float(entry["hours"]), float(entry["usd"])
        if limits.member_budget_hours is not None and hours >= limits.member_budget_hours:
            return (f"your cluster has run {hours:.2f} h, your budget "
                    f"(sharing.member_budget_hours) is {limits.member_budget_hours:g} h; ask "
                    "the owner to raise it")
        if limits.member_budget_usd is not None and usd >= limits.member_budget_usd:
            return (f"your cluster has cost ${usd:.2f}, your budget (sharing.member_budget_usd) "
                    f"is ${limits.member_budget_usd:g}; ask the owner to raise it")
        return None

    def upload_refusal(self, member_id: str, size: int | None) -> str | None:
        """Why an upload of `size` bytes (its Content-Length) is refused, or None (counted)."""
        limit = int(self.limits.max_upload_mb * 1024 * 1024)
        if size is None:
            return "send the package with its Content-Length (sharing.max_upload_mb is checked)"
        if size > limit:
            return f"the package is larger than sharing.max_upload_mb ({self.limits.max_upload_mb:g} MB)"
        entry = self._entry(member_id)
        if int(entry["uploaded"]) + size > self.limits.max_member_upload_mb * 1024 * 1024:
            return ("the package is larger than sharing.max_member_upload_mb, your total, "
                    "allows")
        entry["uploaded"] = int(entry["uploaded"]) + size
        self.save()
        return None

    def view(self, now: float | None = None) -> dict[str, dict[str, Any]]:
        """Every member cluster's state, since when and its usage, by member id (accrued now)."""
        now = time.time() if now is None else now
        for member_id in list(self.data):
            self.accrue(member_id, now)
        return {m: {k: e.get(k) for k in ("state", "since", "hours", "usd", "uploaded", "reason")}
                for m, e in self.data.items()}

    def save(self) -> None:
        atomic_write(self.path, json.dumps(self.data, indent=1, sort_keys=True), mode=0o600)


def overdue(jobs: list[dict[str, Any]], max_job_hours: float | None,
            now: float | None = None) -> list[str]:
    """The submission ids of jobs pending or running longer than `max_job_hours` (Ray's times
    are ms since the epoch); plain drivers have no submission id to stop and are not listed."""
    if max_job_hours is None:
        return []
    now_ms = (time.time() if now is None else now) * 1000
    return [str(j["submission_id"]) for j in jobs
            if j.get("status") in ACTIVE and j.get("submission_id")
            and now_ms - float(j.get("start_time") or now_ms) >= max_job_hours * 3600 * 1000]


def active(jobs: list[dict[str, Any]]) -> int:
    return sum(1 for j in jobs if j.get("status") in ACTIVE)


def _session(token_path: str) -> Any:
    import requests

    session = requests.Session()
    token = Path(token_path).read_text().strip()
    session.headers["Authorization"] = f"Bearer {token}"
    return session


def list_jobs(url: str, token_path: str) -> list[dict[str, Any]]:
    """The member cluster's job list (Ray's `/api/jobs/`); raises when it does not answer."""
    with _session(token_path) as session:
        answer = session.get(f"{url}/api/jobs/", timeout=10)
        answer.raise_for_status()
        jobs: list[dict[str, Any]] = answer.json()
        return jobs


def stop_job(url: str, token_path: str, job_id: str) -> None:
    with _session(token_path) as session:
        session.post(f"{url}/api/jobs/{job_id}/stop", timeout=10).raise_for_status()
