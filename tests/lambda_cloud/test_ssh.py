"""infra/core/ssh.py (shared by the Lambda, GCP and Slurm providers) against a real loopback sshd."""

from __future__ import annotations

import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra.core import ssh
from infra.node import rayproc
from tests.lambda_cloud.sshd import LocalSshd


@pytest.fixture(scope="module")
def open_sshd(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSshd]:
    server = LocalSshd(tmp_path_factory.mktemp("sshd-open"))
    yield server
    server.stop()


def test_keypair_is_private_and_stable(rf_home: Path) -> None:
    pair = ssh.ensure_keypair("kp")
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600
    assert stat.S_IMODE(pair.private_path.parent.stat().st_mode) == 0o700
    assert pair.private_path.parent == rf_home / "keys" / "kp"
    assert pair.public_key.startswith("ssh-ed25519 ") and pair.public_key.endswith(" rayfleet-kp")
    assert "PRIVATE" not in pair.public_key
    pair.private_path.chmod(0o644)
    again = ssh.ensure_keypair("kp")
    assert again.public_key == pair.public_key
    assert stat.S_IMODE(pair.private_path.stat().st_mode) == 0o600, "a loosened mode is repaired"
    assert ssh.ensure_keypair("other").public_key != pair.public_key


def test_expand_proxy() -> None:
    assert ssh.expand_proxy("nc %h %p # %r %% %x", "10.0.0.1", 22, "ubuntu") == \
        "nc 10.0.0.1 22 # ubuntu % %x"


def _target(server: LocalSshd, rf_home: Path, proxy: bool) -> ssh.SshTarget:
    pair = ssh.ensure_keypair("sshtest")
    server.authorize(pair.public_key, restrict=False)
    if proxy:  # the address is never dialled: the proxy command goes to loopback
        return ssh.SshTarget("198.51.100.77", "root", pair.private_path, proxy_command=server.proxy_command,
                             known_hosts=rf_home / "known_hosts")
    return ssh.SshTarget("127.0.0.1", "root", pair.private_path, port=server.port,
                         known_hosts=rf_home / "known_hosts")


@pytest.mark.parametrize("proxy", [False, True])
def test_probe_run_and_tunnel(open_sshd: LocalSshd, rf_home: Path, proxy: bool) -> None:
    target = _target(open_sshd, rf_home, proxy)
    ssh.wait_until_ready([target], timeout=10, interval=0.1)
    result = ssh.run(target, "echo out; echo err >&2; exit 3")
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    with pytest.raises(ssh.SshError, match="exited 1: boom"):
        ssh.run(target, "echo boom >&2; false", check=True)

    server = _hello_server(b"hello")
    remote_port = server.getsockname()[1]
    with ssh.tunnel(target, remote_port) as local_port:
        assert local_port != remote_port
        with socket.create_connection(("127.0.0.1", local_port), timeout=5) as conn:
            assert conn.recv(5) == b"hello"
    assert not rayproc.port_answers("127.0.0.1", local_port), "the tunnel ends with the block"
    server.close()


def test_a_tunnel_never_hands_out_a_port_someone_else_took(
        open_sshd: LocalSshd, rf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The port chosen free is taken by another process before ssh binds it (on a busy machine
    any bind to port 0 may pick it): that port answers, but not for us. The tunnel tries another
    port; what it yields reaches the head's service, never the squatter."""
    target = _target(open_sshd, rf_home, proxy=False)
    ours, squatter = _hello_server(b"head!"), _hello_server(b"other")
    taken = squatter.getsockname()[1]
    chosen = iter([taken])
    real = rayproc.free_port
    monkeypatch.setattr(rayproc, "free_port", lambda: next(chosen, None) or real())
    with ssh.tunnel(target, ours.getsockname()[1]) as local_port:
        assert local_port != taken
        with socket.create_connection(("127.0.0.1", local_port), timeout=5) as conn:
            assert conn.recv(5) == b"head!"
    ours.close()
    squatter.close()


def _hello_server(greeting: bytes) -> socket.socket:
    """A loopback server that greets every connection, on a port the kernel chose."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            conn.sendall(greeting)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_failures_name_the_host(open_sshd: LocalSshd, rf_home: Path) -> None:
    pair = ssh.ensure_keypair("nobody")  # never authorized
    denied = ssh.SshTarget("127.0.0.1", "root", pair.private_path, port=open_sshd.port,
                           known_hosts=rf_home / "known_hosts")
    reason = ssh.probe(denied)
    assert reason is not None and "root@127.0.0.1" in reason
    closed = ssh.SshTarget("127.0.0.1", "root", pair.private_path, port=rayproc.free_port(),
                           known_hosts=rf_home / "known_hosts")
    with pytest.raises(ssh.SshError, match="accepted no SSH login within 1s"):
        ssh.wait_until_ready([closed], timeout=1, interval=0.2)
    tunnel = ssh.tunnel(denied, 80, timeout=5)
    with pytest.raises(ssh.SshError, match=r"tunnel to 127\.0\.0\.1:80 via root@127\.0\.0\.1"), tunnel:
        pass
