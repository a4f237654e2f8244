"""A Lambda cluster shared with `sharing.isolation: cluster` end to end on the test bed (issue
48 on a cloud head), with real Ray, real TLS and the cluster's firewall ruleset enforced on the
instance's host (bed_firewall.py).

The bed's three hosts: h1 is what the fake Lambda hands out as the head; h2 is the members'
laptop, the only address in `sharing.allowed_source_ranges`; h3 is someone outside. The owner works
from the bed's client namespace (its address alone in `ssh_source_ranges`). The module shares one
cluster; each test arranges what it needs of it (a member joined, the two members' jobs run:
`_member`, `_jobs_ran`, each done once), so any test runs alone. `up` opens the gateway's port in
the ruleset to h2 only, runs the gateway on the head as a user of its own (no sudo but the one rule
for the member starter, no shell, no key), out of Ray's user's reach, and installs the starter as
root's own command. Two members join in homes of their own on h2; each one's first request starts a
Ray cluster of their own on the head as a Unix user of their own: bob's project (`invoke submit`)
runs there as his user; alice's job (the stock `ray job` CLI) reads whatever it can and tries
bob's dashboard and GCS with every token it finds, reaching nothing; each member's stock `ray
job list` shows their own jobs only. h3 and the owner's machine cannot even connect; a removed
member is refused within 5 s while the other keeps working; `members --json` counts each member's
own cluster at the head's price; a gateway killed on the head is back within seconds with its
accounting; `teardown` (the module's fixture, at its end) leaves nothing and keeps the usage here.

What only holds with `isolation: shared` is proven elsewhere: members' jobs on an autoscaled worker
through the gateway and per-job counts in `members --json` (tests/local/test_e2e_sharing.py's
test_members_json_counts_jobs_per_member; Lambda's autoscaled workers: test_e2e_autoscale.py), the
price of the autoscaled worker in the gateway's $/h (tests/node/test_gateway_prices.py).
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.core.privilege import GATEWAY_USER, RAY_USER
from infra.core.sharing import isolation
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
#: The member starter as users.sh installs it on the head, and its one sudoers rule.
STARTER = isolation.STARTER_COMMAND[-1]
SUDOERS = "/etc/sudoers.d/rayfleet-member-starter"
#: Where the starter keeps the gateway's copies of member tokens on the head.
TOKENS = isolation.HEAD_TOKEN_DIR.format(cluster=CLUSTER)
ATTACK = Path(__file__).parents[1] / "local" / "isolation_attack.py"
PROBE = Path(__file__).with_name("isolation_gcs_probe.py")
#: bob's project: where it ran, as whom, and his secret (from his working dir) in his job's log.
TASK = """import getpass
import socket

import ray

@ray.remote
def where() -> str:
    return f"{socket.gethostname()} AS {getpass.getuser()}"

print("RAN ON", ray.get(where.remote()))
print(open("secret.txt").read(), flush=True)
"""


@dataclass
class Ran:
    """The two members' jobs on their own clusters, run once for the module."""
    #: alice's attack (the stock `ray job` CLI, `--no-wait`) and what it reported.
    job: str = ""
    report: dict[str, Any] = field(default_factory=dict)
    gcs: dict[str, Any] = field(default_factory=dict)
    #: What bob's `invoke submit` of his project printed, and his secret.
    bob_said: str = ""
    marker: str = ""
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
    # No worker: member clusters are heads only in this pass; the spec's worker type stays.
    with autoscale_bed(work, scale=SCALE, boot_delay=1.0, hosts=3, instance_hosts=1,
                       max_workers=1, idle_minutes=2.0, enforce_firewall=True) as scaled:
        laptop = scaled.bed.hosts[1]
        spec = yaml.safe_load(scaled.spec.read_text())
        spec.pop("metrics_history", None)
        spec.update(metrics="none", ssh_source_ranges=[f"{scaled.bed.client.ip}/32"],
                    sharing={"port": PORT, "allowed_source_ranges": [f"{laptop.ip}/32"],
                             "isolation": "cluster", "max_active_members": 2})
        scaled.spec.write_text(yaml.safe_dump(spec))
        started = time.monotonic()
        up = scaled.invoke("up")
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"\n[lambda sharing] up: {time.monotonic() - started:.1f}s")
        cluster = Shared(scaled, scaled.head()["ip"], up.stdout + up.stderr, {})
        try:
            yield cluster
            assert scaled.firewall is not None and scaled.firewall.errors == []
            # `teardown` leaves nothing and keeps the usage here (each member cluster's node
            # time): checked on the module's own cluster at its end, so no test has to run last.
            down = scaled.invoke("teardown")
            assert down.returncode == 0, down.stdout + down.stderr
            assert_clean(scaled.fake, CLUSTER)
            if cluster.ran.done:
                kept = json.loads((scaled.home / "sharing" / CLUSTER
                                   / "member-clusters-usage.json").read_text())
                ids = {_member_id(cluster, name) for name in ("alice", "bob")}
                assert ids <= set(kept) and all(kept[i]["hours"] > 0 for i in ids), kept
        finally:
            _forget_members(cluster)


