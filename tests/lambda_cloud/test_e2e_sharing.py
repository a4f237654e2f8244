"""A shared Lambda cluster end to end on the test bed (issue 28's remote provider), with real Ray,
real TLS and the cluster's firewall ruleset enforced on the instances' hosts (bed_firewall.py).

The bed's four hosts: h1 and h2 are what the fake Lambda hands out as instances (the head, the one
autoscaled worker); h3 is the members' laptop, the only address in `sharing.allowed_source_ranges`;
h4 is someone outside. The owner works from the bed's client namespace (its address alone in
`ssh_source_ranges`). The module shares one cluster; each test arranges what it needs of it (a
member joined, the two members' jobs run: `_member`, `_jobs_ran`, each done once), so any test runs
alone. `up` opens the gateway's port in the ruleset to h3 only and runs the gateway on the head as
a user of its own (no sudo, no shell, no key), out of Ray's user's reach; two members join in homes
of their own on h3 and both their jobs run on the autoscaled worker (one with the stock `ray job`
CLI, one with `invoke submit` from their own folder); h4 and the owner's machine cannot even
connect; a removed member is refused within 5 s while the other keeps working; a gateway killed on
the head is back within seconds with its accounting; `members --json` counts from the head;
`teardown` (the module's fixture, at its end) leaves nothing and keeps the usage here.
"""

from __future__ import annotations

import json
import re
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from infra.core.privilege import GATEWAY_USER, RAY_USER
from tests.bed_member import Member, join
from tests.lambda_cloud.autoscale_bed import CLUSTER, Scaled, autoscale_bed
from tests.lambda_cloud.conftest import assert_clean
from tests.testbed.preflight import require
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

SCALE = 0.05
PORT = 8443
#: The gateway's user's home on the head, and its data dir there.
GATEWAY_HOME = f"/home/{GATEWAY_USER}/.rayfleet"
HEAD_DATA = f"{GATEWAY_HOME}/gateway"
#: A job's whole entrypoint on the worker (it asks for half of the worker's one GPU).
WHERE = "python -c \"import socket; print('RAN ON', socket.gethostname())\""
#: A member's own project: its driver on the head, its task on the worker.
TASK = '''import socket
import ray

@ray.remote(num_gpus=0.5)
def where() -> str:
    return socket.gethostname()

print("RAN ON", ray.get(where.remote()))
'''


@dataclass
class Ran:
    """The two members' jobs on the autoscaled worker, run once for the module."""
    #: alice's job (the stock `ray job` CLI, `--no-wait`).
    job: str = ""
    #: What bob's `invoke submit` of his project printed, and the worker both ran on.
    bob_said: str = ""
    worker_host: str = ""
    done: bool = False


@dataclass
class Shared:
    scaled: Scaled
    head_ip: str
    up_output: str
    members: dict[str, Member]
    ran: Ran = field(default_factory=Ran)


@pytest.fixture(scope="module")
def shared(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shared]:
    require("testbed")
    work = tmp_path_factory.mktemp("lambda-sharing")
    # The worker idles 2 min before it goes: the jobs' logs live on it (Ray answers 500 for the
    # logs of a job whose node is gone).
    with autoscale_bed(work, scale=SCALE, boot_delay=1.0, hosts=4, instance_hosts=2,
                       max_workers=1, idle_minutes=2.0, enforce_firewall=True) as scaled:
        laptop = scaled.bed.hosts[2]
        spec = yaml.safe_load(scaled.spec.read_text())
        spec.pop("metrics_history", None)
        spec.update(metrics="none", ssh_source_ranges=[f"{scaled.bed.client.ip}/32"],
                    sharing={"port": PORT, "allowed_source_ranges": [f"{laptop.ip}/32"]})
        scaled.spec.write_text(yaml.safe_dump(spec))
        started = time.monotonic()
        up = scaled.invoke("up")
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"\n[lambda sharing] up: {time.monotonic() - started:.1f}s")
        cluster = Shared(scaled, scaled.head()["ip"], up.stdout + up.stderr, {})
        yield cluster
        assert scaled.firewall is not None and scaled.firewall.errors == []
        # `teardown` leaves nothing and keeps the usage here: checked on the module's own cluster
        # at its end, so that no test has to run last.
        down = scaled.invoke("teardown")
        assert down.returncode == 0, down.stdout + down.stderr
        assert_clean(scaled.fake, CLUSTER)
        if cluster.ran.done:
            usage = json.loads((scaled.home / "sharing" / CLUSTER / "usage.json").read_text())
            assert {j.get("member") for j in usage["jobs"].values()} >= {"alice", "bob"}, usage


