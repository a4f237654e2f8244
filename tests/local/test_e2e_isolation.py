"""`sharing.isolation: cluster` end to end on a real local cluster: two members, each with a Ray
cluster of their own behind the one gateway, with Ray's stock `ray job` CLI.

Runs as root (member users are made), in a mount namespace of its own for the module: /etc and
/home copy-on-write (the users made never reach this machine's files) and /root enterable by
others (0711, as the test bed's hosts: the tests' Python lives under /root/.pyenv, where a real
head has /usr; a member's user must run it).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import pwd
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import requests

from bench import isolation
from infra.node import member_usage
from tests.local.test_e2e_sharing import Member, Shared, shared_cluster
from tests.testbed import hosts
from tests.waiting import read_json, wait_until

pytestmark = pytest.mark.slow

ATTACK = Path(__file__).with_name("isolation_attack.py")
CLONE_NEWNS = 0x00020000
IDLE_MINUTES = 0.25


@pytest.fixture(scope="module")
def private_machine(tmp_path_factory: pytest.TempPathFactory, needs_root: None) -> Iterator[None]:
    """This process in a mount namespace of its own for the module, then back in its own."""
    libc = ctypes.CDLL(None, use_errno=True)
    own = os.open("/proc/self/ns/mnt", os.O_RDONLY)
    assert libc.unshare(CLONE_NEWNS) == 0, os.strerror(ctypes.get_errno())
    try:
        subprocess.run(["mount", "--make-rprivate", "/"], check=True)
        for argv in hosts.host_setup(tmp_path_factory.mktemp("machine")):
            subprocess.run(argv, check=True)
        yield
    finally:
        assert libc.setns(own, CLONE_NEWNS) == 0, os.strerror(ctypes.get_errno())
        os.close(own)


@pytest.fixture(scope="module")
def shared(tmp_path_factory: pytest.TempPathFactory, private_machine: None,
           real_daemon: None) -> Iterator[Shared]:
    with shared_cluster(tmp_path_factory, "iso", "isolation: cluster",
                        f"member_idle_minutes: {IDLE_MINUTES}", cpus=1) as cluster:
        cluster.fresh = True  # this process is in a mount namespace of its own meanwhile
        try:
            yield cluster
        finally:
            ids = [i for i in map(partial(member_id_or_none, cluster), cluster.members) if i]
    # The teardown stopped their clusters and kept their files, as it promises; the machine's
    # /tmp and cgroups are not the namespace's: this module's members go from them here.
    for member in ids:
        shutil.rmtree(f"/tmp/rf-m-{member}", ignore_errors=True)
        for kind in ("memory", "cpu"):
            with contextlib.suppress(OSError):
                os.rmdir(f"/sys/fs/cgroup/{kind}/rf-m-{member}")


def member_id(shared: Shared, name: str) -> str:
    found = member_id_or_none(shared, name)
    assert found, f"no member {name} in the registry"
    return found


def member_id_or_none(shared: Shared, name: str) -> str | None:
    """None once removed."""
    book = json.loads((Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem
                       / "members.json").read_text())
    entry = book["members"].get(name)
    return str(entry["id"]) if isinstance(entry, dict) and entry.get("id") else None


def processes_of(user: str) -> list[int]:
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return []
    return [int(p) for p in os.listdir("/proc") if p.isdigit()
            and _owner(p) == uid]


def _owner(pid: str) -> int | None:
    """The uid of a process of this machine's own network namespace (member clusters run there);
    None for one of a test bed's hosts, whose users are numbered apart from this machine's (a
    Lambda bed's Ray user, run side by side in CI, can have bob's uid)."""
    try:
        if os.readlink(f"/proc/{pid}/ns/net") != HERE_NET:
            return None
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


HERE_NET = os.readlink("/proc/self/ns/net")


def dashboard_port(shared: Shared, name: str) -> int:
    """The member's own dashboard, as its raylet's command line names it."""
    uid = pwd.getpwnam(f"rf-m-{member_id(shared, name)}").pw_uid
    for pid in os.listdir("/proc"):
        if pid.isdigit() and _owner(pid) == uid:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                line = f.read()
            found = re.search(rb"\x00--port=(\d+)", line) if b"dashboard.py" in line else None
            if found:
                return int(found.group(1))
    raise AssertionError(f"no dashboard process of {name}'s user")


def logs_of(member: Member, job: str, wanted: str) -> str:
    """Read over HTTP through the gateway, as `ray job logs` reads it (a CLI a poll: 2-3 CPU-s)."""
    return member.logged(job, wanted)


def test_two_members_each_reach_only_their_own_cluster(shared: Shared, tmp_path: Path) -> None:
    alice, bob = shared.add("alice"), shared.add("bob")
    marker = "BOBS-SECRET-" + os.urandom(6).hex()
    work = bob.home / "work"
    work.mkdir()
    (work / "secret.txt").write_text(marker)
    # Alice's cluster starts meanwhile (her first request starts it): the module's time.
    warming = threading.Thread(target=alice.ray, args=("list",))
    warming.start()
    # Both jobs run until the end: at load, 15 s idle between steps restarts a cluster empty.
    bobs = bob.submit(f"python -c \"print('{marker}', flush=True); import time; time.sleep(900)\"",
                      "--working-dir", str(work))
    logs_of(bob, bobs, marker)
    warming.join()
    bob_id = member_id(shared, "bob")
    bob_user = pwd.getpwnam(f"rf-m-{bob_id}")
    # Where the machine has a memory controller, every process of bob's cluster is in his cgroup.
    memory = Path(f"/sys/fs/cgroup/memory/rf-m-{bob_id}")
    if memory.parent.is_dir():
        assert int((memory / "memory.limit_in_bytes").read_text()) < 2**50
        inside = {int(x) for x in (memory / "cgroup.procs").read_text().split()}
        assert set(processes_of(bob_user.pw_name)) <= inside
    base_token = Path(shared.env["RAYFLEET_HOME"]) / "keys" / shared.spec.stem / "ray-token"
    copies = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem / "member-tokens"
    attack = tmp_path / "attack"
    attack.mkdir()
    (attack / "attack.py").write_text(ATTACK.read_text())
    alices = alice.submit(f"python attack.py /tmp/rf-m-{bob_id} {bob_user.pw_dir} "
                          f"{dashboard_port(shared, 'bob')} {marker[::-1]} {base_token} "
                          f"{copies}/{bob_id}.token && sleep 900", "--working-dir", str(attack))
    # The marker reversed on her command line: her own job's log holds that line.
    report = json.loads(logs_of(alice, alices, "REPORT ").split("REPORT ", 1)[1].splitlines()[0])
    assert int(report["tokens_found"][0]) >= 1  # at least her own token, tried on bob's cluster
    assert report["marker_in"] == [], report["marker_in"]
    assert not [p for p in report["read"] if p.startswith((f"/tmp/rf-m-{bob_id}",
                                                           bob_user.pw_dir, str(copies)))]
    assert report["signalled"] == [], report["signalled"]  # no other user's process, bob's too
    assert report["answers"] and not [a for a in report["answers"] if a.startswith("2")], \
        report["answers"]
    # Each sees only their own cluster's jobs, through the same gateway with stock Ray.
    hers, his = alice.ray("list").stdout, bob.ray("list").stdout
    assert alices in hers and bobs not in hers and bobs in his and alices not in his
    assert bob.ray("stop", alices).returncode != 0
    # The owner picks a member's cluster with the header; a member may not.
    owner = {"Authorization": f"Bearer {shared.owner_token()}", "X-Rayfleet-Member": "bob"}
    seen = requests.get(f"{bob.env['RAY_API_SERVER_ADDRESS']}/api/jobs/", headers=owner,
                        verify=bob.env["REQUESTS_CA_BUNDLE"], timeout=30)
    assert seen.status_code == 200 and bobs in seen.text and alices not in seen.text
    her_token = Path(alice.env["RAY_AUTH_TOKEN_PATH"]).read_text().strip()
    sneaky = requests.get(f"{alice.env['RAY_API_SERVER_ADDRESS']}/api/jobs/",
                          headers={"Authorization": f"Bearer {her_token}",
                                   "X-Rayfleet-Member": "bob"},
                          verify=alice.env["REQUESTS_CA_BUNDLE"], timeout=30)
    assert sneaky.status_code == 403 and bobs not in sneaky.text
    # Serve is not per member: a deploy to his own cluster is refused in one line.
    mine = {"Authorization": f"Bearer {Path(bob.env['RAY_AUTH_TOKEN_PATH']).read_text().strip()}"}
    deploy = requests.put(f"{bob.env['RAY_API_SERVER_ADDRESS']}/api/serve/applications/",
                          headers=mine, json={"applications": []},
                          verify=bob.env["REQUESTS_CA_BUNDLE"], timeout=30)
    assert deploy.status_code == 403 and "sharing.isolation: cluster" in deploy.text
    # `ray status` needs the GCS port, which the gateway does not pass; its text comes through
    # the gateway from his own cluster's dashboard (what the Cluster tab shows).
    def status_text() -> str | None:
        answer = requests.get(f"{bob.env['RAY_API_SERVER_ADDRESS']}/api/cluster_status",
                              params={"format": "1"}, headers=mine,
                              verify=bob.env["REQUESTS_CA_BUNDLE"], timeout=30)
        text = str((answer.json().get("data") or {}).get("clusterStatus") or "") \
            if answer.status_code == 200 else ""
        return text if "Node status" in text else None

    assert "/1.0 CPU" in wait_until(status_text, "bob's cluster status through the gateway",
                                       timeout=60, interval=2)
    # `members` shows his cluster running, its node time counted (an idle check every 7.5 s).
    shown = own_cluster_once_running(shared, "bob")
    assert shown.get("state") == "running" and float(shown.get("hours") or 0) > 0, shown
    bob.ray("stop", bobs), alice.ray("stop", alices)


def test_bench_cold_member_first_result_against_shared(shared: Shared, tmp_path: Path) -> None:
    """bench/isolation.py's measurement, on this module's cluster: a new member's first job
    (their cluster starts inside the time) against the owner's on the base cluster."""
    carol = shared.add("carol")

    def submit(who: Member) -> Callable[[], str]:
        def run() -> str:
            done = who.ray("submit", "--", *isolation.JOB, timeout=180)
            assert done.returncode == 0, done.stdout + done.stderr
            return done.stdout
        return run

    cold = isolation.first_result(submit(carol))
    warm = isolation.first_result(submit(carol))
    # Now, within member_idle_minutes: an idle stop ends her cluster's job history (Ray keeps
    # none across a restart without an external GCS store); her files stay.
    assert carol.ray("list").stdout.count("raysubmit_") == 2
    rss, pss = isolation.member_memory(pwd.getpwnam(f"rf-m-{member_id(shared, 'carol')}").pw_uid)
    assert rss > 50  # a Ray head of carol's own runs as her user
    token = tmp_path / "owner-token"
    token.write_text(shared.owner_token())
    owner = Member("owner", carol.home, {**carol.env, "RAY_AUTH_TOKEN_PATH": str(token)}, [])
    base = isolation.first_result(submit(owner))
    assert "raysubmit_" in owner.ray("list").stdout  # the owner's went to the base one
    print("\n" + isolation.summary(cold, warm, base, rss, pss), flush=True)


