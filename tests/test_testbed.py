"""The test bed itself: real SSH hosts in namespaces, real Slurm.

Each test checks one promise the provider tests build on; each would fail if that promise broke.
A Ray cluster across two hosts running tasks on both is the provider e2e tests' own check
(tests/slurm/test_e2e_cluster.py's two-node test, tests/lambda_cloud/test_e2e_cluster.py's spread
job), not repeated here with a Ray of its own.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import signal
import socket
import stat
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import paramiko
import pytest

from tests.testbed import net, registry
from tests.testbed.core import Testbed
from tests.testbed.hosts import ray_bin_dir
from tests.testbed.preflight import require
from tests.testbed.slurm import LocalSlurm, SlurmCluster
from tests.waiting import wait_until

# Also loaded by tests/conftest.py for the whole suite; named here so this file runs on its own too.
pytest_plugins = ["tests.testbed.fixtures"]
pytestmark = pytest.mark.slow


def test_ssh_into_each_host_by_ip_with_the_generated_key(testbed: Testbed) -> None:
    assert stat.S_IMODE(testbed.ssh_key_path.stat().st_mode) == 0o600
    seen = []
    for host in testbed.hosts:
        out = host.ssh("hostname; whoami; hostname -I; echo $RAY_USAGE_STATS_ENABLED; command -v ray",
                       check=True).stdout.split("\n")
        assert out[0] == host.hostname
        assert out[1] == "root"
        assert out[2].split() == [host.ip]
        assert out[3] == "0", "ssh sessions must not report Ray usage"
        assert out[4] == f"{ray_bin_dir()}/ray", "the tests' ray must be on the non-interactive PATH"
        seen.append(out[0])
    assert len(set(seen)) == len(testbed.hosts)
    # What Ray's cluster launcher uses: an interactive login shell, which runs ~/.bashrc.
    login = testbed.hosts[0].ssh("bash --login -c -i 'command -v ray'", check=True).stdout.strip()
    assert login.splitlines()[-1] == f"{ray_bin_dir()}/ray"


def test_paramiko_reaches_hosts_through_the_proxy_command(testbed: Testbed) -> None:
    host = testbed.hosts[-1]
    proxy = paramiko.ProxyCommand(testbed.proxy_command.replace("%h", host.ip).replace("%p", "22"))
    client = paramiko.SSHClient()
    client.load_host_keys(str(testbed.known_hosts_path))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(host.ip, username=host.ssh_user, key_filename=str(host.ssh_key_path), sock=proxy,
                       timeout=10, allow_agent=False, look_for_keys=False)
        _, stdout, _ = client.exec_command("hostname")
        assert stdout.read().decode().strip() == host.hostname
    finally:
        client.close()


def test_root_namespace_cannot_reach_the_test_subnet(testbed: Testbed) -> None:
    assert net.ip("route", "show", str(testbed.subnet)).startswith(f"unreachable {testbed.subnet}")
    route = subprocess.run(["ip", "route", "get", testbed.hosts[0].ip], capture_output=True, text=True,
                           check=False)
    assert route.returncode != 0 and "No route to host" in route.stderr
    with pytest.raises(OSError), socket.create_connection((testbed.hosts[0].ip, 22), timeout=2):
        pass


def test_hosts_have_private_processes_home_and_ray_dir(testbed: Testbed) -> None:
    h1, h2 = testbed.hosts[:2]
    # A distinctive duration makes the process recognisable in `ps`.
    h1.run("sleep 4242.5 >/dev/null 2>&1 & echo started > /tmp/ray/mine; echo x > ~/only-h1", check=True)
    try:
        assert "sleep 4242.5" in h1.run("ps -eo args").stdout
        assert "sleep 4242.5" not in h2.run("ps -eo args").stdout
        assert h2.run("test -e /tmp/ray/mine || test -e ~/only-h1").returncode != 0
        assert not Path("/root/only-h1").exists(), "writes to a host's home must stay in its overlay"
    finally:
        h1.run("pkill -f 'sleep 4242.5'; rm -f /tmp/ray/mine ~/only-h1")


def _leftovers(bed: Testbed, pids: list[int]) -> list[str]:
    found = [f"netns {n}" for n in net.list_netns() if n.startswith(f"rft{bed.run_id}-")]
    found += [f"route {r}" for r in net.routes_within(bed.subnet)]
    found += [f"pid {p}" for p in pids if registry.proc_start_time(p) is not None]
    found += [f"marked pid {p}" for p in registry.marked_pids({bed.run_id})]
    if (registry.DEFAULT_STATE_ROOT / "runs" / f"{bed.run_id}.json").exists():
        found.append("run record")
    return found


def test_teardown_leaves_no_namespace_route_or_process(make_testbed: Callable[[int], Testbed]) -> None:
    bed = make_testbed(2)
    bed.hosts[0].run("setsid sleep 3600 >/dev/null 2>&1 &", check=True)
    pids = [bed.client.pid1, *(h.pid1 for h in bed.hosts), *registry.marked_pids({bed.run_id})]
    assert len(registry.marked_pids({bed.run_id})) >= 2 * len(bed.hosts) + 1  # inits, sshds, sleep
    assert net.routes_within(bed.subnet, ours_only=True) == {bed.subnet}
    assert set(bed.netns_names) <= set(net.list_netns())
    bed.close()
    assert _leftovers(bed, pids) == []


def test_leftovers_of_a_killed_run_are_cleaned_by_the_next(tmp_path: Path) -> None:
    require("testbed")
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from tests.testbed.core import Testbed
        bed = Testbed(1, Path({str(tmp_path)!r}))
        print(bed.run_id, bed.subnet, flush=True)
        time.sleep(600)
    """)
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=root, stdout=subprocess.PIPE, text=True)
    reg = registry.Registry()
    try:
        run_id, subnet = (proc.stdout.readline() if proc.stdout else "").split()
    except BaseException:
        proc.kill()
        raise
    # The lock keeps test beds starting meanwhile (their start cleans stale runs too) out of the way.
    with reg.locked():
        # A crash, as far as the test bed can tell: no finalizer, no atexit.
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if proc.stdout:
            proc.stdout.close()
        prefix = f"rft{run_id}-"
        assert [n for n in net.list_netns() if n.startswith(prefix)], "the crash should leave namespaces"
        assert net.routes_within(ipaddress.ip_network(subnet), ours_only=True)
        done = reg.clean_stale()
    assert any(run_id in line for line in done)
    assert not [n for n in net.list_netns() if n.startswith(prefix)]
    assert not net.routes_within(ipaddress.ip_network(subnet))
    assert not registry.marked_pids({run_id})