def _member(shared: Shared, name: str) -> Member:
    """The member NAME, joined on the laptop (h3) the first time a test asks for them."""
    if name in shared.members:
        return shared.members[name]
    scaled = shared.scaled
    bundle = scaled.home.parent / f"{name}.rayfleet.json"
    added = scaled.invoke("member-add", name, "--out", str(bundle))
    assert added.returncode == 0, added.stdout + added.stderr
    home = scaled.home.parent / f"home-{name}"
    home.mkdir()
    env = {"HOME": str(home), "RAYFLEET_HOME": str(home / ".rf"), "RAY_USAGE_STATS_ENABLED": "0"}
    member = join(Member(name, home, scaled.bed.hosts[2], env), bundle, CLUSTER)
    shared.members[name] = member
    return member


def _jobs_ran(shared: Shared) -> Ran:
    """alice's job (stock `ray job submit --no-wait`) and bob's project (`invoke submit` from his
    own folder) run on the one autoscaled worker, both done; each step once for the module (a
    failed step is tried again by the next test that needs it, the done ones are not)."""
    ran = shared.ran
    if ran.done:
        return ran
    alice, bob = _member(shared, "alice"), _member(shared, "bob")
    if not ran.job:
        # A dead autoscaler would leave both jobs pending until the timeout below: say so at once.
        assert shared.scaled.autoscaler_pids(), shared.scaled.explain()
        submitted = alice.ray("submit", "--no-wait", "--entrypoint-num-gpus", "0.5", "--",
                              *shlex.split(WHERE))
        found = re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr)
        assert submitted.returncode == 0 and found, submitted.stdout + submitted.stderr
        ran.job = found.group(0)
    if not ran.bob_said:
        project = bob.home / "project"
        project.mkdir(exist_ok=True)
        (project / "where.py").write_text(TASK)
        with shared.scaled.explained():
            done = bob.invoke("submit", "--cluster", CLUSTER, str(project / "where.py"),
                              timeout=600)
            assert done.returncode == 0, done.stdout + done.stderr
            worker = shared.scaled.workers()
            assert len(worker) == 1, worker
        ran.bob_said = done.stdout
        ran.worker_host = shared.scaled.host(worker[0]["ip"]).hostname
    with shared.scaled.explained():
        # Polled over HTTP through the gateway (each `ray job status` costs a CLI process), then
        # said once by Ray's stock CLI.
        wait_until(lambda: _job_status(alice, ran.job) in ("SUCCEEDED", "FAILED", "STOPPED"),
                   "alice's job done", timeout=300, interval=1)
        said = alice.said("status", ran.job)
        assert f"Job '{ran.job}' succeeded" in said, said
    ran.done = True
    return ran


def _job_status(member: Member, job: str) -> str | None:
    """A job's status as the gateway answers the member (None while it does not)."""
    code, body = member.fetch(f"/api/jobs/{job}")
    if code != "200":
        return None
    try:
        return str(json.loads(body).get("status"))
    except (json.JSONDecodeError, AttributeError):
        return None


def _connects(run: Any, ip: str) -> bool:
    """Whether a TCP connection to the gateway opens within 3 s (bash's /dev/tcp)."""
    probe = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{ip}/{PORT}'"
    return run(probe).returncode == 0


