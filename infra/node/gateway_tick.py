"""The sharing gateway's tick (infra/node/gateway.py): every `poll_seconds` on the head, Ray's job
list into the usage, then every rule that stops jobs (hours, budget, removed members, leftovers)
and the log streams of members who left, then the usage saved.

Mixed into the gateway as `Ticks`; what it reads of the gateway is declared here. Ray's standard
library and aiohttp only (node rule).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from infra.node import gateway_leftovers as leftovers
from infra.node import gateway_limits as gl
from infra.node import gateway_prices as gp
from infra.node import gateway_removals as removals
from infra.node import gateway_state as gs
from infra.node import gateway_stops as stops
from infra.node.gateway_upstream import Upstream


class Ticks(Upstream):
    """Mixed into the gateway: what the tick reads of it is declared here."""

    config: Any
    members: gs.Members
    usage: gs.Usage
    audit: gs.Audit
    failures: gs.FailedLogins
    ticked: bool
    _last_tick: float

    async def close_removed(self) -> None:
        raise NotImplementedError

    def scrub(self, text: str) -> str:
        raise NotImplementedError

    async def watch(self) -> None:
        """Account usage, stop member jobs past max_job_hours and every job past the cluster's
        budget, save; every `poll_seconds` for as long as the gateway runs. A tick that fails
        (whatever it raised) is said in one line and tried again at the next; while Ray does not
        answer, members get 502 and the ticks go on (what Ray ran meanwhile is caught up at the
        first tick it answers). The gateway never ends itself: its supervisor stops it."""
        gl.OWN.set(True)  # this task's calls to Ray take the gateway's own session
        self._last_tick = time.monotonic()
        away = False
        while True:
            await asyncio.sleep(self.config.poll_seconds)
            try:
                status = await self.account()
            except Exception as exc:  # no failure may end the enforcement
                print(self.scrub(f"gateway: a tick failed ({type(exc).__name__}: {exc!s:.200}); "
                                 f"trying again in {self.config.poll_seconds:g} s"), flush=True)
                continue
            if (status != 200) != away:
                away = status != 200
                print(f"gateway: Ray's dashboard at {self.config.upstream} answered {status}"
                      + ("; members get 502 until it answers, ticks go on" if away else
                         " again; ticks catch up"), flush=True)

    async def account(self, enforce: bool = True) -> int:
        """One tick: Ray's job list into the usage (each member job's times, the cost since the
        last tick), member jobs past max_job_hours stopped (`enforce`), saved. Returns the
        status of Ray's answer; not 200: nothing accounted, the time counts at the next tick."""
        try:
            status, jobs = await self.ray_jobs()
        except Exception:  # any failure to reach Ray counts as Ray being away
            return 0
        if status != 200:
            return status
        now = time.monotonic()
        self.usage.tick(jobs, now - self._last_tick, await self.hourly_price())
        self.ticked = True
        self._last_tick = now
        if not enforce:
            self.usage.save()
            return status
        try:  # saved whatever enforcement raises (the tick's caller says what)
            await stops.enforce_hours(self, jobs, self.config.max_job_hours)
            await stops.enforce_budget(self, jobs, self.config.budget_usd)
            await removals.enforce(self, jobs)
            await stops.follow(self, jobs)
            await leftovers.enforce(self, jobs)
            await self.close_removed()
            self.failures.prune()
        finally:
            self.usage.save()
        return status

    async def hourly_price(self) -> float:
        """The cluster's $/h now: its nodes at their types' prices (gateway_prices.py); the
        fixed price when there are no type prices or Ray names no nodes."""
        if not self.config.node_prices:
            return self.config.price_per_hour
        status = await self.answer_or_none(gp.STATUS_PATH)
        # Ray's v2 autoscaler reports nothing there: then its GCS node table.
        nodes = (await self.answer_or_none(gp.NODES_PATH)
                 if gp.report_counts(status, time.time()) is None else None)
        return gp.cluster_hourly(status, nodes, self.config.node_prices, self.config.head_type,
                                 self.config.price_per_hour, time.time())

    async def answer_or_none(self, path: str) -> Any:
        try:
            status, answer = await self.upstream_json("GET", path)
        except Exception:  # Ray not answering: this tick without that source
            return None
        return answer if status == 200 else None
