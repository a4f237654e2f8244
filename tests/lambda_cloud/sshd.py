"""A private sshd on 127.0.0.1 that stands in for every fake Lambda instance (tests and bench).

Instances get TEST-NET addresses from the fake API; the spec's `ssh_proxy_command` (`nc 127.0.0.1
<port>`, which ignores %h) sends every SSH connection here instead, so nothing ever leaves loopback.
Keys are authorized with `restrict,command="/bin/true"`: a login succeeds (what the readiness
probe checks) but any command, `ray start` included, runs `true` on this machine instead.
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from tests.testbed.hosts import PYENV_ENV
from tests.waiting import wait_until


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalSshd:
    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = _free_port()
        self.authorized = workdir / "authorized_keys"
        self.authorized.write_text("")
        host_key = workdir / "host_key"
        key = Ed25519PrivateKey.generate()
        fd = os.open(host_key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(key.private_bytes(serialization.Encoding.PEM,
                                        serialization.PrivateFormat.OpenSSH,
                                        serialization.NoEncryption()))
        config = workdir / "sshd_config"
        config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {host_key}\n"
            f"AuthorizedKeysFile {self.authorized}\nStrictModes no\nUsePAM no\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nPidFile none\nMaxStartups 100:30:200\n"
            # Sessions here run this machine's ~/.bashrc (pyenv): see testbed.hosts.PYENV_ENV.
            f"SetEnv {' '.join(f'{k}={v}' for k, v in PYENV_ENV.items())}\n")
        Path("/run/sshd").mkdir(exist_ok=True)
        self.log = workdir / "sshd.log"
        self.process = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(config)],
                                        stdout=self.log.open("w"), stderr=subprocess.STDOUT)

        def answers() -> bool:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
            except OSError:
                return False
            return True

        try:
            wait_until(answers, "sshd to answer", timeout=10, interval=0.05)
        except AssertionError:
            self.stop()
            raise RuntimeError(f"sshd did not start: {self.log.read_text()[-500:]}") from None

    @property
    def proxy_command(self) -> str:
        return f"nc 127.0.0.1 {self.port}"

    def authorize(self, public_key: str, restrict: bool = True) -> None:
        """Let `public_key` in; unless `restrict` is False, its commands all run `true`."""
        options = 'restrict,command="/bin/true" ' if restrict else ""
        with self.authorized.open("a") as out:
            out.write(f"{options}{public_key}\n")

    def __enter__(self) -> LocalSshd:
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=5)
