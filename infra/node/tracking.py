"""The cluster's MLflow tracking server as it runs on the head: its config and its supervisor.

`python -m infra.node.tracking --config FILE` runs `mlflow server` in the foreground (a SQLite
backend store, artifacts served by the server itself, MLflow's own basic auth) with the admin
password and Flask secret read from 0600 files into its environment, never onto a command line.
It lives in the node package so it ships whole to any head (infra/core/shipping.py): on this machine for
a local cluster, over SFTP to a cloud head, in the batch script on Slurm. The laptop's side
(credentials, the client calls) is infra/core/tracking/client.py.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.node.errors import RayfleetError
from infra.node.files import atomic_write
from infra.node.serverproc import run_server
from infra.node.wire import VERSION, Wire

#: The tracking password's copy on a remote node, from the SSH user's home (0600). Here, below
#: both the laptop's tracking_remote (which puts it there) and privilege (which hands it to Ray's
#: user), so that neither has to import the other.
NODE_PASSWORD_PATH = "~/.rayfleet/mlflow-password"

#: The one user of the cluster's tracking server (MLflow's admin), for every node and client.
USERNAME = "rayfleet"
#: The supervisor's config, inside the cluster's own directory: the provider's process markers
#: then find the supervisor and, as its descendants, the server's processes.
CONFIG_FILE = "rayfleet-tracking.json"
class TrackingError(RayfleetError):
    """The cluster's tracking server is missing, not answering, or refused us."""


def read_secret(path: Path) -> str:
    try:
        value = path.read_text().strip()
    except OSError as exc:
        raise TrackingError(f"cannot read the tracking password {path} ({exc.strerror}); "
                            "run `invoke up` again to restore it") from None
    return value


@dataclass(frozen=True)
class ServerConfig(Wire):
    """What the supervisor needs to run one tracking server; no secrets, only their paths."""

    KIND = "the tracking server's config"

    host: str
    port: int
    #: The store: mlflow.db (runs, metrics, registry), auth.db (users), artifacts/.
    store_dir: str
    password_path: str
    secret_key_path: str
    #: Where the server's own output goes.
    log_path: str
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)



def node_env(url: str, password_file: str) -> tuple[dict[str, str], dict[str, str]]:
    """(plain, from_files) environment for `ray start`, so that every driver, worker and Serve
    replica on the node finds the server: `from_files` maps a variable to the 0600 file its value
    is read from when the node starts (the start script holds only the path)."""
    return ({"MLFLOW_TRACKING_URI": url, "MLFLOW_TRACKING_USERNAME": USERNAME},
            {"MLFLOW_TRACKING_PASSWORD": password_file})


def server_command(config: ServerConfig) -> list[str]:
    store = Path(config.store_dir)
    mlflow = Path(sys.executable).with_name("mlflow")
    # Without its script beside this interpreter (a node env that reuses a base install's
    # packages), the same interpreter's MLflow, never another one found on the PATH.
    program = [str(mlflow)] if mlflow.exists() else [sys.executable, "-m", "mlflow"]
    return [
        *program, "server", "--app-name", "basic-auth",
        "--host", config.host, "--port", str(config.port), "--workers", "1",
        "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
        "--serve-artifacts", "--artifacts-destination", str(store / "artifacts"),
        "--allowed-hosts", ",".join(allowed_hosts(config)),
    ]


def allowed_hosts(config: ServerConfig) -> list[str]:
    """The Host headers the server accepts (MLflow's DNS-rebinding check, exact or fnmatch):
    the address it listens on, as nodes name it (with and without the port), and the loopback
    names an SSH tunnel's local end carries, whose port is whatever the tunnel picked. Not
    MLflow's default, which also accepts every private address: a name that resolves to one
    (DNS rebinding) would get in."""
    hosts = [config.host, f"{config.host}:{config.port}"]
    for loopback in ("127.0.0.1", "localhost"):
        hosts += [loopback, f"{loopback}:*"]
    return list(dict.fromkeys(hosts))


#: Seconds MLflow keeps a checked login. Off (its default), every request checks the password's
#: scrypt hash again: 0.1 s of CPU each, which made the server the largest single CPU user of a
#: training run that logs metrics. Safe with one worker (`--workers 1`): a password change or a
#: user's deletion through the server drops the entry at once, and a refused login is never kept.
AUTH_CACHE_S = 60


def auth_ini(store: Path) -> Path:
    """MLflow's auth config: no secret in it (the admin password comes from the environment)."""
    path = store / "basic_auth.ini"
    atomic_write(
        path,
        "[mlflow]\n"
        "default_permission = NO_PERMISSIONS\n"
        f"database_uri = sqlite:///{store / 'auth.db'}\n"
        f"admin_username = {USERNAME}\n"
        "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
        f"auth_cache_ttl_seconds = {AUTH_CACHE_S}\n"
    )
    return path


def supervise(config: ServerConfig) -> int:
    """Run the server in the foreground with its secrets in its environment, below Ray's CPU
    priority; stop it on SIGTERM."""
    store = Path(config.store_dir)
    (store / "artifacts").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "MLFLOW_AUTH_CONFIG_PATH": str(auth_ini(store)),
        "MLFLOW_AUTH_ADMIN_PASSWORD": read_secret(Path(config.password_path)),
        "MLFLOW_FLASK_SERVER_SECRET_KEY": read_secret(Path(config.secret_key_path)),
        # MLflow's background job runner (GenAI scorers) starts seven worker processes that a
        # training cluster never uses.
        "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
    }
    # Its own process group (infra/node/serverproc.py): a stop reaches the server's uvicorn
    # worker too.
    return run_server(server_command(config), config.log_path, env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a cluster's MLflow tracking server.")
    parser.add_argument("--config", required=True)
    args = parser.parse_args(argv)
    # A head's daemon config also names the node package it came with (remote_head).
    config = ServerConfig.from_json(Path(args.config).read_text())
    # Runs under infra/node/supervise.py, which keeps the pid file and starts it again if it dies.
    return supervise(config)


if __name__ == "__main__":
    sys.exit(main())
