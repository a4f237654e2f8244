"""Per-cluster state: every resource rayfleet created, written before the next step starts.

One JSON file per cluster under `.rayfleet/state/`. Writes are atomic (infra/node/files.py: temp
file, fsync, rename, fsync of the folder), so a crash at any instant leaves either the old or the
new file, never a torn one, and `teardown` can always finish what `up` began. A lock file (flock)
keeps two `up`/`teardown` runs on one cluster from interleaving; the lock dies with its process, so
it can never go stale.

What is recorded is typed: each resource kind's facts are an `Attrs` model declared next to its
provider (shared code never names one), the cluster's facts one `ClusterInfo`; both are read by
attribute. The JSON on disk is the same as before the types (tests/state_files/ holds files that
older code wrote, and they load). Keys this code does not know (written by a newer rayfleet, or by
hand) are kept and written back unchanged rather than refused or dropped: refusing would leave a
cluster that nobody can tear down with this version, dropping would forget what a newer version
needs to tear it down. Code of this version can never write an unknown key: `add`, `update` and
`set_info` refuse one (a typo in a field name fails the first test that reaches it).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar, overload

from pydantic import BaseModel, ConfigDict, ValidationError

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


class Attrs(BaseModel):
    """Facts needed to show or remove one resource (name, region, ip, ...); never secrets.

    Subclassed per kind, next to its provider, with `KIND` set; this base is the untyped view of a
    resource of any kind (its facts in `model_extra`). Frozen: a changed fact goes through
    `State.update`, which saves it.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    #: The resource kind these facts belong to, e.g. "ray-head", "lambda-instance".
    KIND: ClassVar[str] = ""

    #: The provider's own name for it, when it has one besides its id (listings show it).
    name: str | None = None


A = TypeVar("A", bound=Attrs)
B = TypeVar("B", bound=Attrs)


@dataclass(frozen=True)
class Resource(Generic[A]):
    """Something rayfleet created and must remove at teardown."""

    #: What it is, e.g. "ray-head", "lambda-instance", "gcp-firewall", "slurm-job".
    kind: str
    #: The provider's identifier (instance id, job id, rule name, temp dir).
    id: str
    #: Its facts, typed by kind.
    attrs: A

    def typed(self, model: type[B]) -> Resource[B]:
        """This resource with its facts read as `model` (its kind must be `model.KIND`)."""
        if self.kind != model.KIND:
            raise ValueError(f"{self.kind} {self.id} is not a {model.KIND}")
        return Resource(self.kind, self.id, _parse(model, self.kind, self.id,
                                                   self.attrs.model_dump(exclude_unset=True)))


