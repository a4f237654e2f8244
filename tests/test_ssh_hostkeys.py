"""Host keys (infra/core/ssh.py): instances pinned on first contact, configured hosts checked strictly,
a changed key refused in one line by paramiko and OpenSSH alike. Real sshd servers on loopback."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import ssh, tunnels
from tests.lambda_cloud.sshd import LocalSshd

# Never dialled: every connection goes through a proxy command to a loopback sshd. Two servers
# with different host keys behind one name are "the same host, reinstalled or impersonated".
HOST = "198.51.100.23"


@pytest.fixture(scope="module")
def servers(real_daemon: None, tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[tuple[LocalSshd, LocalSshd]]:
    first = LocalSshd(tmp_path_factory.mktemp("sshd-first"))
    second = LocalSshd(tmp_path_factory.mktemp("sshd-second"))
    yield first, second
    first.stop()
    second.stop()


def _target(server: LocalSshd, known_hosts: Path, policy: ssh.HostKeyPolicy = "accept-new"
            ) -> ssh.SshTarget:
    pair = ssh.ensure_keypair("hostkeys")
    server.authorize(pair.public_key, restrict=False)
    return ssh.SshTarget(HOST, "root", pair.private_path, proxy_command=server.proxy_command,
                         known_hosts=known_hosts, host_key_policy=policy)


def test_first_contact_pins_then_a_changed_key_is_refused(
        servers: tuple[LocalSshd, LocalSshd], rf_home: Path) -> None:
    known = ssh.cluster_known_hosts("hostkeys")
    original = _target(servers[0], known)
    assert ssh.run(original, "echo hi", check=True).stdout == "hi\n"
    pinned = known.read_text().splitlines()
    assert len(pinned) == 1 and pinned[0].startswith(f"{HOST} ssh-ed25519 ")
    assert ssh.run(original, "true").ok and known.read_text().splitlines() == pinned

    impostor = dataclasses.replace(original, proxy_command=servers[1].proxy_command)
    _target(servers[1], known)  # authorise our key there too: only the host key differs
    for attempt in (lambda: ssh.run(impostor, "true"),
                    lambda: ssh.wait_until_ready([impostor], timeout=30, interval=0.1)):
        with pytest.raises(ssh.HostKeyError) as caught:
            attempt()
        message = str(caught.value)
        assert "\n" not in message and HOST in message and "CHANGED" in message
    assert known.read_text().splitlines() == pinned, "the new key must not be pinned"

    with pytest.raises(ssh.HostKeyError) as caught, ssh.tunnel(impostor, 22, timeout=10):
        pass
    assert "\n" not in str(caught.value) and HOST in str(caught.value)
    # The detached tunnel of `invoke env` starts the same way, so it says the same.
    with pytest.raises(ssh.HostKeyError) as caught:
        tunnels.open_tunnel("hostkeys", impostor, {"ssh": 22}, timeout=10)
    assert "\n" not in str(caught.value) and HOST in str(caught.value)
    assert not tunnels.record_path("hostkeys").exists()


def test_strict_hosts_must_be_known_already(servers: tuple[LocalSshd, LocalSshd],
                                            rf_home: Path, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    strict = _target(servers[0], known, policy="strict")
    with pytest.raises(ssh.HostKeyError, match="not in"):
        ssh.run(strict, "true")
    assert not known.exists()
    ssh.run(dataclasses.replace(strict, host_key_policy="accept-new"), "true", check=True)
    assert ssh.run(strict, "echo ok", check=True).stdout == "ok\n"
    options = ssh.openssh_options(strict)
    assert "StrictHostKeyChecking=yes" in options and f"UserKnownHostsFile={known}" in options
