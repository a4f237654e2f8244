"""A shared Slurm cluster on the 2-host test bed (issue 28 on Slurm), with real Slurm, real Ray and
real TLS. The owner works from this machine through the login host; the head's batch job runs the
gateway on its compute node (templates/slurm.sbatch.j2), from the files `up` puts on the shared
work dir.

One fixed one-node cluster serves every scenario; each test arranges what it needs of it (a member
joined, alice's job run: `_member`, `_alices_job`, each done once), so any test runs alone. `up`
starts the gateway in the head's job, listening on the node's addresses with a certificate that
names the node, 127.0.0.1 and localhost; two members join in homes of their own on the other bed
host (the site's network) and alice submits with the stock `ray job` CLI; bob can neither stop nor
read alice's job (403); from the owner's machine a member reaches the gateway through their own
`ssh -L` via the login host (`join --address`), the CA pinned, by the name `localhost`; a removed
member is refused within 5 s while the other keeps working; a gateway killed on the head is back
within seconds with its accounting (the job's supervisor); `members --json` counts from the head;
`teardown` (the module's fixture, at its end) leaves no gateway listening and keeps the usage here.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from infra.core.sharing import certs as sharing_certs
from infra.node import rayproc
from tests.bed_member import Member, join
from tests.conftest import run_invoke
from tests.slurm.conftest import LoginCluster, login_spec, ok, ray_left_on_hosts
from tests.testbed.hosts import Host, ray_bin_dir
from tests.testbed.slurm import SlurmCluster
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

NAME = "classroom"
PORT = 28443
SPEC = f"""sharing:
  port: {PORT}
  members_run_as_owner: true
"""
#: A member's job: where it ran.
WHERE = "python -c \"import socket; print('RAN ON', socket.gethostname())\""


@dataclass
class Shared:
    cluster: LoginCluster
    up_output: str
    members: dict[str, Member] = field(default_factory=dict)
    jobs: dict[str, str] = field(default_factory=dict)

    @property
    def head(self) -> Host:
        node = self.cluster.job["head_node"]
        return next(h for h in self.cluster.slurm.nodes if h.hostname == node)

    @property
    def site_host(self) -> Host:
        """A host of the site's network that is not the head's node (a login node, say)."""
        return next(h for h in self.cluster.slurm.nodes if h is not self.head)


@pytest.fixture(scope="module")
def shared(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Shared]:
    work = tmp_path_factory.mktemp("slurm-sharing")
    cluster = LoginCluster(login_spec(work, slurm_cluster, NAME, SPEC), work / "owner",
                           slurm_cluster)
    try:
        started = time.monotonic()
        up = cluster.invoke("up")
        assert up.returncode == 0, up.stdout + up.stderr
        print(f"\n[slurm sharing] up: {time.monotonic() - started:.1f}s")
        shared = Shared(cluster, up.stdout + up.stderr)
        yield shared
        _teardown_stops_the_gateway_and_keeps_usage(shared)
    finally:
        if (cluster.home / "state" / f"{NAME}.json").exists():
            cluster.invoke("teardown")


def _teardown_stops_the_gateway_and_keeps_usage(shared: Shared) -> None:
    """`teardown`, checked on the module's own cluster at its end (so that no test runs last)."""
    cluster = shared.cluster
    job, site = cluster.job, shared.site_host
    ok(cluster.invoke("teardown"))
    probe = f"timeout 3 bash -c 'exec 3<>/dev/tcp/{job['head_ip']}/{PORT}'"
    assert site.run(probe).returncode != 0, "the gateway still answers after teardown"
    # Nothing of the job's is left on its nodes, the gateway's supervisor included (its config
    # named the head's private dir; the machine's other gateways are other clusters').
    assert ray_left_on_hosts(cluster.slurm, job) == {}
    if shared.jobs:
        usage = json.loads((cluster.home / "sharing" / NAME / "usage.json").read_text())
        assert {j.get("member") for j in usage["jobs"].values()} == set(shared.jobs), usage


def _member(shared: Shared, name: str) -> Member:
    """The member NAME, joined on the site's other host the first time a test asks for them."""
    if name in shared.members:
        return shared.members[name]
    cluster = shared.cluster
    bundle = cluster.home.parent / f"{name}.rayfleet.json"
    ok(cluster.invoke("member-add", name, "--out", str(bundle)))
    home = cluster.home.parent / f"home-{name}"
    home.mkdir()
    member = join(Member(name, home, shared.site_host, {
        "HOME": str(home), "RAYFLEET_HOME": str(home / ".rf"), "RAY_USAGE_STATS_ENABLED": "0",
        "PATH": f"{ray_bin_dir()}:/usr/local/bin:/usr/bin:/bin"}), bundle, NAME)
    shared.members[name] = member
    return member


