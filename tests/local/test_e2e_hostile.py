"""A member who attacks a shared local cluster: with stock Ray only, from their own home, against
the real gateway over TLS (one cluster for the module; each test stands alone; the token's
rotation, which restarts Ray, last).

What a member's job can do inside the cluster is docs/concepts/sharing.md's to say; what is
checked here is what the gateway and the cluster's stops guarantee from outside."""

from __future__ import annotations

import base64
import json
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from infra.node import autodown
from tests.conftest import ROOT
from tests.local.test_e2e_sharing import Member, Shared, shared_cluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

#: 14.4 s: the hostile job is past it soon after it starts; the leaving job's 2 seconds are well
#: within it, its actor's life is not.
MAX_JOB_HOURS = 0.004
HOSTILE = str(ROOT / "tests" / "data" / "hostile_job.py")
#: Starts an unnamed detached actor (no name to kill it by) that holds a CPU of the cluster's,
#: then ends. Held, not spun: the reservation is what is charged and reaped (a spinning loop
#: would take one of CI's two cores for the actor's whole life, and prove nothing more).
LEAVER = """
import ray, time
ray.init()
@ray.remote(num_cpus=1)
class Holder:
    def ping(self):
        return 1
    def hold(self):
        time.sleep(3600)
holder = Holder.options(lifetime="detached").remote()
ray.get(holder.ping.remote())
holder.hold.remote()
print("JOBID", ray.get_runtime_context().get_job_id(), flush=True)
time.sleep(1)
"""


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory, "hst", "max_running_jobs_per_member: 3",
                        f"max_job_hours: {MAX_JOB_HOURS}") as cluster:
        yield cluster


def _member(shared: Shared, name: str) -> Member:
    return shared.members.get(name) or shared.add(name)


def _logs(member: Member, job: str, wanted: str) -> str:
    return member.logged(job, wanted)


#: The owner's direct address of each module cluster (by spec), asked of `invoke env` once: an
#: `invoke` a poll is 1-2 s of CPU. `up` keeps a local cluster's dashboard port.
_ADDRESSES: dict[str, str] = {}


def _owner_address(shared: Shared) -> str:
    if str(shared.spec) not in _ADDRESSES:
        printed = shared.invoke("env")
        assert printed.returncode == 0, printed.stdout + printed.stderr
        _ADDRESSES[str(shared.spec)] = printed.stdout.split("RAY_API_SERVER_ADDRESS=")[1].split()[0]
    return _ADDRESSES[str(shared.spec)]


def _owner_ray(shared: Shared, path: str) -> requests.Response:
    """Ray's dashboard itself, as the owner reaches it (here: directly; elsewhere their tunnel)."""
    return requests.get(_owner_address(shared) + path, timeout=30,
                        headers={"Authorization": f"Bearer {shared.cluster_token().strip()}"})


def test_the_ray_token_a_job_prints_in_any_form_opens_nothing_at_the_gateway(
        shared: Shared) -> None:
    mallory = _member(shared, "mallory")
    job = mallory.submit(
        "python -c \"import os,base64; t=open(os.environ['RAY_AUTH_TOKEN_PATH']).read().strip();"
        " print('R=' + t[::-1]); print('B=' + base64.b64encode(t.encode()).decode());"
        " print('P=' + t[:6])\"")
    printed = _logs(mallory, job, "B=")
    reversed_token = re.search(r"R=(\w+)", printed).group(1)  # type: ignore[union-attr]
    stolen = reversed_token[::-1]
    assert base64.b64encode(stolen.encode()).decode() in printed  # the whole token got out
    for headers in ({"Authorization": f"Bearer {stolen}"}, {"X-Ray-Authorization": stolen},
                    {"Cookie": f"ray-authentication-token={stolen}"}):
        answer = requests.get(mallory.env["RAY_API_SERVER_ADDRESS"] + "/api/jobs/",
                              headers=headers, verify=mallory.env["REQUESTS_CA_BUNDLE"], timeout=30)
        assert answer.status_code == 403 and "unknown or revoked token" in answer.text


