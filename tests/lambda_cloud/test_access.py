"""`invoke ssh`, `exec`, `sync` and `env` on a remote provider: a Lambda cluster whose head is the
loopback sshd of the fake bed (the spec's proxy command sends every connection there), reached with
the cluster's own key and its pinned host key, exactly as `up` left it."""

from __future__ import annotations

import http.server
import json
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import yaml

from tests.conftest import run_invoke
from tests.lambda_cloud.sshd import LocalSshd
from tests.waiting import wait_until

CLUSTER = "lacc"
HEAD_IP = "198.51.100.23"  # TEST-NET-2: never dialled, the proxy command goes to loopback


@pytest.fixture(scope="module")
def head(real_daemon: None, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSshd]:
    server = LocalSshd(tmp_path_factory.mktemp("sshd-access"))
    yield server
    server.stop()


@pytest.fixture
def spec(head: LocalSshd, rf_home: Path, tmp_path: Path) -> Path:
    """A Lambda cluster that is "up": its state names a head instance, its key is authorized."""
    from infra.core import auth, ssh, state
    from infra.providers.lambda_cloud.records import Instance

    path = tmp_path / f"{CLUSTER}.yaml"
    path.write_text(yaml.safe_dump({
        "provider": "lambda", "ssh_user": "root", "ssh_proxy_command": head.proxy_command,
        "head": {"choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
        "workers": {"count": 0, "choices": [{"instance_type": "cpu_4x_general",
                                             "region": "us-west-1"}]}}))
    head.authorize(ssh.ensure_keypair(CLUSTER).public_key, restrict=False)
    current = state.State.new(state.state_path(CLUSTER), CLUSTER, "lambda")
    current.add("i-head", Instance(name=f"{CLUSTER}-head", ip=HEAD_IP))
    current.set_info(head_ip=HEAD_IP, address=f"{HEAD_IP}:6379")
    auth.ensure_token(current)
    return path


def _invoke(task: str, spec: Path, *args: str, input: str | None = None
            ) -> tuple[int, str, str]:
    done = run_invoke(task, "--cluster", str(spec), *args, input=input, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_ssh_exec_sync_through_the_pinned_head(spec: Path, rf_home: Path, tmp_path: Path) -> None:
    code, out, err = _invoke("ssh", spec, input="echo via=${SSH_CONNECTION:+ssh}\nexit 4\n")
    assert code == 4 and "via=ssh" in out, err
    known = rf_home / "keys" / CLUSTER / "known_hosts"
    pinned = subprocess.run(["ssh-keygen", "-F", HEAD_IP, "-f", str(known)], capture_output=True,
                            check=False)
    assert pinned.returncode == 0, "the head's key is pinned in the cluster's known_hosts"

    # Over SSH, with the command's exit status; Ray's own tools on the head find its GCS and its
    # copy of the token.
    code, out, err = _invoke("exec", spec, "--", "echo $SSH_CONNECTION | wc -w; echo "
                             '"$RAY_ADDRESS $RAY_AUTH_MODE $RAY_AUTH_TOKEN_PATH"; exit 9')
    connection, ray_env = out.strip().split("\n")
    assert (code, connection.strip()) == (9, "4"), err
    assert ray_env.split() == [f"{HEAD_IP}:6379", "token",
                               str(Path("~root/.rayfleet/ray-token").expanduser())], err

    source = tmp_path / "data"
    source.mkdir()
    (source / "x.bin").write_bytes(b"\x00\x01rayfleet")
    remote = tmp_path / "on-head"
    code, _, err = _invoke("sync", spec, "up", f"{source}/", str(remote))
    assert code == 0, err
    assert (remote / "x.bin").read_bytes() == b"\x00\x01rayfleet"
    code, _, err = _invoke("sync", spec, "down", str(tmp_path / "back"), f"{remote}/x.bin")
    assert code == 0, err
    assert (tmp_path / "back").read_bytes() == b"\x00\x01rayfleet"

    # A head whose key changed is refused, by ssh and rsync alike.
    host, kind, _ = known.read_text().split()[:3]
    known.write_text(f"{host} {kind} AAAAC3NzaC1lZDI1NTE5AAAAIK2Vl0GnYLwU8DRa2F6I5ZKw8xk3aA1S5o6"
                     "3xk1m0x7b\n")
    code, out, err = _invoke("exec", spec, "--", "echo SHOULD-NOT-RUN")
    assert code != 0 and "SHOULD-NOT-RUN" not in out and "CHANGED" in err.upper()
    code, _, err = _invoke("sync", spec, "up", f"{source}/", str(remote))
    assert code != 0


class _Dashboard(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps({"path": self.path}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_env_opens_one_tunnel_for_the_job_api_and_ray_client(
        spec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.cli import access
    from infra.core import tunnels
    from infra.providers.lambda_cloud import raycluster

    # The "head" is this machine: stand-ins for its dashboard and Ray Client server on loopback.
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard) for _ in range(2)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(raycluster, "DASHBOARD_PORT", servers[0].server_address[1])
    monkeypatch.setattr(raycluster, "CLIENT_PORT", servers[1].server_address[1])
    try:
        access.env(None, str(spec), close=False)
        first = capsys.readouterr()
        values = dict(item.split("=", 1) for item in first.out.split()[1:])
        assert set(values) == {"RAY_ADDRESS", "RAY_API_SERVER_ADDRESS", "RAY_AUTH_MODE",
                               "RAY_AUTH_TOKEN_PATH"}
        assert values["RAY_AUTH_MODE"] == "token"
        assert values["RAY_ADDRESS"].startswith("ray://127.0.0.1:")
        assert "job API" in first.err and "Ray Client" in first.err
        api = values["RAY_API_SERVER_ADDRESS"]
        assert requests.get(f"{api}/api/version", timeout=5).json() == {"path": "/api/version"}

        access.env(None, str(spec), close=False)
        again = capsys.readouterr()
        assert again.out == first.out and "still open" in again.err, "the tunnel is reused"
        record = json.loads(tunnels.record_path(CLUSTER).read_text())

        access.env(None, str(spec), close=True)
        closed = capsys.readouterr()
        assert closed.out.startswith("unset RAY_ADDRESS")
        assert not tunnels.record_path(CLUSTER).exists()
        deadline_ok = _gone(record["pid"])
        assert deadline_ok, "the tunnel process ended"
    finally:
        tunnels.close(CLUSTER)
        for server in servers:
            server.shutdown()


def _gone(pid: int) -> bool:
    wait_until(lambda: not Path(f"/proc/{pid}").exists() or "Z" in _proc_state(pid),
               f"process {pid} to end", timeout=5, interval=0.1)
    return True


def _proc_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return "Z"


def test_a_serve_forward_joins_the_env_tunnel_on_the_same_local_ports(
        spec: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`invoke serve-url` prints a URL for other programs: it needs the detached tunnel, and adding
    Serve's port to it must not move the ports a shell got from `invoke env` earlier."""
    from infra.cli import access
    from infra.core import tunnels
    from infra.providers.lambda_cloud import raycluster

    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Dashboard) for _ in range(3)]
    for server in servers:
        threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(raycluster, "DASHBOARD_PORT", servers[0].server_address[1])
    monkeypatch.setattr(raycluster, "CLIENT_PORT", servers[1].server_address[1])
    serve_port = servers[2].server_address[1]
    try:
        access.env(None, str(spec), close=False)
        values = dict(item.split("=", 1) for item in capsys.readouterr().out.split()[1:])
        first_pid = json.loads(tunnels.record_path(CLUSTER).read_text())["pid"]

        local = access.forward(None, str(spec), "serve", serve_port)
        assert "opened" in capsys.readouterr().err
        assert requests.get(f"http://127.0.0.1:{local}/x", timeout=5).json() == {"path": "/x"}
        api = values["RAY_API_SERVER_ADDRESS"]
        assert requests.get(f"{api}/api/version", timeout=5).json() == {"path": "/api/version"}
        record = json.loads(tunnels.record_path(CLUSTER).read_text())
        assert record["pid"] != first_pid and _gone(first_pid), "one tunnel per cluster"
        assert set(record["remote"]) == {"dashboard", "client", "serve"}

        # Both callers now reuse it as it is.
        assert access.forward(None, str(spec), "serve", serve_port) == local
        assert "still open" in capsys.readouterr().err
        access.env(None, str(spec), close=False)
        assert dict(item.split("=", 1) for item in capsys.readouterr().out.split()[1:]) == values
        assert json.loads(tunnels.record_path(CLUSTER).read_text())["pid"] == record["pid"]
    finally:
        tunnels.close(CLUSTER)
        for server in servers:
            server.shutdown()
