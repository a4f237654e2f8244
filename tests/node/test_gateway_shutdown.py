"""The gateway stopping (teardown, its supervisor): its last tick reaches the usage that outlives
the head. Against a loopback server answering Ray's job list as a real head answered it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from infra.node import gateway_files as gf
from infra.node import gateway_state as gs
from infra.node.gateway import Gateway
from infra.node.gateway_config import Config

#: A member's finished job as Ray's `GET /api/jobs/` lists it (times in ms).
FINISHED = {"submission_id": "raysubmit_pia1", "job_id": "02000000", "status": "SUCCEEDED",
            "entrypoint": "python -c print(4)", "start_time": 1_764_000_000_000,
            "end_time": 1_764_000_001_325, "metadata": {"rayfleet_member": "pia"}}


async def _stop_before_any_tick(data_dir: Path) -> list[str]:
    from aiohttp import web

    asked: list[str] = []

    async def jobs(request: Any) -> Any:
        asked.append(request.path)
        return web.json_response([FINISHED])

    upstream = web.Application()
    upstream.router.add_get("/api/jobs/", jobs)
    runner = web.AppRunner(upstream)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        # A tick every hour: none comes before the stop, as when teardown follows a short job.
        gateway = Gateway(Config(cluster="class", host="127.0.0.1", port=0,
                                 upstream=f"http://127.0.0.1:{port}", token_path=None, cert="",
                                 key="", data_dir=str(data_dir), poll_seconds=3600))
        gateway.usage.note("raysubmit_pia1", member="pia")  # what its submit recorded
        gateway.usage.save()
        await gateway.start()
        await gateway.shutdown()
    finally:
        await runner.cleanup()
    return asked


def test_a_stopped_gateway_keeps_the_hours_of_a_job_that_ended_since_its_last_tick(
        tmp_path: Path) -> None:
    asked = asyncio.run(_stop_before_any_tick(tmp_path))
    assert asked == ["/api/jobs/"]
    entry = json.loads((tmp_path / gs.USAGE_FILE).read_text())["jobs"]["raysubmit_pia1"]
    assert entry["member"] == "pia" and entry["status"] == "SUCCEEDED"
    assert gs.job_hours(gf.JobRecord.from_dict(entry)) == \
        (FINISHED["end_time"] - FINISHED["start_time"]) / 3.6e6
