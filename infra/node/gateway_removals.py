"""`member-remove --stop-jobs`, the gateway's side: every job of the removed entry is stopped
with the reason recorded, and said in the audit log.

The owner's command stops their jobs itself, at once, through Ray's own job API, which records
nothing of who or why. The registry's removed entry carries `stop_jobs` (gateway_removed.py), so
at its next tick the gateway records `stopped by the owner: member removed` on each of their jobs
(the `stopped` column of `status`, the job's message) with an audit line, and stops, and follows
like any stop (gateway_stops.py), any job of theirs still pending or running: a stop the owner's
command could not make is made here. Ray and what Ray brings only.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from infra.node import gateway_state as gs
from infra.node import gateway_stops as stops
from infra.node import gateway_target as gt

REASON = "stopped by the owner: member removed"


class Gateway(stops.Gateway, Protocol):
    members: gs.Members


async def enforce(gateway: Gateway, jobs: list[dict[str, Any]]) -> None:
    """One tick: each job (by the gateway's own record of who submitted it) of an entry removed
    with `--stop-jobs` and not yet given a reason."""
    gone = gateway.members.gone()
    if not any(entry.stop_jobs for entry in gone.entries):
        return
    for job in jobs:
        key = job.get("submission_id")
        if not key:
            continue
        removed = gone.by_id(gateway.usage.member_id_of(key))
        record = gateway.usage.jobs.get(key)
        if removed is None or not removed.stop_jobs or (record and record.stopped_reason):
            continue
        if job.get("status") in stops.ACTIVE:
            await stops.stop(gateway, key, by="owner", reason=REASON)
        elif job.get("status") == "STOPPED" and _ended_after(job, removed.removed):
            # Stopped by the owner's command, straight through Ray: the reason is ours to record.
            gateway.usage.note(key, stopped_by="owner", stopped_reason=REASON,
                               stop_requested=time.time(), stop_confirmed=None)
            gateway.audit.write(who="owner", method="STOP", path=gt.job_path(key, "/stop"),
                                job=key, reason=REASON, status=200)


def _ended_after(job: dict[str, Any], removed: str) -> bool:
    """A job that ended at or after the removal (Ray's end_time, ms): not one that ended before."""
    import datetime as dt

    try:
        since = dt.datetime.fromisoformat(removed).timestamp()
    except ValueError:
        return False
    return float(job.get("end_time") or 0) / 1000 >= since - 1
