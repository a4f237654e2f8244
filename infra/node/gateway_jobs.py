"""The gateway's job routes: submit, list, read, stop and delete, each member only their own.

Who a job is comes from the gateway's own record, made at a member's submit under their random
member id (gateway_state.Usage): Ray's job metadata is shown, never believed, since code inside
the cluster can set it on the jobs it starts. A job of another member is answered as Ray answers
a job that does not exist, so the stock CLI says so instead of blaming the member's token; so is
an answer of Ray's about another job than the one asked for (`verified`: Ray reads an id as a Ray
job id first), and a job is acted on only by the id Ray's answer was checked for. The
gateway's class (gateway.py) takes these routes in; split out to keep each file one concern.
Ray and what Ray brings only.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from infra.node import gateway_state as gs
from infra.node import gateway_stops as stops
from infra.node import gateway_submit as gm
from infra.node import gateway_target as gt
from infra.node import gateway_usage_view as uv
from infra.node.gateway_upstream import Upstream

_ACTIVE = ("PENDING", "RUNNING")
#: What a member may do to a job of theirs: (path after its id, method).
_MEMBER_ACTIONS = (("", "GET"), ("", "DELETE"), ("/logs", "GET"), ("/logs/tail", "GET"),
                   ("/stop", "POST"))


def reply(status: int, text: str) -> Any:
    """One line of plain text with `status`."""
    from aiohttp import web

    return web.Response(status=status, text=text + "\n")


def job_key(job: dict[str, Any]) -> str:
    return str(job.get("submission_id") or job.get("job_id"))


def submission_of(job: dict[str, Any]) -> str | None:
    """A job's submission id; None for a driver started inside the cluster, which is never a
    member's (a record's id is a submission id, never a Ray job id: gateway_target)."""
    submission = job.get("submission_id")
    return submission if isinstance(submission, str) and submission else None


class JobRoutes(Upstream):
    """Mixed into the gateway: what these routes read of it is declared here."""

    config: Any
    usage: gs.Usage
    audit: gs.Audit
    members: gs.Members
    locks: dict[str, asyncio.Lock]
    ticked: bool
    _jobs_raw: bytes | None
    _rendered: dict[str, str]
    _rendered_for: tuple[bytes | None, int]

    async def forward(self, request: Any, who: gs.Member, target: gt.Target,
                      body: bytes | None = None) -> Any:
        raise NotImplementedError

    async def tail(self, request: Any, who: gs.Member, job_id: str) -> Any:
        raise NotImplementedError

    def scrub(self, text: str) -> str:
        raise NotImplementedError

    def scrub_bytes(self, data: bytes) -> bytes:
        raise NotImplementedError

    async def submit(self, request: Any, who: gs.Member) -> tuple[Any, str | None]:
        try:
            body = await request.json()
        except ValueError:
            return reply(400, "the job submission is not JSON"), None
        if not isinstance(body, dict):
            return reply(400, "the job submission is not a JSON object"), None
        try:
            job, body = gm.prepare(body, who, self.usage.recorded,
                                   may_pip=self.config.members_may_pip)
        except gm.Refused as exc:
            return reply(400, str(exc)), None
        lock = self.locks.setdefault(who.id, asyncio.Lock())
        async with lock:  # two submits at once must not both slip under the cap
            refused_answer = self.over_budget(who) or await self.over_cap(who)
            if refused_answer is not None:
                return refused_answer, None
            answer = await self.forward(request, who, gt.Target("/api/jobs/"),
                                        body=json.dumps(body).encode())
            if answer.status == 200:  # under the lock: the next submit's cap check counts it
                self.usage.note(job, member=who.name, member_id=who.id, submitted=gs.now_iso(),
                                **uv.submit_note(self, who))  # near their budget: told
                # At once, not at the next tick: who submitted what is the one record of it, and
                # the owner's `member-remove --stop-jobs` reads it from the file.
                self.usage.save()
        return answer, job

    def over_budget(self, who: gs.Member) -> Any:
        """The refusal when the cluster or `who` spent their budget (the gateway's own usage,
        which outlives restarts and heads), else None."""
        config = self.config
        accrued = self.usage.cluster.accrued_usd
        if config.budget_usd is not None and accrued >= config.budget_usd:
            return reply(429, f"the cluster has spent ${accrued:.2f} of its budget "
                              f"(sharing.budget_usd ${config.budget_usd:g}): no new jobs; ask "
                              "the cluster's owner")
        # Per person per term: their earlier entries (removed, then added again) count too.
        hours, usd = self.usage.spent(*self.members.person_ids(who))
        if config.member_budget_hours is not None and hours >= config.member_budget_hours:
            return reply(429, f"member {who.name} has used {hours:.2f} job-hours of their budget "
                              f"(sharing.member_budget_hours {config.member_budget_hours:g}); "
                              "ask the cluster's owner for more")
        if config.member_budget_usd is not None and usd >= config.member_budget_usd:
            return reply(429, f"member {who.name} has used ${usd:.2f} of their budget "
                              f"(sharing.member_budget_usd ${config.member_budget_usd:g}); "
                              "ask the cluster's owner for more")
        return None

    async def over_cap(self, who: gs.Member) -> Any:
        """The refusal when `who` is at the running-jobs cap, else None.

        Ray's job list is asked only when the gateway's own records allow `who` to be at the cap:
        after a tick has recorded every member job, fewer possibly-active jobs there than the cap
        is proof enough, and a submit then costs Ray one call, as it does without the gateway."""
        cap = self.config.max_running_jobs_per_member
        # An ended job whose actors the last two ticks saw alive holds a slot, as if it ran on.
        lingering = self.usage.lingering(who.id, (time.time() - 2 * self.config.poll_seconds)
                                         * 1000)
        if self.ticked and self.usage.maybe_active(who.id) + len(lingering) < cap:
            return None
        status, jobs = await self.ray_jobs()
        if status != 200:
            return reply(502, f"the cluster's job API answered {status}; try again")
        running = [j for j in jobs if self.owns(who, j) and j.get("status") in _ACTIVE]
        if len(running) + len(lingering) >= cap:
            left = f" (of them {len(lingering)} ended, their actors still alive)" \
                if lingering else ""
            return reply(429, f"member {who.name} has {len(running) + len(lingering)} pending or "
                               f"running jobs{left}, the cluster's cap "
                               f"(sharing.max_running_jobs_per_member) is {cap}; wait for one "
                               "to end or stop one")
        return None

    def mine(self, who: gs.Member, job_id: str) -> bool:
        return who.sees_all or self.usage.member_id_of(job_id) == who.id

    def owns(self, who: gs.Member, job: dict[str, Any]) -> bool:
        """`job` of Ray's list is `who`'s: by its submission id in the gateway's record (a
        driver's Ray job id names no member's job, whatever a record's id looks like)."""
        submission = submission_of(job)
        return who.sees_all or (submission is not None and
                                self.usage.member_id_of(submission) == who.id)

    async def list_jobs(self, request: Any, who: gs.Member) -> Any:
        from aiohttp import web

        status, jobs = await self.ray_jobs()
        if status != 200:
            return reply(status, f"the cluster's job API answered {status}")
        if self._rendered_for != (self._jobs_raw, self.usage.version):
            self._rendered, self._rendered_for = {}, (self._jobs_raw, self.usage.version)
        viewer = "*" if who.sees_all else who.id  # "*" is no member id
        text = self._rendered.get(viewer)
        if text is None:
            visible = [self.with_reason(j) for j in jobs if self.owns(who, j)]
            text = self._rendered[viewer] = self.scrub(json.dumps(visible))
        return web.Response(status=200, content_type="application/json", text=text)

    def with_reason(self, job: dict[str, Any]) -> dict[str, Any]:
        reason = self.usage.reason(job_key(job)) or uv.message(self.usage, job)
        return {**job, "message": reason} if reason else job

    async def job_action(self, request: Any, who: gs.Member, job_id: str, action: str) -> Any:
        from aiohttp import web

        if not self.mine(who, job_id):
            # As Ray answers a job that does not exist: the stock CLI then says so, instead of
            # Ray's paragraph about an invalid token.
            return reply(404, f"Job {job_id} does not exist")
        method = request.method
        if (action, method) not in _MEMBER_ACTIONS:
            return reply(403, f"{method} /api/jobs/{job_id}{action} is not open to members")
        job, refused = await self.verified(who, job_id)
        if job is None:
            return refused
        # Acted on by the id Ray answered for, the one just checked: never by what was asked.
        key = submission_of(job) or job_id
        record = self.usage.jobs.get(key)
        if record is not None and job.get("job_id") and record.ray_job_id != job["job_id"]:
            # Before a DELETE makes Ray forget the driver: what the job leaves behind is found by
            # its Ray job id (gateway_leftovers.py), even when no tick listed it yet.
            self.usage.note(key, ray_job_id=job["job_id"])
        if action == "":
            if method == "GET":
                return web.Response(status=200, content_type="application/json",
                                    text=self.scrub(json.dumps(self.with_reason(job))))
            return await self.forward(request, who, gt.Target(gt.job_path(key)))
        if action == "/logs/tail":
            return await self.tail(request, who, key)
        if action == "/stop":
            return await self.stop_verified(who, key)
        return await self.forward(request, who, gt.Target(gt.job_path(key, action)))

    async def verified(self, who: gs.Member, job_id: str) -> tuple[dict[str, Any] | None, Any]:
        """Ray's answer about `job_id` when it is about the job asked for, with None; else None
        and the answer to give. Ray reads an id first as a Ray job id (8 hex digits, a driver's)
        and only then as a submission id (`find_job_by_ids`): a member's job is the one whose
        submission id is the id their record holds, and any other answer is, to them, a job that
        does not exist. Admins and the owner, who may act on every job, take Ray's reading."""
        status, job = await self.upstream_json("GET", gt.job_path(job_id))
        if status != 200 or not isinstance(job, dict):
            return None, reply(status if status != 200 else 502, f"Job {job_id} does not exist")
        if not who.sees_all and submission_of(job) != job_id:
            return None, reply(404, f"Job {job_id} does not exist")
        return job, None

    async def stop_action(self, who: gs.Member, job_id: str) -> Any:
        """The owner's stop (their other job requests go to Ray as they are): resolved as Ray
        resolves `job_id`, then stopped and followed by the submission id Ray answered with, so
        that the stop is recorded on, and followed for, the job it stopped."""
        job, refused = await self.verified(who, job_id)
        if job is None:
            return refused
        return await self.stop_verified(who, submission_of(job) or job_id)

    async def stop_verified(self, who: gs.Member, job_id: str) -> Any:
        from aiohttp import web

        by = "the owner" if who.role == "owner" else f"{who.role} {who.name}"
        status, raw = await stops.stop(self, job_id, by=who.name,
                                       reason=f"stopped by {by} through the gateway")
        return web.Response(status=status, body=self.scrub_bytes(raw),
                            content_type="application/json")
