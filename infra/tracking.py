"""The cluster's MLflow tracking server: credentials, the supervisor that runs it, and its client side.

`tracking: mlflow` in a spec makes `up` start a real `mlflow server` beside the Ray head: a SQLite
backend store, artifacts served by the server itself (`--serve-artifacts`), and MLflow's own basic
auth. Its secrets travel like the Ray token: random values in 0600 files under
`.rayfleet/keys/<cluster>/`, read by the processes that need them and put into their environment,
never on a command line, in a rendered file, in state or in a job's runtime env.

The server runs under a small supervisor (`python -m infra.tracking --config FILE`): the config file
lives in the cluster's own directory, so the provider's process markers (the temp dir) find the
supervisor and, as its descendants, the server's processes; teardown and autodown stop them with
the rest of the cluster. The store itself lives outside that directory and survives them.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infra import paths
from infra.errors import RayfleetError

#: The one user of the cluster's tracking server (MLflow's admin), for every node and client.
USERNAME = "rayfleet"
PASSWORD_FILE = "mlflow-password"
SECRET_KEY_FILE = "mlflow-flask-secret"
#: The supervisor's config, inside the cluster's own directory (see the module docstring).
CONFIG_FILE = "rayfleet-tracking.json"


class TrackingError(RayfleetError):
    """The cluster's tracking server is missing, not answering, or refused us."""


def password_path(cluster: str) -> Path:
    return paths.keys_dir(cluster) / PASSWORD_FILE


def local_store(cluster: str) -> Path:
    """Where this machine keeps a cluster's tracking data (the store of a local cluster, and the
    copy of a remote one)."""
    return paths.home() / "tracking" / cluster


def _secret_file(path: Path, size: int) -> None:
    if path.exists():
        os.chmod(path, 0o600)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(secrets.token_hex(size))


def ensure_credentials(cluster: str) -> Path:
    """The password file of the cluster's tracking server (and its Flask secret), created once.

    The password of an existing store is kept: MLflow sets the admin password only when it creates
    its user database, so a new password for an old store would lock everyone out.
    """
    path = password_path(cluster)
    _secret_file(path, 24)
    _secret_file(paths.keys_dir(cluster) / SECRET_KEY_FILE, 32)
    return path


def read_password(path: Path) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise TrackingError(f"cannot read the tracking password {path} ({exc.strerror}); "
                            "run `invoke up` again to restore it") from None
    return value


@dataclass(frozen=True)
class ServerConfig:
    """What the supervisor needs to run one tracking server; no secrets, only their paths."""

    host: str
    port: int
    #: The store: mlflow.db (runs, metrics, registry), auth.db (users), artifacts/.
    store_dir: str
    password_path: str
    secret_key_path: str
    #: Where the server's own output goes.
    log_path: str


def write_config(path: Path, config: ServerConfig) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(config), indent=2))


def node_env(url: str, password_file: str) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, from_files) environment for `ray start`, so that every driver, worker and Serve
    replica on the node finds the server: `from_files` maps a variable to the 0600 file its value
    is read from when the node starts (the start script holds only the path)."""
    return ({"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": USERNAME},
            {"MLFLOW_TRACKING_PASSWORD": password_file})


def server_command(config: ServerConfig) -> list[str]:
    store = Path(config.store_dir)
    mlflow = Path(sys.executable).with_name("mlflow")
    return [
        str(mlflow) if mlflow.exists() else "mlflow", "server", "--app-name", "basic-auth",
        "--host", config.host, "--port", str(config.port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
        "--serve-artifacts", "--artifacts-destination", str(store / "artifacts"),
        # Nodes reach the server by the head's address, which the host-header check must accept.
        "--allowed-hosts", "*",
    ]


def _auth_ini(store: Path) -> Path:
    """MLflow's auth config: no secret in it (the admin password comes from the environment)."""
    path = store / "basic_auth.ini"
    path.write_text(
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{store / 'auth.db'}\n"
        f"admin_username = {USERNAME}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
    )
    return path


def supervise(config: ServerConfig) -> int:
    """Run the server in the foreground with its secrets in its environment; stop it on SIGTERM."""
    store = Path(config.store_dir)
    (store / "artifacts").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(_auth_ini(store)),
        "MLFLOW_AUTH_ADMIN_PASSWORD": read_password(Path(config.password_path)),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": read_password(Path(config.secret_key_path)),
        # MLflow's background job runner (GenAI scorers) starts seven worker processes that a
        # training cluster never uses.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    with open(config.log_path, "a") as log:
        # Its own process group: a stop reaches the server's uvicorn worker too, which would
        # otherwise outlive the supervisor, hold the port and escape the cluster's markers.
        child = subprocess.Popen(server_command(config), env=env, stdout=log,
                                 stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True)

    def stop(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=5)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return child.wait()


def start_detached(config_path: Path, cwd: Path, log_path: Path) -> None:
    """Start the supervisor in the background, detached from this terminal."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("a") as out:
        subprocess.Popen([sys.executable, "-m", "infra.tracking", "--config", str(config_path)],
                         cwd=cwd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                         start_new_session=True)


# --- client side -------------------------------------------------------------------------------

def _auth(password_file: Path) -> tuple[str, str]:
    return USERNAME, read_password(password_file)


def answering(url: str, timeout: float = 2.0) -> bool:
    import requests

    try:
        return requests.get(f"{url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


def count_runs(url: str, password_file: Path, timeout: float = 10.0) -> int:
    """Runs in every experiment of the server (MLflow's REST API, authenticated)."""
    import requests

    session = requests.Session()
    session.auth = _auth(password_file)
    try:
        answer = session.get(f"{url}/api/2.0/mlflow/experiments/search",
                             params={"max_results": 1000}, timeout=timeout)
        answer.raise_for_status()
        ids = [e["experiment_id"] for e in answer.json().get("experiments", [])]
        total, token = 0, None
        while ids:
            body: dict[str, Any] = {"experiment_ids": ids, "max_results": 1000}
            if token:
                body["page_token"] = token
            page = session.post(f"{url}/api/2.0/mlflow/runs/search", json=body, timeout=timeout)
            page.raise_for_status()
            data = page.json()
            total += len(data.get("runs", []))
            token = data.get("next_page_token")
            if not token:
                break
    except requests.RequestException as exc:
        reason = ("connection refused" if isinstance(exc, requests.ConnectionError)
                  else str(exc).splitlines()[0][:160])
        raise TrackingError(f"the tracking server at {url} did not answer ({reason}); "
                            "`invoke up` restarts it, its data is kept") from None
    return total


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a cluster's MLflow tracking server.")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    config = ServerConfig(**json.loads(Path(args.config).read_text()))
    return supervise(config)


if __name__ == "__main__":
    sys.exit(main())
