"""What a member's job leaves behind: charged to them, and reaped once they are past a limit.

A job that ends by itself can leave detached actors and placement groups, which go on holding
(and burning) the cluster with no job running. Every tick the gateway surveys them: one listing
of every actor not DEAD and one of every placement group not REMOVED from Ray's state API,
grouped by Ray job id, whatever the number of jobs. Ray's job list gives each submission's Ray
job id (`job_id`, once its driver connected), and the usage keeps it (`ray_job_id`), so what a
member's submission left is theirs even after Ray forgot the submission:
- charged: while any of it is alive after the job's end, the job counts as running, for its
  hours and for its cost share weighed by what the leftovers hold (gateway_usage.py);
- reaped, by the reaper job (gateway_stops.REAPER), at the first tick at which its member is
  past a limit: the job started more than `max_job_hours` ago, the member's job-hours or dollars
  reached `member_budget_hours`/`member_budget_usd`, or the member was removed or expired; and,
  for every job's leftovers, once the cluster's `budget_usd` was reached, so that autodown (which
  counts any live actor as busy) takes the cluster down. A reaper is started at most once every
  RETRY_S per Ray job id while its leftovers live, MAX_TRIES times.
What a job's code starts as a driver of its own (`ray.init` in a subprocess) gets a Ray job id of
its own, with no submission behind it: nothing ties it to the member, so only the cluster's
budget reaches its leftovers. Ray and what Ray brings only.
"""

from __future__ import annotations

import json
import time
from typing import Any, Protocol

from infra.node import gateway_state as gs
from infra.node import gateway_stops as stops
from infra.node import gateway_usage as gu
from infra.node.gateway_files import JobRecord

_NOT = "filter_keys=state&filter_predicates=%21%3D&filter_values="
#: Every actor not DEAD, every placement group not REMOVED (Ray's state API caps a list at 10000).
ACTORS = ("/api/v0/actors", f"detail=1&limit=10000&{_NOT}DEAD")
GROUPS = ("/api/v0/placement_groups", f"detail=1&limit=10000&{_NOT}REMOVED")
#: Seconds before a reaper is started again for leftovers still alive, and how many times: a
#: leftover no reaper removes must not start one forever (each keeps autodown busy a moment).
RETRY_S, MAX_TRIES = 15.0, 5
#: Ray's own actors (job supervisors and the like) live in these namespaces: never a leftover.
INTERNAL_NAMESPACES = ("_ray_internal", "SUPERVISOR_ACTOR_RAY_NAMESPACE")


class Gateway(Protocol):
    """What of the gateway (gateway.py) the leftovers use; the gateway passes itself."""

    config: Any
    members: gs.Members
    usage: gs.Usage
    audit: gs.Audit

    async def upstream_raw(self, method: str, path: str, query: str = "") -> tuple[int, bytes]: ...

    async def upstream_post_json(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]: ...


async def _rows(gateway: Gateway, path: str, query: str) -> list[dict[str, Any]] | None:
    try:
        status, raw = await gateway.upstream_raw("GET", path, query)
        rows = json.loads(raw)["data"]["result"]["result"] if status == 200 else None
    except Exception:  # Ray busy or an answer of another shape: no survey this tick
        return None
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else None


async def survey(gateway: Gateway) -> dict[str, float] | None:
    """CPU-equivalents (gateway_usage.units) held by the live actors and placement groups of
    each Ray job id that has any (0 for ones holding nothing countable); None when Ray cannot
    say. An actor in a placement group counts through the group, which reserves its share."""
    actors = await _rows(gateway, *ACTORS)
    groups = await _rows(gateway, *GROUPS) if actors is not None else None
    if actors is None or groups is None:
        return None
    held: dict[str, float] = {}
    for actor in actors:
        if str(actor.get("ray_namespace") or "").startswith(INTERNAL_NAMESPACES):
            continue
        job = str(actor.get("job_id") or "")
        extra = 0.0 if actor.get("placement_group_id") else gu.units(actor.get("required_resources"))
        held[job] = held.get(job, 0.0) + extra
    for group in groups:
        job = str(group.get("creator_job_id") or "")
        reserved = 0.0
        if group.get("state") == "CREATED":
            reserved = sum(gu.units(b.get("unit_resources")) for b in group.get("bundles") or []
                           if isinstance(b, dict))
        held[job] = held.get(job, 0.0) + reserved
    held.pop("", None)
    return held