def _wait_for_text(path: Path, needles: list[str], timeout: float = 30) -> str:
    """The file's text once it holds every needle; what it holds after `timeout` otherwise (the
    caller's assertion shows it)."""

    def text() -> str:
        with contextlib.suppress(FileNotFoundError):
            return path.read_text()
        return ""

    def complete() -> str | None:
        found = text()
        return found if all(n in found for n in needles) else None

    with contextlib.suppress(AssertionError):
        return wait_until(complete, f"{needles} in {path}", timeout=timeout, interval=0.1)
    return text()


def test_slurm_two_node_job_runs_on_both_hosts(slurm_cluster: SlurmCluster) -> None:
    out = slurm_cluster.jobs_dir / "hostnames-%j.out"
    job = slurm_cluster.sbatch("#!/bin/bash\nsrun hostname\n", "--nodes=2", "--ntasks-per-node=1",
                               f"--output={out}")
    slurm_cluster.wait_job(job, timeout=60)
    names = [h.hostname for h in slurm_cluster.nodes]
    text = _wait_for_text(Path(str(out).replace("%j", job)), names)
    assert sorted(text.split()) == sorted(names)


def test_scancel_ends_a_running_job(slurm_cluster: SlurmCluster) -> None:
    job = slurm_cluster.sbatch("#!/bin/bash\nsrun sleep 3131\n", "--nodes=2",
                               f"--output={slurm_cluster.jobs_dir}/sleep-%j.out")
    slurm_cluster.wait_job(job, {"RUNNING"}, timeout=60)
    slurm_cluster.run(f"scancel {job}", check=True)
    slurm_cluster.wait_job(job, None, timeout=30)
    for host in slurm_cluster.nodes:
        assert "sleep 3131" not in host.run("ps -eo args").stdout


def test_login_host_runs_slurm_commands_over_ssh(slurm_cluster: SlurmCluster) -> None:
    host = slurm_cluster.login_host
    job = host.ssh(f"sbatch --parsable --wrap hostname --output={slurm_cluster.jobs_dir}/login-%j.out",
                   check=True).stdout.strip()
    slurm_cluster.wait_job(job, timeout=60)
    text = _wait_for_text(slurm_cluster.jobs_dir / f"login-{job}.out", [slurm_cluster.node_names[0]])
    assert text.strip() in slurm_cluster.node_names


def test_local_slurm_runs_a_job_on_127_0_0_1(slurm_local: LocalSlurm) -> None:
    assert "127.0.0.1" in slurm_local.conf_path.read_text()
    # Straight from the test process: SLURM_CONF is all a client needs.
    done = subprocess.run(["sbatch", "--parsable", "--wrap", "hostname; echo $SLURM_JOB_NODELIST",
                           f"--output={slurm_local.jobs_dir}/local-%j.out"],
                          env={**os.environ, **slurm_local.env}, capture_output=True, text=True,
                          check=True, timeout=30)
    job = done.stdout.strip()
    slurm_local.wait_job(job, timeout=60)
    name = slurm_local.node_names[0]
    text = _wait_for_text(slurm_local.jobs_dir / f"local-{job}.out", [name])
    assert text.split() == [socket.gethostname(), name]


def test_testbed_comes_up_in_seconds(testbed: Testbed) -> None:
    # The fixture prints every phase (with -s, and in the terminal summary).
    assert testbed.timings["up"] < 10, testbed.timings