def test_a_job_that_will_not_stop_is_gone_past_max_job_hours_with_its_detached_actor(
        shared: Shared) -> None:
    oscar = _member(shared, "oscar")
    # The supervisor's own stop timing is not a member's to set.
    refused = oscar.ray("submit", "--no-wait", "--runtime-env-json",
                        json.dumps({"env_vars": {"RAY_JOB_STOP_WAIT_TIME_S": "1000000000"}}),
                        "--", sys.executable, HOSTILE)
    assert refused.returncode != 0
    assert "RAY_JOB_STOP_WAIT_TIME_S" in refused.stdout + refused.stderr
    job = oscar.submit(f"{sys.executable} {HOSTILE}")
    printed = _logs(oscar, job, "JOBID")
    keeper = int(re.search(r"KEEPER (\d+)", printed).group(1))  # type: ignore[union-attr]
    job_hex = re.search(r"JOBID (\w+)", printed).group(1)  # type: ignore[union-attr]
    started = time.monotonic()

    def gone() -> bool:
        status = oscar.get(f"/api/jobs/{job}").json()["status"]
        actors = _owner_ray(shared, "/api/v0/actors?filter_keys=job_id&filter_predicates=%3D"
                                    f"&filter_values={job_hex}").json()["data"]["result"]["result"]
        return status == "STOPPED" and all(a["state"] == "DEAD" for a in actors) \
            and not psutil.pid_exists(keeper)

    wait_until(gone, "the job stopped and its detached actor dead", timeout=MAX_JOB_HOURS * 3600 + 90,
               interval=1)
    assert time.monotonic() - started < MAX_JOB_HOURS * 3600 + 60
    record = oscar.get(f"/api/jobs/{job}").json()
    assert "ran past sharing.max_job_hours" in record["message"]
    # The gateway's audit log says who stopped it (the gateway, not a member or the owner).
    audit = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem / "audit.log"
    assert any(json.loads(line).get("job") == job and json.loads(line).get("who") == "gateway"
               for line in audit.read_text().splitlines())


def test_a_name_added_again_is_another_member_who_sees_none_of_the_old_jobs(
        shared: Shared) -> None:
    first = _member(shared, "sam")
    job = first.submit("python -c print(1)")
    removed = shared.invoke("member-remove", "sam")
    assert removed.returncode == 0, removed.stderr
    # The owner sets the old bundle aside (member-add never writes over one), and so does sam.
    del shared.members["sam"]
    for old in (shared.folder / "sam.json", shared.folder / "home-sam"):
        old.rename(old.with_name(f"{old.name}.removed"))
    again = shared.add("sam")
    listed = again.get("/api/jobs/")
    assert listed.status_code == 200 and listed.json() == []
    assert again.get(f"/api/jobs/{job}").status_code == 404
    assert again.get(f"/api/jobs/{job}/logs").status_code == 404
    assert again.ray("stop", job).returncode != 0


def test_a_self_ending_jobs_detached_actor_is_charged_and_reaped_past_the_members_limit(
        shared: Shared) -> None:
    """What a member's job leaves behind: a job that ends by itself after starting a detached
    actor that holds a CPU. The actor is charged to the member while it lives and reaped within
    30 s of the member's limit (`max_job_hours`, measured from the job's start); then autodown's
    own check finds the cluster idle (gateway_leftovers.py)."""
    lea = _member(shared, "lea")
    job = lea.submit(f"{sys.executable} -c '{LEAVER}'")
    record = wait_until(lambda: (lambda r: r if r.get("status") == "SUCCEEDED" else None)(
        lea.get(f"/api/jobs/{job}").json()), f"job {job} to end by itself", timeout=120)
    job_hex, started = record["job_id"], record["start_time"] / 1000
    assert record["end_time"] / 1000 - started < MAX_JOB_HOURS * 3600  # it ended in time

    def actors() -> list[dict[str, object]]:
        return _owner_ray(shared, "/api/v0/actors?filter_keys=job_id&filter_predicates=%3D"
                                  f"&filter_values={job_hex}").json()["data"]["result"]["result"]

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
    token = Path(shared.env["RAYFLEET_HOME"]) / "keys" / shared.spec.stem / "ray-token"
    wait_until(lambda: autodown.busy_reasons(_owner_address(shared), str(token)) == [],
               "autodown's check to find the cluster idle", timeout=60)


def test_rotate_token_refuses_the_old_token_everywhere_and_members_keep_working(
        shared: Shared) -> None:
    pat = _member(shared, "pat")
    old = shared.cluster_token().strip()
    assert _owner_ray(shared, "/api/jobs/").status_code == 200
    unconfirmed = shared.invoke("rotate-token")
    assert unconfirmed.returncode != 0 and "--yes" in unconfirmed.stderr
    assert shared.cluster_token().strip() == old
    rotated = shared.invoke("rotate-token", "--yes")
    assert rotated.returncode == 0, rotated.stdout + rotated.stderr
    assert "old one is refused everywhere" in rotated.stdout
    new = shared.cluster_token().strip()
    assert new != old
    address = shared.invoke("env").stdout.split("RAY_API_SERVER_ADDRESS=")[1].split()[0]
    stale = requests.get(address + "/api/jobs/", headers={"Authorization": f"Bearer {old}"},
                         timeout=30)
    assert stale.status_code in (401, 403)
    assert _owner_ray(shared, "/api/jobs/").status_code == 200
    # The member's own token did not change, and reaches the restarted Ray through the gateway.
    job = pat.submit("python -c \"print('AFTER-' + 'ROTATE')\"")
    assert "AFTER-ROTATE" in _logs(pat, job, "AFTER-ROTATE")
    assert Path(pat.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip() not in (old, new)