def member_limit(gateway: Gateway, key: str, entry: JobRecord,
                 spent: dict[str, tuple[float, float]]) -> str | None:
    """Why the leftovers of the member job `key` must go now (None: they may stay). `spent`
    caches each member's (hours, dollars) within a tick."""
    member = gateway.usage.member_id_of(key)
    if member in (None, gs.OWNER_ID):
        return None
    config = gateway.config
    if member not in gateway.members.ids():
        return "its member was removed or expired"
    start = entry.start_time
    if config.max_job_hours and isinstance(start, int | float) \
            and time.time() - start / 1000 >= config.max_job_hours * 3600:
        return f"its job started more than sharing.max_job_hours ({config.max_job_hours:g} h) ago"
    if member not in spent:
        spent[member] = gateway.usage.spent(member)
    hours, usd = spent[member]
    if config.member_budget_hours is not None and hours >= config.member_budget_hours:
        return f"its member used sharing.member_budget_hours ({config.member_budget_hours:g})"
    if config.member_budget_usd is not None and usd >= config.member_budget_usd:
        return f"its member used sharing.member_budget_usd (${config.member_budget_usd:g})"
    return None


def doomed(gateway: Gateway, jobs: list[dict[str, Any]], held: dict[str, float]
           ) -> dict[str, tuple[str | None, str]]:
    """Ray job id -> (the usage's key of its job, or None; why) for every leftover that must go.
    Never a job Ray lists as pending or running: that is a job, stopped as one (gateway_stops)."""
    active = {str(j.get("job_id")) for j in jobs if j.get("status") in gu.ACTIVE}
    records = {str(e.ray_job_id): (k, e) for k, e in gateway.usage.jobs.items()
               if e.ray_job_id}
    budget = gateway.config.budget_usd
    cluster = gateway.usage.cluster
    over = bool(budget) and (cluster.budget_reached_at or cluster.accrued_usd >= budget)
    spent: dict[str, tuple[float, float]] = {}
    found: dict[str, tuple[str | None, str]] = {}
    for job_id in held:
        if job_id in active:
            continue
        key, entry = records.get(job_id, (None, None))
        why = member_limit(gateway, key, entry, spent) if key and entry else None
        if why is None and over:
            why = f"the cluster spent its budget (sharing.budget_usd ${budget:g})"
        if why is not None:
            found[job_id] = (key, why)
    return found


async def enforce(gateway: Gateway, jobs: list[dict[str, Any]]) -> None:
    """One tick's survey (kept in the usage for the next tick's charge) and reaping."""
    held = await survey(gateway)
    if held is None:
        return  # Ray could not say: the last survey stands
    gateway.usage.holdings = held
    due = doomed(gateway, jobs, held)
    now = time.monotonic()
    tried = gateway.usage.reaping
    for job_id in list(tried):
        if job_id not in held:
            del tried[job_id]  # gone: nothing left to reap
    wanted = [j for j in due if j not in tried
              or (now - tried[j][0] >= RETRY_S and tried[j][1] < MAX_TRIES)]
    if not wanted:
        return
    status = await stops.reap_ids(gateway, wanted)
    for job_id in wanted:
        tried[job_id] = (now, tried.get(job_id, (now, 0))[1] + 1)
        key, why = due[job_id]
        if key is not None:
            gateway.usage.note(key, leftovers_reaped=gs.now_iso(), leftovers_reason=why)
        gateway.audit.write(who="gateway", method="REAP", path="-", job=key or job_id,
                            ray_job_id=job_id, reason=f"leftovers reaped: {why}", status=status)