def _forget_members(cluster: Shared) -> None:
    """What of the member clusters is on this machine's own disk, not the head's: the bed's hosts
    share its /tmp, /var and cgroups (their /etc and /home go with them)."""
    book = cluster.scaled.home / "sharing" / CLUSTER / "members.json"
    with contextlib.suppress(OSError, ValueError):
        for entry in json.loads(book.read_text())["members"].values():
            shutil.rmtree(f"/tmp/rf-m-{entry['id']}", ignore_errors=True)
            for kind in ("memory", "cpu"):
                with contextlib.suppress(OSError):
                    Path(f"/sys/fs/cgroup/{kind}/rf-m-{entry['id']}").rmdir()
    shutil.rmtree(Path(TOKENS).parent, ignore_errors=True)


def _member_id(shared: Shared, name: str) -> str:
    book = json.loads((shared.scaled.home / "sharing" / CLUSTER / "members.json").read_text())
    return str(book["members"][name]["id"])


def _member(shared: Shared, name: str) -> Member:
    """The member NAME, joined on the laptop (h2) the first time a test asks for them."""
    if name in shared.members:
        return shared.members[name]
    scaled = shared.scaled
    bundle = scaled.home.parent / f"{name}.rayfleet.json"
    added = scaled.invoke("member-add", name, "--out", str(bundle))
    assert added.returncode == 0, added.stdout + added.stderr
    home = scaled.home.parent / f"home-{name}"
    home.mkdir()
    env = {"HOME": str(home), "RAYFLEET_HOME": str(home / ".rf"), "RAY_USAGE_STATS_ENABLED": "0"}
    member = join(Member(name, home, scaled.bed.hosts[1], env), bundle, CLUSTER)
    shared.members[name] = member
    return member


def _ports(shared: Shared, name: str) -> tuple[str, int]:
    """The member's own cluster's GCS address and dashboard port, as its processes' command
    lines on the head name them."""
    head = shared.scaled.host(shared.head_ip)
    lines = head.run(f"ps -u rf-m-{_member_id(shared, name)} -o args=", check=True).stdout
    gcs = re.search(r"--gcs-address=(\S+)", lines)
    dashboard = re.search(r"dashboard\.py.* --port=(\d+)", lines)
    assert gcs and dashboard, lines
    return gcs.group(1), int(dashboard.group(1))


