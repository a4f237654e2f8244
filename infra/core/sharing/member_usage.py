"""A joined member's own usage, from their gateway (`GET /rayfleet/usage`, infra/node/
gateway_usage_view.py): what `rayfleet usage` prints and what `rayfleet submit` warns of.

The gateway answers from its own record, the one it refuses a submit by; this side only reads
it with the member's token, verifying the gateway against the cluster's CA (membership.py).
"""

from __future__ import annotations

from typing import Any

from infra.core.errors import RayfleetError
from infra.core.sharing import membership

ROUTE = "/rayfleet/usage"


class UsageViewError(RayfleetError):
    """The gateway did not answer the member's usage."""


def fetch(cluster: str, timeout: float = 15.0) -> dict[str, Any]:
    """The gateway's answer for this member (a dict), or one line saying why not."""
    import requests

    endpoint = membership.endpoint(cluster)  # pins the cluster's CA for this process
    token = endpoint.token_path.read_text().strip() if endpoint.token_path else ""
    url = endpoint.dashboard_url.rstrip("/") + ROUTE
    try:
        answer = requests.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=timeout)
    except requests.RequestException as exc:
        raise UsageViewError(f"the gateway of {cluster!r} at {endpoint.dashboard_url} did not "
                             f"answer ({type(exc).__name__}); try again, or ask the cluster's "
                             "owner whether it is up") from None
    if answer.status_code == 404:
        raise UsageViewError(f"the gateway of {cluster!r} has no {ROUTE} (an older rayfleet on "
                             "the head); ask the cluster's owner to run `invoke up` again")
    if answer.status_code != 200:
        said = answer.text.strip().splitlines()[-1:] or [f"status {answer.status_code}"]
        raise UsageViewError(f"the gateway of {cluster!r} refused: {said[0][:300]}")
    try:
        found = answer.json()
    except ValueError:
        found = None
    if not isinstance(found, dict):
        raise UsageViewError(f"the gateway of {cluster!r} answered {ROUTE} with no JSON object")
    return found


def lines(found: dict[str, Any]) -> list[str]:
    """`rayfleet usage` as plain lines (instants as `2026-11-27 23:59 UTC`)."""
    from infra.core.sharing import term as sharing_term

    budget, left = found.get("budget") or {}, found.get("left") or {}
    out = [f"{found.get('cluster')}: member {found.get('member')} ({found.get('role')}), "
           f"access until {sharing_term.shown(found.get('expires')) or 'no end set'}",
           f"  jobs: {found.get('running_jobs', 0)} running of {found.get('total_jobs', 0)} "
           f"(at most {found.get('max_running_jobs')} at once)",
           f"  used: {float(found.get('job_hours') or 0):.2f} job-hours, "
           f"${float(found.get('cost_usd') or 0):.2f} (cost share, an estimate)"]
    limits = [f"{budget['job_hours']:g} job-hours" if budget.get("job_hours") else "",
              f"${budget['usd']:g}" if budget.get("usd") else ""]
    rest = [f"{left['job_hours']:.2f} job-hours" if left.get("job_hours") is not None else "",
            f"${left['usd']:.2f}" if left.get("usd") is not None else ""]
    if any(limits):
        out.append(f"  budget: {' and '.join(p for p in limits if p)}; left: "
                   f"{' and '.join(p for p in rest if p)} ({float(found.get('used') or 0):.0%} "
                   "used)")
    else:
        out.append("  budget: none set for members")
    return out


def near_note(cluster: str) -> str | None:
    """The gateway's note when this member is at or past 80 % of their budget; None otherwise,
    or when the gateway cannot say (never in the way of a submit)."""
    try:
        note = fetch(cluster, timeout=10.0).get("note")
    except RayfleetError:
        return None
    return str(note) if note else None
