"""`tracking: mlflow` on a head this machine reaches over SSH (Lambda, GCP): one mechanism for all.

- **The server**: `start` puts the tracking server (infra/node/tracking.py) on the head with
  `HeadAccess.ensure_daemon`, supervised like every head daemon: the password and Flask
  secret go over SFTP as 0600 files, the config names only paths, and the server listens on the
  head's private address at `TRACKING_PORT`, where the other nodes reach it (never on a port
  the cluster's firewall opens).
- **The nodes**: `node_env_prefix` is the shell prefix of every node's `ray start`: the URL and
  user as words, the password read from the node's 0600 copy (`NODE_PASSWORD_PATH`, which the
  provider's file mounts deliver like the Ray token) when the node starts. Every driver, worker
  and Serve replica inherits them; the rendered file and `ps` show only the file's path.
- **The data**: the store lives on the head (or on durable storage the provider mounts there).
  `copy_back` takes a consistent snapshot on the head (infra/node/tracking_snapshot.py) and
  unpacks it into `.rayfleet/tracking/<cluster>/`; the library's `teardown` (infra/app/) does so
  before any instance goes, or says in one line why it could not (`lost_or_kept`). `copy_note` is
  what `status` says of it.
- **From here**: `connect` opens the tunnels (dashboard, tracking, Serve) to the head
  (`HeadAccess.tunnels`, one login).

Core layer: never imports a provider, never branches on a provider's name. A provider passes its
head (`infra.core.head.HeadAccess`: how commands, files, daemons and tunnels get there) and addresses.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import shlex
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from infra.core import remote_head
from infra.core.endpoint import Endpoint
from infra.core.errors import RayfleetError
from infra.core.head import HeadAccess
from infra.core.metrics import prometheus as metrics
from infra.core.progress import Progress, Step, timed
from infra.core.state import State
from infra.core.tracking import client as tracking
from infra.node import tracking as node_tracking
from infra.node.tracking import ServerConfig

#: The tracking server's port on the head's private address (MLflow's usual port).
TRACKING_PORT = 5000
#: Ray Serve's HTTP port; its proxies bind the node's loopback, reached from here by a tunnel.
SERVE_PORT = 8000
#: The nodes' copy of the tracking password (0600), relative to the login user's home.
NODE_PASSWORD_PATH = node_tracking.NODE_PASSWORD_PATH
NODE_SECRET_KEY_PATH = "~/.rayfleet/mlflow-flask-secret"
#: The supervisor's config (and pid file beside it) on the head.
HEAD_CONFIG = "~/.rayfleet/tracking.json"
HEAD_LOG = "~/rayfleet/tracking.log"
#: The store on the head when the spec names no durable storage: it goes with the head.
HEAD_STORE = "rayfleet/tracking"
#: Where the snapshot tar lands on the head before this machine fetches it.
HEAD_SNAPSHOT = "rayfleet/tracking-snapshot.tar"


def node_url(head_private_ip: str) -> str:
    return f"http://{head_private_ip}:{TRACKING_PORT}"


def node_env_prefix(head_private_ip: str) -> str:
    """`VAR=value ` words for a node's `ray start`: the password is read from the node's 0600
    file by the shell that starts Ray, so it is in no command line and no rendered file."""
    plain, _ = tracking.node_env(node_url(head_private_ip), NODE_PASSWORD_PATH)
    words = "".join(f"{key}={shlex.quote(value)} " for key, value in plain.items())
    return words + f'MLFLOW_TRACKING_PASSWORD="$(cat {remote_head.home_word(NODE_PASSWORD_PATH)})" '


@dataclass(frozen=True)
class HeadStore:
    """Where the store lives on the head; `durable` names the storage that outlives the cluster
    (e.g. "Lambda file system 'shared'"), empty when it goes with the head."""

    path: str
    durable: str = ""


def start(state: State, head: HeadAccess, bind_host: str, store: HeadStore,
          progress: Progress) -> None:
    """Start (or keep) the tracking server on the head; record where its store lives."""
    password = tracking.ensure_credentials(state.cluster)
    secret = password.with_name(tracking.SECRET_KEY_FILE)
    home = head.run('printf %s "$HOME"', timeout=30, check=True).stdout.strip()
    store_dir = store.path if store.path.startswith("/") else f"{home}/{store.path}"
    config = ServerConfig(
        host=bind_host, port=TRACKING_PORT, store_dir=store_dir,
        password_path=f"{home}/{NODE_PASSWORD_PATH.removeprefix('~/')}",
        secret_key_path=f"{home}/{NODE_SECRET_KEY_PATH.removeprefix('~/')}",
        log_path=f"{home}/rayfleet/mlflow.log")
    secrets = {NODE_PASSWORD_PATH.removeprefix("~/"): password.read_bytes(),
               NODE_SECRET_KEY_PATH.removeprefix("~/"): secret.read_bytes()}
    state.set_info(tracking_head_store=store_dir, tracking_durable=store.durable or None,
                   tracking_bind=bind_host)
    with timed(progress, f"starting the MLflow tracking server on the head "
               f"({bind_host}:{TRACKING_PORT})"):
        head.ensure_daemon("infra.node.tracking", HEAD_CONFIG, config.to_json(indent=None), secrets,
                           log=HEAD_LOG)
    if store.durable:
        progress(Step(f"tracking data lives on {store.durable} ({store_dir}) and survives "
                      "teardown and autodown"))
    else:
        progress(Step("tracking data lives on the head and goes with the cluster at autodown; "
                      f"`invoke teardown` first copies it to {tracking.local_store(state.cluster)}"
                      "/ (name durable storage in the spec to keep it)"))


def plan_note(cluster: str, address: str, durable: str = "") -> str:
    """`plan`'s line about a cluster's tracking server on its head (`address`: which of the
    head's addresses it listens on, in the provider's words)."""
    where = (f"its store on {durable}, which outlives the cluster" if durable else
             "its store on the head: it goes with the cluster at autodown, and `invoke teardown` "
             f"copies it to {tracking.local_store(cluster)}/ first")
    return (f"MLflow tracking server on the head's {address} address, port {TRACKING_PORT} (no "
            f"firewall rule opens it; `invoke mlflow` tunnels to it), {where}")


def copy_back(head: HeadAccess, state: State) -> Path:
    """A consistent copy of the head's store in `.rayfleet/tracking/<cluster>/`; records
    `tracking_copied_at`. The previous copy is replaced only once the new one is complete."""
    store = state.info.tracking_head_store
    if not store:
        raise RayfleetError("no tracking store recorded for this cluster")
    final = tracking.local_store(state.cluster)
    final.parent.mkdir(parents=True, exist_ok=True)
    args = (f"--store {shlex.quote(store)} --out {remote_head.home_word(HEAD_SNAPSHOT)}")
    head.run_node("infra.node.tracking_snapshot", args, timeout=600, check=True)
    with tempfile.TemporaryDirectory(dir=final.parent, prefix=f".{state.cluster}-") as tmp:
        tar_path = Path(tmp) / "snapshot.tar"
        head.fetch(HEAD_SNAPSHOT, tar_path)
        unpacked = Path(tmp) / "store"
        unpacked.mkdir()
        with tarfile.open(tar_path) as tar:
            tar.extractall(unpacked, filter="data")
        if final.exists():
            final.rename(Path(tmp) / "old")
        unpacked.rename(final)
    state.set_info(tracking_copied_at=dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"))
    return final


def lost_or_kept(state: State) -> str:
    """What becomes of the head's store when `teardown` could not copy it (for its one line)."""
    durable = state.info.tracking_durable
    if durable:
        return f"it stays on {durable} ({state.info.tracking_head_store})"
    copied = state.info.tracking_copied_at
    return ("it goes with the cluster" + (f"; the last copy ({copied}) is in "
                                          f"{tracking.local_store(state.cluster)}" if copied else ""))