def _jobs_ran(shared: Shared) -> Ran:
    """bob's project (`invoke submit` from his own folder, his secret in his working dir) on his
    own cluster, then alice's attack on bob's files, dashboard and GCS (stock `ray job submit
    --no-wait`) on hers; each step once for the module (a failed step is tried again by the next
    test that needs it, the done ones are not)."""
    ran = shared.ran
    if ran.done:
        return ran
    alice, bob = _member(shared, "alice"), _member(shared, "bob")
    # Each one's first request starts their own cluster (a curl a second until it answers).
    for member in (alice, bob):
        wait_until(partial(_answers, member), f"{member.name}'s own cluster", timeout=180,
                   interval=1)
    if not ran.bob_said:
        ran.marker = "BOBS-SECRET-" + time.strftime("%H%M%S") + str(time.monotonic_ns())[-6:]
        project = bob.home / "project"
        project.mkdir(exist_ok=True)
        (project / "where.py").write_text(TASK)
        (project / "secret.txt").write_text(ran.marker)
        done = bob.invoke("submit", "--cluster", CLUSTER, str(project / "where.py"), timeout=600)
        assert done.returncode == 0, done.stdout + done.stderr
        ran.bob_said = done.stdout
    if not ran.job:
        bob_id = _member_id(shared, "bob")
        attack = alice.home / "attack"
        attack.mkdir(exist_ok=True)
        shutil.copy(ATTACK, attack / "attack.py")
        shutil.copy(PROBE, attack / "probe.py")
        (bob_gcs, bob_dashboard), (her_gcs, _) = _ports(shared, "bob"), _ports(shared, "alice")
        # Every token file there is on the head: the base cluster's (Ray's user's), the
        # gateway's copies of bob's and of the cluster's.
        files = (f"/home/{RAY_USER}/.rayfleet/ray-token {TOKENS}/{bob_id}.token "
                 f"{GATEWAY_HOME}/ray-token")
        entry = (f"python attack.py /tmp/rf-m-{bob_id} /home/rf-m-{bob_id} {bob_dashboard} "
                 f"{ran.marker[::-1]} {files} && python probe.py {her_gcs} {bob_gcs} "
                 f"/tmp/rf-m-{bob_id}/token {files}")
        # One shell line (Ray quotes each word of an entrypoint given as several).
        submitted = alice.ray("submit", "--no-wait", "--working-dir", str(attack), "--",
                              "sh", "-c", entry)
        found = re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr)
        assert submitted.returncode == 0 and found, submitted.stdout + submitted.stderr
        ran.job = found.group(0)
    # Polled over HTTP through the gateway (each `ray job status` costs a CLI process), then
    # said once by Ray's stock CLI.
    wait_until(lambda: _job_status(alice, ran.job) in ("SUCCEEDED", "FAILED", "STOPPED"),
               "alice's job done", timeout=300, interval=1)
    said = alice.said("status", ran.job)
    assert f"Job '{ran.job}' succeeded" in said, said
    logs = alice.invoke("logs", "--cluster", CLUSTER, ran.job)
    assert logs.returncode == 0, logs.stdout + logs.stderr
    ran.report = json.loads(logs.stdout.split("REPORT ", 1)[1].splitlines()[0])
    ran.gcs = json.loads(logs.stdout.split("GCS ", 1)[1].splitlines()[0])
    ran.done = True
    return ran


def _answers(member: Member) -> bool:
    return member.status_code() == "200"


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
    laptop = scaled.bed.hosts[1]
    assert f"members:      https://{shared.head_ip}:{PORT}" in shared.up_output, shared.up_output
    ours = [r for r in scaled.fake.firewall_rulesets.values() if not r.get("foreign")]
    assert len(ours) == 1
    opened = {(r["protocol"], tuple(r["port_range"]), r["source_network"]) for r in ours[0]["rules"]}
    assert opened == {("tcp", (22, 22), f"{scaled.bed.client.ip}/32"),
                      ("tcp", (PORT, PORT), f"{laptop.ip}/32")}
    plan = scaled.invoke("plan")
    assert f"sharing gateway port {PORT} from {laptop.ip}/32" in plan.stdout, plan.stdout
    assert "isolation: cluster" in plan.stdout, plan.stdout
    head = scaled.host(shared.head_ip)
    # The gateway and its supervisor run as the gateway's own user: not Ray's, not the SSH user.
    owners = head.run("pgrep -f '^[^ ]*python[^ ]* -m [i]nfra.node.gateway' "
                      "| xargs -r ps -o user:20= -p").stdout.split()
    assert owners == [GATEWAY_USER], owners
    supervisor = head.run("pgrep -f '[i]nfra.node.supervise run .*rayfleet-gateway.json.pid' "
                          "| xargs -r ps -o user:20= -p").stdout.split()
    assert supervisor == [GATEWAY_USER], supervisor
    # That user has no sudo but the one rule for the member starter, no shell to log in with, no
    # SSH key, no group but its own; Ray's user (every job) has no sudo at all.
    assert head.run(f"runuser -u {GATEWAY_USER} -- sudo -n true").returncode == 1
    assert head.run(f"runuser -u {RAY_USER} -- sudo -n {STARTER} stop x").returncode == 1
    rules = head.run(f"runuser -u {GATEWAY_USER} -- sudo -n -l", check=True).stdout
    assert re.findall(r"NOPASSWD: (\S+)", rules) == [STARTER], rules
    # The starter, its code and its config are root's: the gateway can change none of them.
    modes = head.run(f"stat -c '%n %U %a' {STARTER} /etc/rayfleet/member-starter.json "
                     f"/etc/rayfleet/member-starter.zip {SUDOERS}", check=True).stdout.split("\n")
    assert [m.split(" ", 1)[1] for m in modes if m] == ["root 755", "root 600", "root 644",
                                                         "root 440"], modes
    assert head.run(f"getent passwd {GATEWAY_USER} | cut -d: -f7", check=True).stdout.strip() \
        == "/usr/sbin/nologin"
    assert head.run(f"id -Gn {GATEWAY_USER}", check=True).stdout.split() == [GATEWAY_USER]
    assert head.run(f"test -e /home/{GATEWAY_USER}/.ssh").returncode != 0
    modes = head.run(f"stat -c '%U %a' /home/{GATEWAY_USER} {GATEWAY_HOME} {HEAD_DATA} "
                     f"{HEAD_DATA}/members.json {GATEWAY_HOME}/gateway.key "
                     f"{GATEWAY_HOME}/ray-token", check=True).stdout.split("\n")
    assert [m for m in modes if m] == [f"{GATEWAY_USER} {mode}" for mode in
                                       ("700", "700", "700", "600", "600", "600")], modes
    # The SSH user keeps no copy of the gateway's key or members file, nor the starter's files.
    left = head.run("ls -A /root/.rayfleet /root/.rayfleet/gateway 2>/dev/null").stdout.split()
    assert not {"gateway.key", "members.json", "member-starter"} & set(left), left
    # Ray's user (every job) can read nothing of the gateway's: not its data, key, config or
    # token copy, and cannot even list its folders.
    for path in (f"{HEAD_DATA}/members.json", f"{GATEWAY_HOME}/gateway.key",
                 f"{GATEWAY_HOME}/rayfleet-gateway.json", f"{GATEWAY_HOME}/ray-token",
                 "/etc/rayfleet/member-starter.json"):
        assert head.run(f"runuser -u {RAY_USER} -- cat {path}").returncode != 0, path
    for folder in (f"/home/{GATEWAY_USER}", HEAD_DATA):
        assert head.run(f"runuser -u {RAY_USER} -- ls {folder}").returncode != 0, folder


