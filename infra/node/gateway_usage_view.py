"""A member's own view of their usage: `GET /rayfleet/usage` (what `rayfleet usage` prints), the
dashboard banner's line, and the note a member near their budget is given at submit.

The figures are the gateway's own record, the ones it refuses a submit by (JobRoutes.over_budget):
job-hours and cost share of every job of theirs, summed over the person's entries (a name removed
and added again is one person for the term: Members.person_ids), against `sharing.member_budget_*`.
Stock `ray job submit` prints nothing of the submit's answer but the job's id, so a member near
their budget (WARN_AT) is told where they look: the job's status message (`ray job status`, the
dashboard's job page), `rayfleet submit` and `rayfleet usage`. Ray and what Ray brings only.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from infra.node import gateway_state as gs

ROUTE = "/rayfleet/usage"
#: From this share of a budget on, the member is told (as the owner's `status` warns of them).
WARN_AT = 0.8
_ACTIVE = ("PENDING", "RUNNING")


class Gateway(Protocol):
    config: Any
    usage: gs.Usage
    members: gs.Members


def view(gateway: Gateway, who: gs.Member) -> dict[str, Any]:
    """`who`'s usage, budget and what is left of it, as JSON (instants ISO 8601)."""
    config, usage = gateway.config, gateway.usage
    ids = gateway.members.person_ids(who) if who.role != "owner" else (who.id,)
    hours, usd = usage.spent(*ids)
    own = getattr(gateway, "member_clusters", None)  # `isolation: cluster`: their own cluster's
    if own is not None and who.role != "owner":  # node time is theirs (member_usage.py)
        cluster_hours, cluster_usd = own.usage.spent(*ids)
        hours, usd = hours + cluster_hours, usd + cluster_usd
    theirs = [e for k, e in usage.jobs.items() if usage.member_id_of(k) in ids]
    limits = {"job_hours": config.member_budget_hours, "usd": config.member_budget_usd}
    spent = {"job_hours": hours, "usd": usd}
    if who.role == "owner":  # the owner has no member budget
        limits = {"job_hours": None, "usd": None}
    shares = [spent[k] / limit for k, limit in limits.items() if limit]
    found: dict[str, Any] = {
        "cluster": config.cluster, "member": who.name, "role": who.role, "expires": who.expires,
        "job_hours": round(hours, 4), "cost_usd": round(usd, 4),
        "budget": limits,
        "left": {k: (None if not limit else round(max(0.0, limit - spent[k]), 4))
                 for k, limit in limits.items()},
        "used": round(max(shares), 4) if shares else None,
        "running_jobs": sum(1 for e in theirs if e.status in _ACTIVE),
        "total_jobs": len(theirs),
        "max_running_jobs": config.max_running_jobs_per_member,
    }
    found["note"] = note(found)
    return found


def note(found: dict[str, Any]) -> str | None:
    """The one line a member at or past WARN_AT of their budget is told, else None."""
    used = found.get("used")
    if used is None or used < WARN_AT:
        return None
    parts = []
    if found["budget"]["job_hours"]:
        parts.append(f"{found['job_hours']:.2f} of {found['budget']['job_hours']:g} job-hours")
    if found["budget"]["usd"]:
        parts.append(f"${found['cost_usd']:.2f} of ${found['budget']['usd']:g}")
    then = ("their next submit is refused" if used >= 1 else
            "at 100 % their next submit is refused")
    return (f"member {found['member']} has used {used:.0%} of their budget "
            f"({', '.join(parts)}): {then}; ask the cluster's owner for more")


def banner_line(gateway: Gateway, who: gs.Member) -> str:
    """The banner's sentence: the same figures as `rayfleet usage`."""
    found = view(gateway, who)
    text = f"Your usage: {found['job_hours']:.2f} job-hours, ${found['cost_usd']:.2f}"
    hours_left, usd_left = found["left"]["job_hours"], found["left"]["usd"]
    left = ([f"{hours_left:.2f} job-hours"] if hours_left is not None else []) + \
        ([f"${usd_left:.2f}"] if usd_left is not None else [])
    if left:
        text += f"; budget left: {', '.join(left)} ({found['used']:.0%} used)"
    return text + ". " + (found["note"] + ". " if found["note"] else "")


def answer(gateway: Gateway, request: Any, who: gs.Member) -> Any:
    """The route's answer: GET only."""
    from aiohttp import web

    if request.method != "GET":
        return web.Response(status=405, text=f"{request.method} {ROUTE}: only GET\n")
    return web.Response(status=200, content_type="application/json",
                        text=json.dumps(view(gateway, who)))


def submit_note(gateway: Gateway, who: gs.Member) -> dict[str, Any]:
    """What a submit's record keeps of the budget: the note, when the member is near it."""
    if who.role == "owner":
        return {}
    said = view(gateway, who)["note"]
    return {"budget_note": said} if said else {}


def message(usage: gs.Usage, job: dict[str, Any]) -> str | None:
    """The job's status message with the budget note its submit was given (Ray's message kept
    first: a failure's reason is never hidden), or None without one."""
    record = usage.jobs.get(str(job.get("submission_id") or job.get("job_id")))
    said = record.budget_note if record is not None else None
    if not said:
        return None
    return f"{job.get('message') or ''} ({said})".strip()