def copy_note(state: State) -> str | None:
    """What `status` says about where the tracking data is safe; None without a remote store."""
    if not state.info.tracking_head_store:
        return None
    durable = state.info.tracking_durable
    if durable:
        return f"tracking data on {durable} ({state.info.tracking_head_store}): survives teardown"
    copied = state.info.tracking_copied_at
    if copied:
        return (f"tracking data last copied at {copied} to {tracking.local_store(state.cluster)} "
                "(`invoke mlflow --copy` copies it again)")
    return ("tracking data never copied to this machine: it goes with the cluster at autodown; "
            "`invoke mlflow --copy` copies it now, `invoke teardown` first")


@contextlib.contextmanager
def connect(state: State, head: HeadAccess, dashboard_port: int, address: str,
            token_path: Path | None) -> Iterator[Endpoint]:
    """The cluster's endpoint through the head's tunnels (one login): the dashboard, Serve's
    HTTP proxy and, when the cluster has them, the tracking server and Prometheus."""
    bind = state.info.tracking_bind
    tracked = bool(bind and state.info.tracking_head_store)
    measured = bool(state.info.metrics_since)
    serve = ("127.0.0.1", SERVE_PORT)
    remotes = remote_head.services(("127.0.0.1", dashboard_port), serve,
                                   (str(bind), TRACKING_PORT) if tracked else None,
                                   # the head's Prometheus (infra/core/metrics/remote.py), on its loopback
                                   ("127.0.0.1", metrics.HEAD_PORT) if measured else None)
    with head.tunnels(remotes) as ports:
        yield remote_head.tunneled(ports, address, token_path, serve,
                                   tracking.password_path(state.cluster) if tracked else None,
                                   tracked, measured)


def remove_keys(state: State, folder: Path) -> None:
    """Teardown's removal of the cluster's key folder. A durable store keeps its users database,
    whose admin password MLflow sets once, so the tracking secrets then stay for the next `up`."""
    keep = {tracking.PASSWORD_FILE, tracking.SECRET_KEY_FILE} if state.info.tracking_durable \
        else set()
    if not keep:
        shutil.rmtree(folder, ignore_errors=True)
        return
    for path in folder.glob("*"):
        if path.name in keep:
            continue
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
