"""The pacer's account-wide part (pacing.Pacer): when the next request and the next launch may
go, which request holds the turn, and the launches waiting, shared by every process of this
machine's user that uses the same API key at the same endpoint (issue 48: several autoscalers on
one head pace together, one pacer for the account, not one per process).

It lives in a small JSON file under a directory only its user can write (`pacing_dir`), named by a
hash of the endpoint and the key, never the key; the kernel's `flock` on it serializes its readers
and writers. Times are this machine's `time.monotonic()` (CLOCK_MONOTONIC, the same for every process of one
kernel); the file also records the kernel's boot id, so that the times of a previous boot are
ignored instead of read as a far future. A holder that crashed leaves no lock behind (the kernel
drops a dead process's `flock`), and the turn it held is taken back by the pacer (`alive`).
Without a usable directory the state lives in this process only (`Memory`), as it did before.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import logging
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

logger = logging.getLogger(__name__)

#: Overrides where the state files live (default `DEFAULT_DIR` in the user's home).
DIR_VARIABLE = "LAMBDA_PACING_DIR"
DEFAULT_DIR = Path("~/.rayfleet/lambda-pacing")
#: Deadlines further ahead than this are corrupt or from a changed clock: ignored.
HORIZON = 3600.0
#: A state file nobody wrote for this long (seconds) is removed (`prune`).
STALE = 86400.0


@dataclass
class Shared:
    """What every process pacing one account must agree on (monotonic seconds)."""

    #: When the next request of any kind may go (Lambda's request interval after the latest
    #: arrival, or a 429's deferral), and the next launch.
    next_prompt: float = 0.0
    next_launch: float = 0.0
    #: The request holding the turn ("pid:thread:pacer"), whether it is a launch, when it took
    #: the turn and when its last byte was written (None: not yet).
    owner: str | None = None
    owner_launch: bool = False
    taken_at: float = 0.0
    written_at: float | None = None
    #: Launches waiting for their turn, by process id (a plain request that would delay one
    #: waits behind it, whichever process sends it).
    launchers: dict[str, int] = field(default_factory=dict)


class Store(Protocol):
    def open(self) -> contextlib.AbstractContextManager[Shared]: ...


class Memory:
    """The state of one process (callers hold the pacer's thread lock)."""

    def __init__(self) -> None:
        self.shared = Shared()

    @contextlib.contextmanager
    def open(self) -> Iterator[Shared]:
        yield self.shared


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return os.uname().nodename


def _load(text: str, boot: str) -> Shared:
    """The state in `text`; a fresh one if it is unreadable (a writer died mid-write) or from
    another boot. Deadlines beyond `HORIZON` are dropped."""
    try:
        data: dict[str, Any] = json.loads(text) if text else {}
        if data.pop("boot", None) != boot:
            return Shared()
        names = {f.name for f in dataclasses.fields(Shared)}
        shared = Shared(**{k: v for k, v in data.items() if k in names})
    except (ValueError, TypeError):
        return Shared()
    limit = time.monotonic() + HORIZON
    shared.next_prompt = min(float(shared.next_prompt), limit)
    shared.next_launch = min(float(shared.next_launch), limit)
    return shared


class StateFile:
    """One account's state in a file, read and written whole under the kernel's `flock` on it
    (what `filelock` takes too, without its 0.5 ms of bookkeeping per turn: a request takes three
    turns, 0.1 ms here)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.boot = _boot_id()
        self._fd = -1
        self._pid = 0
        #: Where this process paces once the file cannot be opened any more (its directory went).
        self._alone: Memory | None = None

    def _descriptor(self) -> int:
        """The file, opened once per process: a forked child shares its parent's open file, and
        with it the parent's lock, so it opens its own."""
        if self._pid != os.getpid():
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            self._pid = os.getpid()
        return self._fd

    def __del__(self) -> None:
        if self._pid == os.getpid():
            with contextlib.suppress(OSError):
                os.close(self._fd)

    def _locked(self) -> int | None:
        """The file's descriptor, locked; None once it cannot be opened (its directory removed):
        requests must not fail for it, so this process then paces alone (logged once)."""
        try:
            fd = self._descriptor()
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_nlink == 0:  # removed as stale (`prune`): the account's anew
                os.close(fd)
                self._pid = 0
                fd = self._descriptor()
                fcntl.flock(fd, fcntl.LOCK_EX)
            return fd
        except OSError as exc:
            if self._alone is None:
                logger.warning("Lambda pacing: this process paces alone from now on (%s)", exc)
                self._alone = Memory()
            return None

    @contextlib.contextmanager
    def open(self) -> Iterator[Shared]:
        fd = self._locked()
        if fd is None:
            assert self._alone is not None
            with self._alone.open() as alone:
                yield alone
            return
        try:
            text = os.pread(fd, 1 << 16, 0).decode(errors="replace")
            shared = _load(text, self.boot)
            yield shared
            new = json.dumps({"boot": self.boot, **dataclasses.asdict(shared)})
            if new != text:
                data = new.encode()
                os.pwrite(fd, data, 0)
                os.ftruncate(fd, len(data))
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)


def pacing_dir() -> Path:
    """The directory of the state files: `LAMBDA_PACING_DIR`, else ~/.rayfleet/lambda-pacing;
    made 0700 if missing. Refused if another user owns it or others may write it: whoever writes
    the state can stall every request of this account."""
    raw = os.environ.get(DIR_VARIABLE, "").strip()
    path = Path(raw or DEFAULT_DIR).expanduser()
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.geteuid() or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise PermissionError(f"{path} ({DIR_VARIABLE}): must be yours and writable by you alone "
                              f"(mode {stat.S_IMODE(info.st_mode):o}); chmod 700 it")
    return path


def account_name(url: str, api_key: str) -> str:
    """The state's file name for this endpoint and key: a hash, from which the key cannot be
    read back (the key is a long random secret)."""
    digest = hashlib.sha256(f"rayfleet-lambda-pacing\0{url}\0{api_key}".encode()).hexdigest()
    return digest[:32]


def prune(directory: Path, keep: Path) -> None:
    """Remove the state files nobody wrote for `STALE` seconds (keys no longer used, a test's
    fake), each under its lock: a process that still holds one opens the account's anew."""
    cutoff = time.time() - STALE
    for path in directory.glob("*.json"):
        with contextlib.suppress(OSError):
            if path == keep or path.stat().st_mtime >= cutoff:
                continue
            fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                if os.fstat(fd).st_mtime < cutoff:
                    path.unlink()
            finally:
                os.close(fd)


def account_store(url: str, api_key: str) -> Store:
    """The account's shared state on this machine, or this process's own if there is no usable
    directory for it (logged: requests may then meet 429s, which are waited out)."""
    try:
        directory = pacing_dir()
        path = directory / f"{account_name(url, api_key)}.json"
        prune(directory, path)
        return StateFile(path)
    except OSError as exc:
        logger.warning("Lambda pacing: this process paces alone (%s)", exc)
        return Memory()


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's counts: signalling it is merely refused)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
