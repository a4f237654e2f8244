"""The one SSH command runner (`infra.core.ssh.execute`) reads stdout and stderr together: a command
that writes more than a channel window to stderr before its stdout ends must not stall until its
timeout. Both callers (`ssh.run`, Slurm's `SshRunner`) go through it. Real sshd on loopback."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import ssh
from infra.providers.slurm.remote import SshRunner
from infra.providers.slurm.spec import Submit
from tests.lambda_cloud.sshd import LocalSshd

MIB4 = 4 * 1024 * 1024
# Both orders: stderr first is what stalled a reader that drains stdout to its end first.
COMMANDS = {
    "stderr-first": f"head -c {MIB4} /dev/zero | tr '\\0' e >&2; head -c {MIB4} /dev/zero | tr '\\0' o",
    "stdout-first": f"head -c {MIB4} /dev/zero | tr '\\0' o; head -c {MIB4} /dev/zero | tr '\\0' e >&2",
}
# Far below what 8 MiB over loopback needs on a loaded machine, far above what a stall costs
# on the old code (the command never ends, so the read runs into this).
TIMEOUT = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, real_daemon: None) -> Iterator[LocalSshd]:
    with LocalSshd(tmp_path_factory.mktemp("sshd-runner")) as sshd:
        yield sshd


@pytest.fixture
def target(server: LocalSshd, rf_home: Path) -> ssh.SshTarget:
    pair = ssh.ensure_keypair("runner")
    server.authorize(pair.public_key, restrict=False)
    return ssh.SshTarget("127.0.0.1", "root", pair.private_path, proxy_command=server.proxy_command,
                         known_hosts=ssh.cluster_known_hosts("runner"))


def _check(result: ssh.Result) -> None:
    assert result.ok, result.stderr[-200:]
    assert len(result.stdout) == MIB4 and set(result.stdout) == {"o"}
    assert len(result.stderr) == MIB4 and set(result.stderr) == {"e"}


@pytest.mark.parametrize("order", sorted(COMMANDS))
def test_run_drains_both_streams(target: ssh.SshTarget, order: str) -> None:
    _check(ssh.run(target, COMMANDS[order], timeout=TIMEOUT))


@pytest.mark.parametrize("order", sorted(COMMANDS))
def test_slurm_runner_drains_both_streams_and_feeds_stdin(target: ssh.SshTarget, order: str) -> None:
    runner = SshRunner(target, slurm_conf=None, login_shell=False, submit=Submit())
    try:
        _check(runner.run(COMMANDS[order], timeout=TIMEOUT))
        # The same connection runs the next command; stdin arrives and ends (EOF).
        assert runner.run("cat; echo end", input="fed\n").stdout == "fed\nend\n"
    finally:
        runner.close()


def test_a_command_past_its_timeout_ends_the_read_at_the_timeout(target: ssh.SshTarget) -> None:
    started = time.monotonic()
    with pytest.raises(ssh.SshError, match="did not finish") as caught:
        ssh.run(target, "echo partial; echo warning >&2; sleep 120", timeout=2)
    assert "\n" not in str(caught.value)
    # Both readers end with the timeout, not with the command (120 s).
    assert time.monotonic() - started < 60