def _alices_job(shared: Shared) -> str:
    """alice's job, submitted with the stock `ray job` CLI and done: once for the module."""
    alice = _member(shared, "alice")
    if "alice" not in shared.jobs:
        submitted = alice.ray("submit", "--no-wait", "--", *shlex.split(WHERE))
        found = re.search(r"raysubmit_\w+", submitted.stdout + submitted.stderr)
        assert submitted.returncode == 0 and found, submitted.stdout + submitted.stderr
        shared.jobs["alice"] = found.group(0)
    job = shared.jobs["alice"]

    def finished() -> bool:
        code, body = alice.fetch(f"/api/jobs/{job}")
        return code == "200" and json.loads(body).get("status") == "SUCCEEDED"

    wait_until(finished, "alice's job done", timeout=180, interval=0.5)
    return job


def test_up_runs_the_gateway_in_the_heads_job_with_a_certificate_for_the_site_and_tunnels(
        shared: Shared) -> None:
    job = shared.cluster.job
    url = f"https://{job['head_ip']}:{PORT}"
    assert f"members:      {url}" in shared.up_output, shared.up_output
    # Inside the job: its config is in the head's private dir, so the job's end stops it.
    found = shared.head.run("pgrep -af '[i]nfra.node.gateway --config'").stdout
    assert str(job["temp_dir"]) in found, found
    listening = shared.head.run(f"ss -Hltn 'sport = :{PORT}'", check=True).stdout
    assert f"0.0.0.0:{PORT}" in listening, listening
    cert = shared.cluster.home / "keys" / NAME / sharing_certs.SERVER_CERT
    # Not the node's name: the CA signs for no DNS name but localhost.
    assert sharing_certs.server_names(cert) == sorted({job["head_ip"], "127.0.0.1", "localhost"})
    # Its files on the shared work dir: nobody else's.
    home = Path(shared.cluster.slurm.jobs_dir) / "sharing" / NAME
    assert oct(home.stat().st_mode & 0o777) == "0o700"
    for name in ("gateway.key", "gateway/members.json", "rayfleet-gateway.json"):
        assert oct((home / name).stat().st_mode & 0o777) == "0o600", name
    token = (shared.cluster.home / "keys" / NAME / "ray-token").read_text().strip()
    assert token not in (home / "rayfleet-gateway.json").read_text()
    planned = ok(shared.cluster.invoke("plan"))
    assert f"sharing gateway in the head's job, on all the head node's addresses at port {PORT}" \
        in " ".join(planned.split()), planned


def test_a_member_on_the_site_submits_with_stock_ray_and_another_cannot_touch_it(
        shared: Shared) -> None:
    job = _alices_job(shared)
    alice, bob = _member(shared, "alice"), _member(shared, "bob")
    logs = alice.ray("logs", job)
    assert f"RAN ON {shared.head.hostname}" in logs.stdout + logs.stderr, logs.stdout + logs.stderr
    refused = bob.ray("stop", job)
    # Another member's job is answered as one that does not exist (Ray's CLI then says so).
    assert refused.returncode != 0 and "does not exist" in refused.stdout + refused.stderr
    for path in (f"/api/jobs/{job}", f"/api/jobs/{job}/logs"):
        assert bob.status_code(path) == "404", path
    code, listed = bob.fetch("/api/jobs/")
    assert code == "200" and json.loads(listed) == [], listed
    # Nothing of the cluster's token in a member's home.
    token = (shared.cluster.home / "keys" / NAME / "ray-token").read_text().strip()
    leaked = alice.sh(f"grep -rlF {shlex.quote(token)} . || true").stdout.strip()
    assert leaked == "", leaked


@contextlib.contextmanager
def _own_tunnel(shared: Shared) -> Iterator[int]:
    """`ssh -N -L PORT:HEAD:PORT login`, as a member with their own site account opens it on a
    laptop (here: this machine, through the bed's proxy)."""
    slurm, local = shared.cluster.slurm, rayproc.free_port()
    login = slurm.login_host
    argv = ["ssh", "-N", "-o", "BatchMode=yes", "-o", "ExitOnForwardFailure=yes",
            "-o", f"ProxyCommand={slurm.testbed.proxy_command}",
            "-o", f"UserKnownHostsFile={slurm.testbed.known_hosts_path}",
            "-i", str(login.ssh_key_path),
            "-L", f"127.0.0.1:{local}:{shared.cluster.job['head_ip']}:{PORT}",
            f"{login.ssh_user}@{login.ip}"]
    tunnel = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: rayproc.port_answers("127.0.0.1", local), "the member's tunnel",
                   timeout=30, interval=0.2)
        yield local
    finally:
        tunnel.terminate()
        tunnel.wait(timeout=10)