def test_an_idle_member_cluster_stops_and_keeps_its_files(shared: Shared) -> None:
    """After the test above: idle past member_idle_minutes, each member's processes are gone
    and their parent dir (token, temp dir) stays; removal then deletes everything."""
    for name in ("alice", "bob"):
        if name not in shared.members:  # picked alone: their clusters start here
            member = shared.add(name)
            logs_of(member, member.submit("python -c \"print('DONE')\""), "DONE")
    bob_id = member_id(shared, "bob")
    user = f"rf-m-{bob_id}"
    try:
        wait_until(lambda: not processes_of(user), "bob's idle cluster stops", timeout=90,
                   interval=1)
    except AssertionError as exc:  # what the gateway says of it, and what of his still runs
        left = [Path(f"/proc/{pid}/cmdline").read_bytes()[:120] for pid in processes_of(user)]
        raise AssertionError(f"{exc}; members: {own_cluster(shared, 'bob')}; left: {left}") from None
    assert Path(f"/tmp/rf-m-{bob_id}/token").exists()
    stopped = own_cluster(shared, "bob") or {}
    assert stopped.get("state") == "stopped" and stopped.get("reason") == "idle", stopped
    assert float(stopped["hours"]) > 0 and stopped.get("since")
    removed = shared.invoke("member-remove", "bob")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    wait_until(lambda: not Path(f"/tmp/rf-m-{bob_id}").exists(), "bob's files go", timeout=60,
               interval=1)
    wait_until(lambda: _no_user(user), "bob's user goes", timeout=30, interval=1)
    copies = Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem / "member-tokens"
    assert not (copies / f"{bob_id}.token").exists()
    assert (copies / f"{member_id(shared, 'alice')}.token").exists()  # alice's files stay