def test_each_member_runs_on_a_cluster_of_their_own_and_reaches_nothing_of_the_other(
        shared: Shared) -> None:
    ran = _jobs_ran(shared)
    alice, bob = shared.members["alice"], shared.members["bob"]
    head = shared.scaled.host(shared.head_ip)
    bob_id = _member_id(shared, "bob")
    # bob's project ran on the head (no worker: member clusters are heads), as his own user.
    assert f"RAN ON {head.hostname} AS rf-m-{bob_id}" in ran.bob_said, ran.bob_said
    assert ran.marker in ran.bob_said, ran.bob_said
    # alice's job read nothing of bob's: his parent dir (token, temp dir, logs, unpacked code),
    # his home, the gateway's copy of his token; the marker nowhere; no other user's process
    # could even be signalled; his dashboard answered no token she found with a 2xx.
    report = ran.report
    assert int(report["tokens_found"][0]) >= 1  # at least her own token, tried on his cluster
    assert report["marker_in"] == [], report["marker_in"]
    assert not [p for p in report["read"] if p.startswith(
        (f"/tmp/rf-m-{bob_id}", f"/home/rf-m-{bob_id}", TOKENS, f"/home/{RAY_USER}",
         f"/home/{GATEWAY_USER}"))], report["read"]
    assert report["signalled"] == [], report["signalled"]
    assert report["answers"] and not [a for a in report["answers"] if a.startswith("2")], \
        report["answers"]
    # His GCS answered none of her tokens; hers answered her own (the probe can succeed).
    gcs = ran.gcs
    assert "OK" in gcs["own"] and gcs["other"] and "OK" not in gcs["other"], gcs
    # Each sees only their own jobs through the same gateway with Ray's stock CLI.
    hers, his = alice.ray("list"), bob.ray("list")
    assert hers.returncode == 0 and his.returncode == 0, hers.stderr + his.stderr
    assert ran.job in hers.stdout and "raysubmit_" in his.stdout and ran.job not in his.stdout
    assert [j for j in re.findall(r"raysubmit_\w+", hers.stdout) if j != ran.job] == []
    status = json.loads(alice.invoke("status", "--cluster", CLUSTER, "--json").stdout)
    assert status["address"] == f"https://{shared.head_ip}:{PORT}"
    assert [row["job"] for row in status["jobs"]] == [ran.job], status
    # The member's home holds no cluster token.
    token = (shared.scaled.home / "keys" / CLUSTER / "ray-token").read_text().strip()
    leaked = alice.sh(f"grep -rlF {shlex.quote(token)} . || true").stdout.strip()
    assert leaked == "", leaked


def test_hosts_outside_the_allowed_range_cannot_connect(shared: Shared) -> None:
    scaled = shared.scaled
    assert _connects(scaled.bed.hosts[1].run, shared.head_ip)  # the laptop: open
    assert not _connects(scaled.bed.hosts[2].run, shared.head_ip)  # someone outside
    assert not _connects(scaled.bed.client_run, shared.head_ip)  # the owner's machine too
    # ...not even with a member's bundle: the address is unreachable from there.
    alice = _member(shared, "alice")
    outside = Member("alice", alice.home, scaled.bed.hosts[2], alice.env)
    assert outside.status_code() == "000"


