"""Per-cluster state: every resource rayfleet created, written before the next step starts.

One JSON file per cluster under `.rayfleet/state/`. Writes are atomic (infra/node/files.py: temp
file, fsync, rename, fsync of the folder), so a crash at any instant leaves either the old or the
new file, never a torn one, and `teardown` can always finish what `up` began. A lock file (flock)
keeps two `up`/`teardown` runs on one cluster from interleaving; the lock dies with its process, so
it can never go stale.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.core import paths
from infra.core.errors import StateError, StateLockedError
from infra.node import identity

# The one atomic write (imported here too, for the modules that write next to state).
from infra.node.files import WriteError, atomic_write, write_error

VERSION = 1

# A last line of defence: no code path should ever put key material into state.
_SECRET_MARKERS = ("PRIVATE KEY-----", "secret_")


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


@dataclass
class Resource:
    """Something rayfleet created and must remove at teardown."""

    #: What it is, e.g. "ray-head", "lambda-instance", "gcp-firewall", "slurm-job".
    kind: str
    #: The provider's identifier (instance id, job id, rule name, temp dir).
    id: str
    #: Facts needed to show or remove it (name, region, ip, ...); never secrets.
    attrs: dict[str, Any] = field(default_factory=dict)


class State:
    """The state of one cluster. Mutators save immediately."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self._data = data

    @classmethod
    def new(cls, path: Path, cluster: str, provider: str) -> State:
        data = {
            "version": VERSION,
            "cluster": cluster,
            "provider": provider,
            "cluster_id": identity.new_cluster_id(),
            "owner": identity.owner_mark(),
            "created_at": _now(),
            "updated_at": _now(),
            "resources": [],
            "info": {},
        }
        return cls(path, data)

    @classmethod
    def load(cls, path: Path) -> State | None:
        try:
            text = path.read_text()
        except FileNotFoundError:
            return None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise StateError(f"{path}: not valid JSON ({exc}); restore it from a backup") from None
        if data.get("version") != VERSION:
            raise StateError(
                f"{path}: state format version {data.get('version')!r} is not {VERSION}; "
                "use the rayfleet version that wrote it"
            )
        if not identity.is_cluster_id(data.get("cluster_id")):
            # A state from before cluster ids: its recorded resources stay ours (they are listed
            # here by exact id); from now on, what we create carries the new id. Saved with the
            # next change, so a read-only command never writes.
            data["cluster_id"] = identity.new_cluster_id()
        data.setdefault("owner", identity.owner_mark())
        return cls(path, data)

    @property
    def cluster(self) -> str:
        return str(self._data["cluster"])

    @property
    def cluster_id(self) -> str:
        """The random id that every resource of this cluster carries (see infra/node/identity.py)."""
        return str(self._data["cluster_id"])

    @property
    def owner(self) -> str:
        """The owner mark of whoever first ran `up` (see infra/node/identity.py)."""
        return str(self._data["owner"])

    @property
    def provider(self) -> str:
        return str(self._data["provider"])

    @property
    def info(self) -> dict[str, Any]:
        """Facts about the running cluster (address, dashboard, head ip); a copy."""
        return dict(self._data["info"])

    @property
    def empty(self) -> bool:
        return not self._data["resources"]

    def resources(self, kind: str | None = None) -> list[Resource]:
        return [
            Resource(r["kind"], r["id"], dict(r["attrs"]))
            for r in self._data["resources"]
            if kind is None or r["kind"] == kind
        ]

    def find(self, kind: str, id: str) -> Resource | None:
        return next((r for r in self.resources(kind) if r.id == id), None)

    def add(self, kind: str, id: str, **attrs: Any) -> Resource:
        """Record a created resource and save before returning (the caller's next step may fail)."""
        if self.find(kind, id) is not None:
            return self.update(kind, id, **attrs)
        self._data["resources"].append({"kind": kind, "id": id, "attrs": attrs})
        self.save()
        return Resource(kind, id, attrs)

    def update(self, kind: str, id: str, **attrs: Any) -> Resource:
        for r in self._data["resources"]:
            if r["kind"] == kind and r["id"] == id:
                r["attrs"].update(attrs)
                self.save()
                return Resource(kind, id, dict(r["attrs"]))
        raise KeyError(f"{kind} {id} is not in the state of {self.cluster}")

    def remove(self, kind: str, id: str) -> None:
        self._data["resources"] = [
            r for r in self._data["resources"] if not (r["kind"] == kind and r["id"] == id)
        ]
        self.save()

    def set_info(self, **values: Any) -> None:
        self._data["info"].update(values)
        self.save()

    def clear_info(self) -> None:
        self._data["info"] = {}
        self.save()

    def save(self) -> None:
        self._data["updated_at"] = _now()
        text = json.dumps(self._data, indent=2, sort_keys=True) + "\n"
        if any(marker in text for marker in _SECRET_MARKERS):
            raise StateError(f"refusing to write key material into {self.path}")
        atomic_write(self.path, text)

    def delete(self) -> None:
        """Forget the cluster: only once every resource is gone."""
        if not self.empty:
            kinds = sorted({r.kind for r in self.resources()})
            raise StateError(f"state of {self.cluster} still lists {', '.join(kinds)}")
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


