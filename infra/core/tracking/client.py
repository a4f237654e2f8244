"""The cluster's MLflow tracking server from this machine: credentials and the client side.

`tracking: mlflow` in a spec makes `up` start a real `mlflow server` beside the Ray head: a SQLite
backend store, artifacts served by the server itself (`--serve-artifacts`), and MLflow's own basic
auth. Its secrets travel like the Ray token: random values in 0600 files under
`.rayfleet/keys/<cluster>/`, read by the processes that need them and put into their environment,
never on a command line, in a rendered file, in state or in a job's runtime env.

The server runs under a small supervisor in the node package (`python -m infra.node.tracking
--config FILE`), so that the same code runs on any head. Its config lives in the cluster's own
directory, so the provider's process markers find the supervisor and, as its descendants, the
server's processes; teardown and autodown stop them with the rest of the cluster. The store itself
lives outside that directory and survives them.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.node.tracking import (
    CONFIG_FILE,
    USERNAME,
    ServerConfig,
    TrackingError,
    node_env,
    read_secret,
)

__all__ = ["CONFIG_FILE", "USERNAME", "ServerConfig", "TrackingError", "node_env"]

PASSWORD_FILE = "mlflow-password"
SECRET_KEY_FILE = "mlflow-flask-secret"


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
    return read_secret(path)


# --- client side -------------------------------------------------------------------------------

def _auth(password_file: Path) -> tuple[str, str]:
    return USERNAME, read_password(password_file)


def answering(url: str, timeout: float = 2.0) -> bool:
    import requests

    try:
        return requests.get(f"{url}/health", timeout=timeout).status_code == 200
    except requests.RequestException:
        return False


#: What `count_runs` gives each request: a slow answer from a busy head is not a dead server. (A CI
#: run at load 13 once saw `status` fail to count the runs of a healthy server; its reason was not
#: kept. A cold search measured under 16 busy processes here took 0.85 s, so the 10 s before are
#: not proven to be the cause: the e2e check now prints the reason if it happens again.)
SEARCH_TIMEOUT_S = 30.0


def count_runs(url: str, password_file: Path, timeout: float = SEARCH_TIMEOUT_S) -> int:
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