def test_up_opens_the_port_to_the_allowed_range_and_hides_the_gateway_from_rays_user(
        shared: Shared) -> None:
    scaled = shared.scaled
    assert f"members:      https://{shared.head_ip}:{PORT}" in shared.up_output, shared.up_output
    ours = [r for r in scaled.fake.firewall_rulesets.values() if not r.get("foreign")]
    assert len(ours) == 1
    opened = {(r["protocol"], tuple(r["port_range"]), r["source_network"]) for r in ours[0]["rules"]}
    assert opened == {("tcp", (22, 22), f"{scaled.bed.client.ip}/32"),
                      ("tcp", (PORT, PORT), f"{scaled.bed.hosts[2].ip}/32")}
    plan = scaled.invoke("plan")
    assert f"sharing gateway port {PORT} from {scaled.bed.hosts[2].ip}/32" in plan.stdout, plan.stdout
    head = scaled.host(shared.head_ip)
    # The gateway and its supervisor run as the gateway's own user: not Ray's, not the SSH user.
    owners = head.run("pgrep -f '^[^ ]*python[^ ]* -m [i]nfra.node.gateway' "
                      "| xargs -r ps -o user:20= -p").stdout.split()
    assert owners == [GATEWAY_USER], owners
    supervisor = head.run("pgrep -f '[i]nfra.node.supervise run .*rayfleet-gateway.json.pid' "
                          "| xargs -r ps -o user:20= -p").stdout.split()
    assert supervisor == [GATEWAY_USER], supervisor
    # That user has no sudo, no shell to log in with, no SSH key, no group but its own.
    assert head.run(f"runuser -u {GATEWAY_USER} -- sudo -n true").returncode == 1
    assert head.run(f"getent passwd {GATEWAY_USER} | cut -d: -f7", check=True).stdout.strip() \
        == "/usr/sbin/nologin"
    assert head.run(f"id -Gn {GATEWAY_USER}", check=True).stdout.split() == [GATEWAY_USER]
    assert head.run(f"test -e /home/{GATEWAY_USER}/.ssh").returncode != 0
    modes = head.run(f"stat -c '%U %a' /home/{GATEWAY_USER} {GATEWAY_HOME} {HEAD_DATA} "
                     f"{HEAD_DATA}/members.json {GATEWAY_HOME}/gateway.key "
                     f"{GATEWAY_HOME}/ray-token", check=True).stdout.split("\n")
    assert [m for m in modes if m] == [f"{GATEWAY_USER} {mode}" for mode in
                                       ("700", "700", "700", "600", "600", "600")], modes
    # The SSH user keeps no copy of the gateway's key or members file.
    left = head.run("ls -A /root/.rayfleet /root/.rayfleet/gateway 2>/dev/null").stdout.split()
    assert "gateway.key" not in left and "members.json" not in left, left
    # Ray's user (every job) can read nothing of the gateway's: not its data, key, config or
    # token copy, and cannot even list its folders.
    for path in (f"{HEAD_DATA}/members.json", f"{GATEWAY_HOME}/gateway.key",
                 f"{GATEWAY_HOME}/rayfleet-gateway.json", f"{GATEWAY_HOME}/ray-token"):
        assert head.run(f"runuser -u {RAY_USER} -- cat {path}").returncode != 0, path
    for folder in (f"/home/{GATEWAY_USER}", HEAD_DATA):
        assert head.run(f"runuser -u {RAY_USER} -- ls {folder}").returncode != 0, folder


def test_two_members_jobs_run_on_the_worker_from_their_own_laptop(shared: Shared) -> None:
    ran = _jobs_ran(shared)
    alice, job, worker_host = shared.members["alice"], ran.job, ran.worker_host
    assert f"RAN ON {worker_host}" in ran.bob_said, ran.bob_said
    logs = alice.invoke("logs", "--cluster", CLUSTER, job)
    assert logs.returncode == 0 and f"RAN ON {worker_host}" in logs.stdout, logs.stdout + logs.stderr
    status = json.loads(alice.invoke("status", "--cluster", CLUSTER, "--json").stdout)
    assert status["address"] == f"https://{shared.head_ip}:{PORT}"
    assert [row["job"] for row in status["jobs"]] == [job], status
    # The member's home holds no cluster token.
    token = (shared.scaled.home / "keys" / CLUSTER / "ray-token").read_text().strip()
    leaked = alice.sh(f"grep -rlF {shlex.quote(token)} . || true").stdout.strip()
    assert leaked == "", leaked


