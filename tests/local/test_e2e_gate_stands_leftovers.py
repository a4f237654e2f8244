"""What a member's job leaves behind, on a real shared local cluster with stock Ray: a job that ends
by itself after starting a detached actor that burns a CPU. The actor is charged to the member
while it lives and reaped within 30 s of the member's limit (`max_job_hours`, measured from the
job's start); then autodown's own check finds the cluster idle (gateway_leftovers.py)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.node import autodown
from tests.local.test_e2e_sharing import Shared, shared_cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

#: 14.4 s: the job's 2 seconds are well within it, its actor's life is not.
MAX_JOB_HOURS = 0.004
#: Starts an unnamed detached actor (no name to kill it by) that burns a CPU, then ends.
LEAVER = """
import ray, time
ray.init()
@ray.remote(num_cpus=1)
class Burner:
    def ping(self):
        return 1
    def burn(self):
        while True:
            pass
burner = Burner.options(lifetime="detached").remote()
ray.get(burner.ping.remote())
burner.burn.remote()
print("JOBID", ray.get_runtime_context().get_job_id(), flush=True)
time.sleep(1)
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory, "lft", f"max_job_hours: {MAX_JOB_HOURS}") as cluster:
        yield cluster


def _owner_get(shared: Shared, path: str) -> object:
    """Ray's dashboard itself, as the owner reaches it (here: directly)."""
    import requests

    address = shared.invoke("env").stdout.split("RAY_API_SERVER_ADDRESS=")[1].split()[0]
    answer = requests.get(address + path, timeout=30,
                          headers={"Authorization": f"Bearer {shared.cluster_token().strip()}"})
    answer.raise_for_status()
    return answer.json()


def test_a_self_ending_jobs_detached_actor_is_charged_and_reaped_past_the_members_limit(
        shared: Shared) -> None:
    lea = shared.add("lea")
    job = lea.submit(f"{sys.executable} -c '{LEAVER}'")
    record = wait_until(lambda: (lambda r: r if r.get("status") == "SUCCEEDED" else None)(
        lea.get(f"/api/jobs/{job}").json()), f"job {job} to end by itself", timeout=120)
    job_hex, started = record["job_id"], record["start_time"] / 1000
    assert record["end_time"] / 1000 - started < MAX_JOB_HOURS * 3600  # it ended in time

    def actors() -> list[dict[str, object]]:
        found = _owner_get(shared, "/api/v0/actors?filter_keys=job_id&filter_predicates=%3D"
                                   f"&filter_values={job_hex}")
        return found["data"]["result"]["result"]  # type: ignore[index]

    assert [a["state"] for a in actors()] == ["ALIVE"]  # left behind, past its job's end
    limit = started + MAX_JOB_HOURS * 3600
    wait_until(lambda: all(a["state"] == "DEAD" for a in actors()),
               "the detached actor reaped", timeout=limit + 60 - time.time(), interval=1)
    assert time.time() < limit + 30, f"reaped {time.time() - limit:.0f} s after the limit"

    folder = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem
    entry = json.loads((folder / "usage.json").read_text())["jobs"][job]
    # Charged as if the job ran while its actor lived: hours past its own end.
    assert entry["leftover_until"] > entry["end_time"] + 5000
    assert "max_job_hours" in entry["leftovers_reason"]
    audit = [json.loads(line) for line in (folder / "audit.log").read_text().splitlines()]
    assert any(line.get("method") == "REAP" and line.get("job") == job for line in audit)

    # Autodown's own check: with the actor DEAD (and the reaper's job over), nothing is busy.
    address = shared.invoke("env").stdout.split("RAY_API_SERVER_ADDRESS=")[1].split()[0]
    token = Path(shared.env["RAYFLEET_HOME"]) / "keys" / shared.spec.stem / "ray-token"
    wait_until(lambda: autodown.busy_reasons(address, str(token)) == [],
               "autodown's check to find the cluster idle", timeout=60)
