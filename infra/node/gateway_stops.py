"""Every stop the cluster makes, followed until it took: the job ended, its actors gone.

Ray's stop sends the job's driver SIGTERM, then SIGKILL to it and every process under it after
RAY_JOB_STOP_WAIT_TIME_S (3 s), a value Ray's supervisor reads from the job's own environment,
which is why members may not set it (gateway.py). A stop the gateway asks for (a member's, an
admin's, the owner's through the gateway, `max_job_hours`) is recorded with who and why; at each
tick the gateway checks it:
- the job still runs GRACE_S after the stop: the stop is sent again and the job's supervisor actor
  is killed, which SIGKILLs the driver's process group (Ray's own parent-death watch);
- the job has ended: its actors still alive (detached ones outlive a job) are killed and its
  placement groups removed, once, by the reaper below.
What a job that ended by itself left alive is gateway_leftovers.py's: charged to its member, and
reaped by the same reaper once the member is past a limit.
Ray offers no HTTP call that kills an actor or removes a placement group, so the reaper is a
short Ray job of the gateway's own (it runs as Ray's user inside the cluster, like the job it
cleans up after). What no stop reaches: processes a job detached from its own tree (a double
fork) — docs/concepts/sharing.md says so. Ray and what Ray brings only.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from typing import Any, Protocol

from infra.node import gateway_state as gs
from infra.node import gateway_target as gt


class Gateway(Protocol):
    """What of the gateway (gateway.py) a stop uses; the gateway passes itself."""

    usage: gs.Usage
    audit: gs.Audit

    async def upstream_raw(self, method: str, path: str, query: str = "") -> tuple[int, bytes]: ...

    async def upstream_post_json(self, path: str, body: dict[str, Any]) -> tuple[int, bytes]: ...

#: Seconds after a stop before the gateway makes sure of it (Ray's own SIGKILL comes at 3 s).
GRACE_S = 15.0
#: Ray's job states in which a job's driver may still run.
ACTIVE = ("PENDING", "RUNNING")
#: The reaper's program: argv[1] the Ray job ids (hex) whose actors and placement groups go,
#: comma-separated, argv[2] a submission id, argv[3] "1" when that submission's supervisor actor
#: is to be killed first. An actor is killed through the GCS by its id (named or not, pending or
#: alive, never restarted); where that call fails (a Ray without it), by name where it has one,
#: else its worker process is ended on its node.
REAPER = r"""
import os, signal, sys, ray
from ray.util import state
from ray.util.placement_group import PlacementGroup, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy
jobs, submission = [j for j in sys.argv[1].split(",") if j], sys.argv[2]
supervisor = sys.argv[3] == "1"
ray.init(address="auto", log_to_driver=False)
if supervisor:
    try:
        ray.kill(ray.get_actor("_ray_internal_job_actor_" + submission,
                               namespace="SUPERVISOR_ACTOR_RAY_NAMESPACE"), no_restart=True)
    except ValueError:
        pass
def by_id(actor_id):
    try:
        from ray._private.grpc_utils import init_grpc_channel
        from ray.core.generated import gcs_service_pb2 as pb, gcs_service_pb2_grpc as rpc
        gcs = rpc.ActorInfoGcsServiceStub(init_grpc_channel(ray.get_runtime_context().gcs_address))
        return gcs.KillActorViaGcs(pb.KillActorViaGcsRequest(
            actor_id=bytes.fromhex(actor_id), force_kill=True, no_restart=True),
            timeout=30).status.code == 0
    except Exception:
        return False
@ray.remote(num_cpus=0)
def end(pid):
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
for job in jobs:
    for actor in state.list_actors(filters=[("job_id", "=", job)], limit=10000, detail=True):
        if actor.state == "DEAD" or by_id(actor.actor_id):
            continue
        if actor.name:
            try:
                ray.kill(ray.get_actor(actor.name, namespace=actor.ray_namespace), no_restart=True)
                continue
            except ValueError:
                pass
        if actor.pid and actor.node_id:
            strategy = NodeAffinitySchedulingStrategy(actor.node_id, soft=False)
            ray.get(end.options(scheduling_strategy=strategy).remote(actor.pid))
    for group in state.list_placement_groups(filters=[("creator_job_id", "=", job)], limit=10000):
        if group.state != "REMOVED":
            remove_placement_group(PlacementGroup(
                ray.PlacementGroupID(bytes.fromhex(group.placement_group_id))))