def test_the_cost_share_counts_the_autoscaled_worker_at_its_price(shared: Shared) -> None:
    """While the worker that ran the jobs is up, the $/h the gateway splits is the head's price
    plus the worker's (Ray's v2 autoscaler reports no nodes at /api/cluster_status: the gateway
    counted the head alone until it read Ray's node table)."""
    _jobs_ran(shared)  # the worker they ran on idles 2 min before it goes
    head = shared.scaled.host(shared.head_ip)
    config = json.loads(head.run(f"cat {GATEWAY_HOME}/rayfleet-gateway.json", check=True).stdout)
    prices = config["node_prices"]
    assert set(prices) == {"head", "gpu"} and len(shared.scaled.workers()) == 1, prices
    wanted = round(prices["head"] + prices["gpu"], 4)

    seen: list[float] = []

    def at_price() -> bool:
        listed = shared.scaled.invoke("members", "--json")
        assert listed.returncode == 0, listed.stderr
        seen.append(float(json.loads(listed.stdout)["cluster_cost"]["hourly_usd"]))
        return seen[-1] == wanted

    try:
        wait_until(at_price, f"the cluster at ${wanted}/h", timeout=30, interval=2)
    except AssertionError as failed:
        raise AssertionError(f"{failed}; the gateway's $/h: {seen[-3:]}") from None


def test_hosts_outside_the_allowed_range_cannot_connect(shared: Shared) -> None:
    scaled = shared.scaled
    assert _connects(scaled.bed.hosts[2].run, shared.head_ip)  # the laptop: open
    assert not _connects(scaled.bed.hosts[3].run, shared.head_ip)  # someone outside
    assert not _connects(scaled.bed.client_run, shared.head_ip)  # the owner's machine too
    # ...not even with a member's bundle: the address is unreachable from there.
    alice = _member(shared, "alice")
    outside = Member("alice", alice.home, scaled.bed.hosts[3], alice.env)
    assert outside.status_code() == "000"


def test_a_removed_member_is_refused_within_5s_while_the_other_keeps_working(
        shared: Shared) -> None:
    # dora joins to be removed: alice and bob stay members for the module's other tests.
    alice, dora = _member(shared, "alice"), _member(shared, "dora")
    assert dora.status_code() == "200"
    removed = shared.scaled.invoke("member-remove", "dora")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    started = time.monotonic()
    wait_until(lambda: dora.status_code() == "403", "dora refused", timeout=5, interval=0.1)
    print(f"\n[lambda sharing] revoked in {time.monotonic() - started:.1f}s")
    assert alice.status_code() == "200"
    assert alice.ray("list").returncode == 0


def test_a_gateway_killed_on_the_head_is_back_and_keeps_its_accounting(shared: Shared) -> None:
    _jobs_ran(shared)  # the accounting it must keep
    head = shared.scaled.host(shared.head_ip)
    find = "pgrep -f '^[^ ]*python[^ ]* -m infra.node.gateway'"
    before = head.run(find).stdout.split()
    assert len(before) == 1, before
    head.run(f"kill -9 {before[0]}", check=True)
    started = time.monotonic()
    alice = shared.members["alice"]
    wait_until(lambda: head.run(find).stdout.split() not in ([], before)
               and alice.status_code() == "200", "the supervisor's new gateway", timeout=30,
               interval=0.2)
    print(f"\n[lambda sharing] gateway back in {time.monotonic() - started:.1f}s")
    usage = json.loads(head.run(f"cat {HEAD_DATA}/usage.json", check=True).stdout)
    assert {j.get("member") for j in usage["jobs"].values()} >= {"alice", "bob"}, usage


def test_members_json_counts_from_the_head(shared: Shared) -> None:
    """One job each for alice and bob; a removed member (one of this test's own: never joined)
    stays listed, marked. `teardown` keeping the usage is checked by the module's fixture."""
    scaled = shared.scaled
    _jobs_ran(shared)
    bundle = scaled.home.parent / "gone.rayfleet.json"
    added = scaled.invoke("member-add", "gone", "--out", str(bundle))
    assert added.returncode == 0, added.stdout + added.stderr
    removed = scaled.invoke("member-remove", "gone")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    listed = scaled.invoke("members", "--json")
    assert listed.returncode == 0, listed.stderr
    every = {r["name"]: r for r in json.loads(listed.stdout)["members"]}
    active = {name for name, r in every.items() if r["status"] != "removed"}
    assert {"alice", "bob"} <= active and "gone" not in active, every
    assert every["alice"]["total_jobs"] == 1 and every["bob"]["total_jobs"] == 1, every
    assert every["gone"]["status"] == "removed" and every["gone"]["total_jobs"] == 0, every
