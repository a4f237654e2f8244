"""The arithmetic of the gateway's usage (gateway_state.Usage): when each job ran within a tick,
how much of the cluster it held, and how a tick's cost is split by that.

How a tick's cost is split: every stretch of time is split among the jobs present in it in
proportion to their *weight*, the resources each holds in CPU-equivalents (`units`):
- what its submission reserved for the driver (`entrypoint_num_cpus`, `_num_gpus`, `_memory`,
  `_resources` of Ray's job record), plus what its live actors hold (`required_resources`; an
  actor inside a placement group counts through the group) and its placement groups reserve
  (their bundles), from the gateway's survey of Ray's state API (gateway_leftovers.py);
- 1 CPU = 1, 1 GPU = 16, 1 TPU chip = 16, 1 GiB of memory = 1/4; other custom resources 0. A GPU
  or TPU hour costs a cloud tens of vCPU-hours, so 16 is a floor, not a price list;
- at least 1: a driver runs whether or not it reserved anything. Plain tasks (not actors, not in
  a placement group) are not counted: Ray lists them only at a price per tick the gateway does not
  pay.
A job is present while Ray says it runs, and, after its end, while actors or placement groups of
its Ray job id are alive (its *leftovers*): those are charged to it as if it ran.
Standard library only (node rule).
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from infra.node.gateway_files import JobRecord

#: Ray's final job states (a job in one never runs again), and the gateway's own for a job Ray no
#: longer lists (deleted): its hours and cost were closed when the gateway found it gone.
FINISHED = ("SUCCEEDED", "FAILED", "STOPPED", "DELETED")
ACTIVE = ("PENDING", "RUNNING")
#: CPU-equivalents of one unit of each resource Ray names (memory: per byte).
WEIGHTS = {"CPU": 1.0, "GPU": 16.0, "TPU": 16.0, "memory": 0.25 / 2 ** 30}
#: Every present job weighs at least this much (its driver).
MIN_WEIGHT = 1.0


def key(job: dict[str, Any]) -> str:
    """A job's key in the usage: its submission id, else its Ray job id (a plain driver)."""
    return str(job.get("submission_id") or job.get("job_id"))


def units(resources: Any) -> float:
    """`resources` (Ray's {name: amount}) in CPU-equivalents by WEIGHTS; anything else 0."""
    if not isinstance(resources, dict):
        return 0.0
    total = 0.0
    for name, amount in resources.items():
        if isinstance(amount, int | float) and amount > 0:
            total += WEIGHTS.get(str(name), 0.0) * float(amount)
    return total


def entrypoint_units(job: dict[str, Any]) -> float:
    """What a submission reserved for its driver, in CPU-equivalents."""
    reserved = dict(job.get("entrypoint_resources") or {}) \
        if isinstance(job.get("entrypoint_resources"), dict) else {}
    for name, field in (("CPU", "entrypoint_num_cpus"), ("GPU", "entrypoint_num_gpus"),
                        ("memory", "entrypoint_memory")):
        if isinstance(job.get(field), int | float):
            reserved[name] = job[field]
    return units(reserved)


def presence(jobs: list[dict[str, Any]], since: float, until: float,
             lingering: frozenset[str] = frozenset()) -> dict[str, tuple[float, float]]:
    """When each job ran within [since, until] (epoch seconds), from Ray's own record: a job
    running now, from its start (Ray's `start_time`, ms) or `since`; a finished one, from its
    start to its `end_time` when that falls inside. A running job without times ran throughout;
    a pending one, and a finished one without times, not at all. A job whose key is in
    `lingering` (its leftovers alive) counts as running."""
    found: dict[str, tuple[float, float]] = {}
    for job in jobs:
        start, end = job.get("start_time"), job.get("end_time")
        begin = max(since, start / 1000) if isinstance(start, int | float) else since
        if job.get("status") == "RUNNING" or key(job) in lingering:
            stop = until
        elif job.get("status") in FINISHED and isinstance(end, int | float) and start is not None:
            stop = min(until, end / 1000)
        else:
            continue
        if stop > begin:
            found[key(job)] = (begin, stop)
    return found


def split_cost(present: dict[str, tuple[float, float]], since: float, until: float,
               price_per_hour: float, weights: dict[str, float] | None = None
               ) -> tuple[dict[str, float], float]:
    """Each job's share of [since, until] at `price_per_hour` (every stretch of time split among
    the jobs present in it by `weights`, MIN_WEIGHT for a job not named), and the idle part (no
    job present); together the whole."""
    weights = weights or {}
    edges = sorted({since, until, *(t for span in present.values() for t in span)})
    shares = dict.fromkeys(present, 0.0)
    idle = 0.0
    for left, right in itertools.pairwise(edges):
        cost = price_per_hour * (right - left) / 3600
        here = {k: max(MIN_WEIGHT, weights.get(k, MIN_WEIGHT))
                for k, (begin, stop) in present.items() if begin <= left and stop >= right}
        if not here:
            idle += cost
        total = sum(here.values())
        for k, weight in here.items():
            shares[k] += cost * weight / total
    return shares, idle


def job_hours(entry: JobRecord, now_ms: float | None = None) -> float:
    """Hours a job has run (Ray's start and end times, in ms), its leftovers' time after its end
    included (`leftover_until`: the last tick that saw them alive); 0 before it starts."""
    start = entry.start_time
    if start is None:
        return 0.0
    end = entry.end_time or now_ms or time.time() * 1000
    lingered = entry.leftover_until
    if isinstance(lingered, int | float):
        end = max(float(end), float(lingered))
    return max(0.0, (float(end) - float(start)) / 3.6e6)


def gone_records(records: dict[str, JobRecord], listed: set[str], since: float,
                 until: float) -> dict[str, dict[str, Any]]:
    """The member jobs of `records` that Ray no longer lists (deleted), each with the times to
    close it with: its last known status, start and end, the end being `until` (the tick that
    found it gone) when it was last seen running or was never seen, its status then DELETED. A
    record counts as gone only when a list could have shown it: seen in an earlier list, or noted
    before `since` (a submit noted after this tick's list was asked for is not in it yet)."""
    found: dict[str, dict[str, Any]] = {}
    for name, entry in records.items():
        if name in listed or not entry.member or entry.gone:
            continue
        noted = entry.noted_at
        seen = entry.status is not None  # only a tick sets it, from Ray's list
        if not seen and not (isinstance(noted, int | float) and noted < since):
            continue
        start, end = entry.start_time, entry.end_time
        if start is None and isinstance(noted, int | float) and not seen:
            start = noted * 1000  # never listed: from its submit
        if start is not None and not isinstance(end, int | float):
            end = until * 1000
        final = entry.status if entry.status in FINISHED else "DELETED"
        found[name] = {"submission_id": name, "status": final, "start_time": start,
                       "end_time": end, "job_id": entry.ray_job_id}
    return found
