"""The MLflow tracking server (infra/node/tracking.py, run as on a head) accepts only the Host
headers of the addresses it serves: its listen address (how nodes reach it) and the loopback names
an SSH tunnel's local end carries. A foreign name, or another private address (MLflow's default
would take any), is refused: that is what stops DNS rebinding."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from infra.node import tracking
from tests.waiting import wait_until

pytestmark = pytest.mark.slow  # a real MLflow server

#: A loopback address other than 127.0.0.1, so the listen address and the tunnel's names differ.
LISTEN = "127.0.0.2"


def _free_port(host: str) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, str]]:
    """A real `python -m infra.node.tracking` on LISTEN; (port, admin password)."""
    root = tmp_path_factory.mktemp("tracking")
    password = secrets.token_hex(16)
    for name, value in (("password", password), ("secret", secrets.token_hex(16))):
        (root / name).write_text(value)
        (root / name).chmod(0o600)
    port = _free_port(LISTEN)
    config = tracking.ServerConfig(host=LISTEN, port=port, store_dir=str(root / "store"),
                                   password_path=str(root / "password"),
                                   secret_key_path=str(root / "secret"),
                                   log_path=str(root / "mlflow.log"))
    config_path = root / tracking.CONFIG_FILE
    config.write(config_path)
    supervisor = subprocess.Popen([sys.executable, "-m", "infra.node.tracking", "--config",
                                   str(config_path)], cwd=Path(__file__).parents[2],
                                  stdin=subprocess.DEVNULL)

    def healthy() -> bool:
        assert supervisor.poll() is None, (root / "mlflow.log").read_text()[-2000:]
        try:
            return requests.get(f"http://{LISTEN}:{port}/health", timeout=5).ok
        except requests.ConnectionError:
            return False

    try:
        wait_until(healthy, "the MLflow server's /health", timeout=180, interval=0.5)
        yield port, password
    finally:
        supervisor.send_signal(signal.SIGTERM)  # the supervisor stops the server's process group
        try:
            supervisor.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.kill(supervisor.pid, signal.SIGKILL)
            supervisor.wait()


def _search(port: int, password: str, host_header: str) -> requests.Response:
    """An authenticated API call to the server, with the given Host header."""
    return requests.post(f"http://{LISTEN}:{port}/api/2.0/mlflow/experiments/search",
                         json={"max_results": 1}, auth=(tracking.USERNAME, password),
                         headers={"Host": host_header}, timeout=30)


def test_the_command_names_exactly_the_served_addresses() -> None:
    config = tracking.ServerConfig(host="10.0.0.5", port=5000, store_dir="/s", password_path="/p",
                                   secret_key_path="/k", log_path="/l")
    command = tracking.server_command(config)
    hosts = command[command.index("--allowed-hosts") + 1].split(",")
    assert hosts == ["10.0.0.5", "10.0.0.5:5000", "127.0.0.1", "127.0.0.1:*", "localhost",
                     "localhost:*"]
    assert "*" not in hosts


@pytest.mark.parametrize("host_header", ["{listen}:{port}", "{listen}", "127.0.0.1:{tunnel}",
                                         "localhost:{tunnel}"])
def test_the_listen_address_and_a_tunnels_names_are_served(server: tuple[int, str],
                                                           host_header: str) -> None:
    port, password = server
    header = host_header.format(listen=LISTEN, port=port, tunnel=port + 1)
    answer = _search(port, password, header)
    assert answer.status_code == 200, (header, answer.status_code, answer.text[:200])
    assert "experiments" in answer.json()


@pytest.mark.parametrize("host_header", ["evil.example", "evil.example:{port}", "10.1.2.3:{port}",
                                         "192.168.1.9", "{listen}:{other}"])
def test_a_foreign_host_header_is_refused(server: tuple[int, str], host_header: str) -> None:
    port, password = server
    header = host_header.format(listen=LISTEN, port=port, other=port + 1)
    answer = _search(port, password, header)
    assert answer.status_code == 403, (header, answer.status_code, answer.text[:200])
    assert "experiments" not in answer.text