def test_a_member_off_site_reaches_it_through_their_own_tunnel_by_localhost(
        shared: Shared) -> None:
    """alice on her laptop (this machine, a home of its own): `join --address` the tunnel's end,
    then rayfleet's `status` and the stock `ray job list` through it, the certificate verified
    by the name `localhost`."""
    job = _alices_job(shared)
    alice = shared.members["alice"]
    laptop = alice.home.parent / "alice-laptop"
    laptop.mkdir()
    env = {"HOME": str(laptop), "RAYFLEET_HOME": str(laptop / ".rf"),
           "RAY_USAGE_STATS_ENABLED": "0", "PATH": f"{ray_bin_dir()}:/usr/bin:/bin"}
    bundle = shared.cluster.home.parent / "alice.rayfleet.json"
    with _own_tunnel(shared) as local:
        ok(run_invoke("join", str(bundle), "--address", f"https://localhost:{local}", env=env))
        status = json.loads(ok(run_invoke("status", "--cluster", NAME, "--json", env=env)))
        assert [row["job"] for row in status["jobs"]] == [job], status
        exports = ok(run_invoke("env", "--cluster", NAME, env=env))
        env.update(item.split("=", 1) for item in exports.strip().removeprefix("export ").split())
        assert env["RAY_API_SERVER_ADDRESS"] == f"https://localhost:{local}"
        listed = subprocess.run(["ray", "job", "list"], env=env, cwd=laptop,
                                capture_output=True, text=True, timeout=120, check=False)
        assert listed.returncode == 0, listed.stdout + listed.stderr
        assert job in listed.stdout + listed.stderr


def test_a_removed_member_is_refused_within_5s_while_the_other_keeps_working(
        shared: Shared) -> None:
    # dora joins to be removed: alice and bob stay members for the module's other tests.
    alice, dora = _member(shared, "alice"), _member(shared, "dora")
    assert dora.status_code() == "200"
    ok(shared.cluster.invoke("member-remove", "dora"))
    started = time.monotonic()
    wait_until(lambda: dora.status_code() == "403", "dora refused", timeout=5, interval=0.1)
    print(f"\n[slurm sharing] revoked in {time.monotonic() - started:.1f}s")
    assert alice.status_code() == "200"


def test_a_gateway_killed_in_the_job_is_back_with_its_accounting(shared: Shared) -> None:
    """The job's supervisor (rf_supervised) starts it again, from the copy in the private dir."""
    job = _alices_job(shared)  # the accounting it must keep
    temp = str(shared.cluster.job["temp_dir"])

    def gateways() -> list[str]:
        out = shared.head.run("pgrep -af '^[^ ]*python[^ ]* -m infra.node.gateway'").stdout
        return [line.split()[0] for line in out.splitlines() if temp in line]

    before = gateways()
    assert len(before) == 1, before
    shared.head.run(f"kill -9 {before[0]}", check=True)
    alice = shared.members["alice"]
    wait_until(lambda: gateways() not in ([], before) and alice.status_code() == "200",
               "the supervisor's new gateway", timeout=30, interval=0.2)
    home = Path(shared.cluster.slurm.jobs_dir) / "sharing" / NAME / "gateway"
    usage = json.loads((home / "usage.json").read_text())
    assert job in usage["jobs"], usage


def test_members_json_counts_from_the_head(shared: Shared) -> None:
    """alice's one job; a removed member (one of this test's own: never joined) stays listed,
    marked. `teardown` is checked by the module's fixture."""
    cluster = shared.cluster
    _alices_job(shared)
    ok(cluster.invoke("member-add", "gone", "--out", str(cluster.home.parent / "gone.json")))
    ok(cluster.invoke("member-remove", "gone"))
    every = {r["name"]: r for r in json.loads(ok(cluster.invoke("members", "--json")))["members"]}
    assert every["alice"]["status"] != "removed" and every["alice"]["total_jobs"] == 1, every
    assert all(r["total_jobs"] == 0 for name, r in every.items() if name != "alice"), every
    assert every["gone"]["status"] == "removed", every