def state_path(cluster: str) -> Path:
    return paths.state_dir() / f"{cluster}.json"


def lock_path_of(cluster: str) -> Path:
    """The cluster's lock file, created by the first `up` (or `teardown`) that takes it."""
    return paths.state_dir() / f"{cluster}.lock"


def holder_path_of(cluster: str) -> Path:
    """Who holds the cluster's lock (pid, host, command), written by each holder once it has it."""
    return paths.state_dir() / f"{cluster}.lock.holder"


def read(cluster: str) -> State | None:
    """The cluster's state without taking the lock (for status, dashboard, submit)."""
    return State.load(state_path(cluster))


@contextlib.contextmanager
def locked(cluster: str, provider: str, command: str) -> Iterator[State]:
    """Hold the cluster's lock and yield its state (a fresh one if there was none).

    The holder's pid, host and command are written beside the lock file so that a second run can say
    who it is waiting for.
    """
    from filelock import FileLock, Timeout

    lock_path = lock_path_of(cluster)
    try:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise write_error(lock_path.parent, exc) from None
    # Not blocking: a second run says who holds the lock instead of waiting behind it. The lock
    # is the kernel's (flock), so it dies with its holder: no stale lock after a crash.
    lock = FileLock(lock_path, timeout=0)
    try:
        lock.acquire()
    except Timeout:
        raise StateLockedError(
            f"cluster {cluster!r} is busy: {_holder(holder_path_of(cluster))}; wait for it to "
            "finish (or stop it)"
        ) from None
    except OSError as exc:
        raise write_error(lock_path, exc) from None
    try:
        holder_info = {"pid": os.getpid(), "host": socket.gethostname(), "command": command,
                       "since": _now(), "argv": " ".join(sys.argv[1:])[:200]}
        # Who holds the lock, for a second run's message, in a file of its own (filelock
        # truncates the lock file on every attempt); only that: on a full disk the lock still
        # works without it (the next write that matters fails with one clear line).
        with contextlib.suppress(WriteError):
            atomic_write(holder_path_of(cluster), json.dumps(holder_info))
        state = State.load(state_path(cluster)) or State.new(state_path(cluster), cluster, provider)
        if state.provider != provider:
            raise StateError(
                f"{state.path} belongs to a {state.provider} cluster, not {provider}; "
                f"tear that one down first or pick another cluster name"
            )
        yield state
    finally:
        lock.release()


def _holder(lock_path: Path) -> str:
    try:
        data = json.loads(lock_path.read_text() or "{}")
    except (OSError, json.JSONDecodeError):
        return "another rayfleet run holds its lock"
    return (
        f"`invoke {data.get('command', '?')}` (pid {data.get('pid', '?')} on "
        f"{data.get('host', '?')}) holds its lock since {data.get('since', '?')}"
    )