class ClusterInfo(BaseModel):
    """Facts about the running cluster, each set by the step that learns it; None until then.

    Unknown keys are kept (see the module's docstring); `State.set_info` refuses them.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    #: The GCS address as the cluster's nodes see it (host:port).
    address: str | None = None
    #: The dashboard as the head sees it, or how to reach it.
    dashboard_url: str | None = None
    #: How the dashboard can be reached from outside (for `status`).
    dashboard_access: str | None = None
    #: The head machine's name, external IP and (batch systems) node name and job id.
    head: str | None = None
    head_ip: str | None = None
    head_node: str | None = None
    job_id: str | None = None
    #: Ray's autoscaler runs on the head.
    autoscaling: bool | None = None
    #: The spec file `up` was run with (for `list` and later commands).
    spec_path: str | None = None
    #: The cluster's token file, when it runs with token auth.
    auth_token_path: str | None = None
    #: The sharing gateway's URL that members' bundles point at.
    gateway_url: str | None = None
    #: When metrics history began (epoch seconds) and the scrape interval.
    metrics_since: float | None = None
    metrics_scrape_s: int | None = None
    #: Tracking: the store this machine keeps (kept by teardown) ...
    tracking_store: str | None = None
    #: ... or the store on the head, whether it outlives the cluster, and its last copy here.
    tracking_head_store: str | None = None
    tracking_durable: str | None = None
    tracking_bind: str | None = None
    tracking_copied_at: str | None = None


def _parse(model: type[A], kind: str, id: str, attrs: dict[str, Any]) -> A:
    try:
        return model.model_validate(attrs)
    except ValidationError as exc:
        raise StateError(f"{kind} {id}: {_problem(exc)}") from None


def _problem(exc: ValidationError) -> str:
    """One line for a validation error: the field and what is wrong with it."""
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"]) or "(whole record)"
    return (f"{where}: {first['msg']} (got {first.get('input')!r}); fix the state file by hand "
            "or restore it from a backup")


def _written(model: type[BaseModel], what: str, values: dict[str, Any]) -> None:
    """Refuse a field the model does not declare: code of this version never writes one."""
    unknown = sorted(set(values) - set(model.model_fields))
    if unknown:
        raise TypeError(f"{what} has no field {', '.join(unknown)}")


class State:
    """The state of one cluster. Mutators save immediately."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self._data = data

    @classmethod
    def new(cls, path: Path, cluster: str, provider: str, cluster_id: str | None = None) -> State:
        """A state for a new cluster, with a new random id unless `cluster_id` names one (a
        cluster whose resources already carry it)."""
        data = {
            "version": VERSION,
            "cluster": cluster,
            "provider": provider,
            "cluster_id": cluster_id or identity.new_cluster_id(),
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
    def info(self) -> ClusterInfo:
        """Facts about the running cluster (address, dashboard, head ip)."""
        try:
            return ClusterInfo.model_validate(self._data["info"])
        except ValidationError as exc:
            raise StateError(f"{self.path}: info.{_problem(exc)}") from None

    @property
    def empty(self) -> bool:
        return not self._data["resources"]

    @overload
    def resources(self) -> list[Resource[Attrs]]: ...
    @overload
    def resources(self, model: type[A]) -> list[Resource[A]]: ...

    def resources(self, model: type[Attrs] = Attrs) -> list[Resource[Any]]:
        """The resources of `model`'s kind with their facts typed, or every resource untyped."""
        return [
            Resource(r["kind"], r["id"], self._parsed(model, r))
            for r in self._data["resources"]
            if model is Attrs or r["kind"] == model.KIND
        ]

    def find(self, model: type[A], id: str) -> Resource[A] | None:
        return next((r for r in self.resources(model) if r.id == id), None)

    def add(self, id: str, attrs: A) -> Resource[A]:
        """Record a created resource and save before returning (the caller's next step may fail).
        A resource already recorded gets `attrs`' fields that were set."""
        model = type(attrs)
        _written(model, model.KIND, attrs.model_extra or {})
        values = attrs.model_dump(mode="json", exclude_unset=True)
        if self.find(model, id) is not None:
            return self.update(model, id, **values)
        self._data["resources"].append({"kind": model.KIND, "id": id, "attrs": values})
        self.save()
        return Resource(model.KIND, id, attrs)

    def update(self, model: type[A], id: str, **changes: Any) -> Resource[A]:
        """Change some facts of a recorded resource (the rest, known or not, stay) and save."""
        _written(model, model.KIND, changes)
        for r in self._data["resources"]:
            if r["kind"] == model.KIND and r["id"] == id:
                attrs = _parse(model, model.KIND, id, {**r["attrs"], **changes})
                r["attrs"] = attrs.model_dump(mode="json", exclude_unset=True)
                self.save()
                return Resource(model.KIND, id, attrs)
        raise KeyError(f"{model.KIND} {id} is not in the state of {self.cluster}")

    def remove(self, kind: str | type[Attrs], id: str) -> None:
        """Forget a resource (by its kind, or the model of its kind) and save."""
        kind = kind if isinstance(kind, str) else kind.KIND
        self._data["resources"] = [
            r for r in self._data["resources"] if not (r["kind"] == kind and r["id"] == id)
        ]
        self.save()

    def set_info(self, **values: Any) -> None:
        """Set some facts of the cluster (ClusterInfo's fields; the rest stay) and save."""
        _written(ClusterInfo, "the cluster's info", values)
        try:
            info = ClusterInfo.model_validate({**self._data["info"], **values})
        except ValidationError as exc:
            raise StateError(f"{self.path}: info.{_problem(exc)}") from None
        self._data["info"] = info.model_dump(mode="json", exclude_unset=True)
        self.save()

    def clear_info(self) -> None:
        self._data["info"] = {}
        self.save()

    def _parsed(self, model: type[A], record: dict[str, Any]) -> A:
        try:
            return _parse(model, record["kind"], record["id"], record["attrs"])
        except StateError as exc:
            raise StateError(f"{self.path}: {exc}") from None

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