def own_cluster(shared: Shared, name: str) -> dict[str, Any] | None:
    """`members --json`'s word on the member's own cluster (state, since, hours, cost)."""
    listed = shared.invoke("members", "--json")
    assert listed.returncode == 0, listed.stdout + listed.stderr
    rows = {row["name"]: row for row in json.loads(listed.stdout)["members"]}
    found = rows[name].get("cluster")
    return dict(found) if isinstance(found, dict) else None


def own_cluster_once_running(shared: Shared, name: str) -> dict[str, Any]:
    """`own_cluster`, once the gateway's file that `members` reads has the member's cluster
    running with its hours (waited for in the file: a fresh `invoke` a poll is ~2 CPU-s)."""
    usage = (Path(shared.env["RAYFLEET_HOME"]) / "sharing" / shared.spec.stem
             / member_usage.USAGE_FILE)

    def recorded() -> bool:
        found = (read_json(usage) or {}).get(member_id(shared, name)) or {}
        return found.get("state") == "running" and float(found.get("hours") or 0) > 0

    wait_until(recorded, f"the gateway records {name}'s cluster running with its hours",
               timeout=90, interval=1)
    return own_cluster(shared, name) or {}


def _no_user(user: str) -> bool:
    try:
        pwd.getpwnam(user)
    except KeyError:
        return True
    return False