print("reaped", ",".join(jobs) or submission)
"""


async def stop(gateway: Gateway, job_id: str, by: str, reason: str) -> tuple[int, bytes]:
    """Ask Ray to stop `job_id`, and record who asked and why, to be followed (`follow`)."""
    status, raw = await gateway.upstream_raw("POST", gt.job_path(job_id, "/stop"))
    if status == 200:
        gateway.usage.note(job_id, stopped_by=by, stopped_reason=reason,
                           stop_requested=time.time(), stop_confirmed=None)
        gateway.audit.write(who=by, method="STOP", path=gt.job_path(job_id, "/stop"),
                            job=job_id, reason=reason, status=status)
    return status, raw


async def follow(gateway: Gateway, jobs: list[dict[str, Any]]) -> None:
    """One tick's check of every stop not yet confirmed (see the module's text)."""
    by_key = {str(j.get("submission_id") or j.get("job_id")): j for j in jobs}
    for key, entry in gateway.usage.pending_stops():
        job = by_key.get(key)
        if job is None:  # deleted from Ray's list: nothing of it to follow
            gateway.usage.note(key, stop_confirmed=time.time())
            continue
        if job.get("status") in ACTIVE:
            waited = time.time() - float(entry.stop_requested or 0)  # set: a pending stop
            if waited > GRACE_S and not entry.stop_forced:
                await gateway.upstream_raw("POST", gt.job_path(key, "/stop"))
                await reap(gateway, job, supervisor=True)
                gateway.usage.note(key, stop_forced=time.time())
            continue
        if await leftovers(gateway, str(job.get("job_id") or "")):
            await reap(gateway, job, supervisor=False)
        gateway.usage.note(key, stop_confirmed=time.time())


async def leftovers(gateway: Gateway, job_hex: str) -> bool:
    """Whether Ray's state API lists an actor of the job still alive or a placement group of it
    not removed (asked first: the reaper is a Ray job, a few CPU-seconds, and most jobs leave
    nothing behind). When Ray cannot say, True: better a reaper for nothing than an actor kept."""
    if not re.fullmatch(r"[0-9a-f]{1,64}", job_hex):  # Ray's own ids are hex; nothing else is sent
        return False
    for path, key, gone in (("/api/v0/actors", "job_id", "DEAD"),
                            ("/api/v0/placement_groups", "creator_job_id", "REMOVED")):
        query = f"filter_keys={key}&filter_predicates=%3D&filter_values={job_hex}&limit=1000"
        try:
            status, raw = await gateway.upstream_raw("GET", path, query)
            rows = json.loads(raw)["data"]["result"]["result"]
        except Exception:  # Ray busy or an answer of another shape: reap to be sure
            return True
        if status != 200 or any(row.get("state") != gone for row in rows):
            return True
    return False


async def reap(gateway: Gateway, job: dict[str, Any], supervisor: bool) -> None:
    """Start the reaper for `job` (not waited for: the next tick sees what it did)."""
    await reap_ids(gateway, [str(job.get("job_id") or "")], str(job.get("submission_id") or ""),
                   supervisor)


async def reap_ids(gateway: Gateway, job_ids: list[str], submission: str = "",
                   supervisor: bool = False) -> int:
    """Start one reaper for the leftovers of every Ray job id in `job_ids` (and `submission`'s
    supervisor with `supervisor`); not waited for. Returns the status of Ray's answer."""
    job_ids = [j for j in job_ids if re.fullmatch(r"[0-9a-f]{1,64}", j)]  # Ray's ids are hex
    # A job's `python`: the Ray user's environment, the one Ray runs from (the gateway's own may
    # be in a home that user cannot read).
    argv = ["python", "-c", REAPER, ",".join(job_ids), submission, "1" if supervisor else "0"]
    body = {"entrypoint": shlex.join(argv),
            "metadata": {"rayfleet_reaper": submission or ",".join(job_ids)[:200]},
            "entrypoint_num_cpus": 0}
    status, _ = await gateway.upstream_post_json("/api/jobs/", body)
    return status


async def enforce_hours(gateway: Gateway, jobs: list[dict[str, Any]], limit: float | None) -> None:
    """Stop every member job (by the gateway's own record) running past `limit` hours."""
    if not limit:
        return
    for job in jobs:
        key, started = str(job.get("submission_id") or job.get("job_id")), job.get("start_time")
        member = gateway.usage.member_id_of(key)
        if member in (None, gs.OWNER_ID) or job.get("status") != "RUNNING" or not started:
            continue
        if time.time() - started / 1000 < limit * 3600:
            continue
        if gateway.usage.jobs[key].stop_requested:
            continue  # asked already: `follow` makes sure of it
        await stop(gateway, key, by="gateway", reason=(
            f"stopped by the cluster: it ran past sharing.max_job_hours ({limit:g} h)"))


async def enforce_budget(gateway: Gateway, jobs: list[dict[str, Any]], budget: float | None) -> None:
    """Once the cluster's accrued cost reaches `budget`: the moment is recorded (it outlives
    restarts in the usage), and every submitted job still pending or running is stopped,
    whoever's, and followed like any stop. New jobs are refused at submit; the cluster then is idle, and its
    autodown watcher takes it down as it does any idle cluster, keeping every record."""
    if not budget:
        return
    accrued = gateway.usage.cluster.accrued_usd
    if accrued < budget:
        return
    if gateway.usage.reach_budget():
        gateway.audit.write(who="gateway", method="BUDGET", path="-", status=0,
                            reason=f"the cluster spent ${accrued:.2f} of sharing.budget_usd "
                                   f"${budget:g}")
    for job in jobs:
        # Ray's job API stops submitted jobs only: a driver started inside the cluster (no
        # submission id) is beyond its reach, and asking again at every tick would not change it.
        key = job.get("submission_id")
        if job.get("status") not in ACTIVE or not key:
            continue
        record = gateway.usage.jobs.get(key)
        if record is not None and record.stop_requested:
            continue  # asked already: `follow` makes sure of it
        await stop(gateway, key, by="gateway", reason=(
            f"stopped by the cluster: it spent its budget (sharing.budget_usd ${budget:g})"))