def test_a_removed_member_is_refused_within_5s_while_the_other_keeps_working(
        shared: Shared) -> None:
    # dora joins to be removed: alice and bob stay members for the module's other tests. Her
    # probe is the gateway's own page (no cluster of hers is started for it).
    alice, dora = _member(shared, "alice"), _member(shared, "dora")
    assert dora.status_code("/rayfleet/usage") == "200"
    removed = shared.scaled.invoke("member-remove", "dora")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    started = time.monotonic()
    wait_until(lambda: dora.status_code("/rayfleet/usage") == "403", "dora refused", timeout=5,
               interval=0.1)
    print(f"\n[lambda sharing] revoked in {time.monotonic() - started:.1f}s")
    assert alice.status_code() == "200"
    assert alice.ray("list").returncode == 0


def test_members_json_counts_each_members_own_cluster_at_the_heads_price(shared: Shared) -> None:
    """alice's and bob's own clusters run, their node time counted at the head's price (each may
    use every CPU of the head: its whole price); a removed member (one of this test's own: never
    joined) stays listed, marked. `teardown` keeping the usage is checked by the module's
    fixture."""
    scaled = shared.scaled
    _jobs_ran(shared)
    head = scaled.host(shared.head_ip)
    config = json.loads(head.run(f"cat {GATEWAY_HOME}/rayfleet-gateway.json", check=True).stdout)
    price = float(config["node_prices"]["head"])
    assert price > 0, config["node_prices"]
    bundle = scaled.home.parent / "gone.rayfleet.json"
    added = scaled.invoke("member-add", "gone", "--out", str(bundle))
    assert added.returncode == 0, added.stdout + added.stderr
    removed = scaled.invoke("member-remove", "gone")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    seen: list[dict[str, Any]] = []

    def counted() -> bool:
        listed = scaled.invoke("members", "--json")
        assert listed.returncode == 0, listed.stderr
        seen.append({r["name"]: r for r in json.loads(listed.stdout)["members"]})
        return all((seen[-1][n].get("cluster") or {}).get("state") == "running"
                   and seen[-1][n]["job_hours"] > 0 for n in ("alice", "bob"))

    try:  # the gateway accrues at each idle check (every 30 s)
        wait_until(counted, "alice's and bob's clusters counted", timeout=60, interval=5)
    except AssertionError as failed:
        raise AssertionError(f"{failed}; members: {seen[-1:]}") from None
    every = seen[-1]
    active = {name for name, r in every.items() if r["status"] != "removed"}
    assert {"alice", "bob"} <= active and "gone" not in active, every
    for name in ("alice", "bob"):
        row = every[name]
        assert abs(row["cost_share_usd"] - row["job_hours"] * price) <= 1e-4, row
    assert every["gone"]["status"] == "removed" and every["gone"]["total_jobs"] == 0, every
    assert not every["gone"].get("cluster"), every["gone"]


def test_a_gateway_killed_on_the_head_is_back_and_keeps_its_accounting(shared: Shared) -> None:
    _jobs_ran(shared)  # the accounting it must keep
    head = shared.scaled.host(shared.head_ip)
    find = "pgrep -f '^[^ ]*python[^ ]* -m infra.node.gateway'"
    before = head.run(find).stdout.split()
    assert len(before) == 1, before
    head.run(f"kill -9 {before[0]}", check=True)
    started = time.monotonic()
    alice = shared.members["alice"]
    # Its own page: the new gateway stops the member clusters it did not start (their next
    # request starts them again), through the starter with sudo.
    wait_until(lambda: head.run(find).stdout.split() not in ([], before)
               and alice.status_code("/rayfleet/usage") == "200",
               "the supervisor's new gateway", timeout=30, interval=0.2)
    print(f"\n[lambda sharing] gateway back in {time.monotonic() - started:.1f}s")
    ids = {_member_id(shared, name) for name in ("alice", "bob")}
    users = ",".join(f"rf-m-{i}" for i in sorted(ids))
    wait_until(lambda: not head.run(f"pgrep -u {users}").stdout,
               "the old gateway's member clusters stopped", timeout=30, interval=0.5)
    usage = json.loads(head.run(f"cat {HEAD_DATA}/member-clusters-usage.json",
                                check=True).stdout)
    assert ids <= set(usage) and all(usage[i]["hours"] > 0 for i in ids), usage
