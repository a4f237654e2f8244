"""The one atomic write: every file rayfleet writes, here and on the laptop, goes through it.

A reader (or a crash) sees the old file or the new one, never a half-written one: the content goes
to a temporary file in the same folder, created with its final mode before any byte is in it,
flushed to disk, then renamed over the target.

Modes are deliberate: a file follows the writer's umask (a user who set 077, or a shared Slurm work
dir's group policy, gets what they asked for) unless the caller passes `mode`, which is then set
exactly, whatever the umask. Secrets pass 0o600; any other explicit mode needs its reason beside the
call. An OSError (disk full, permission denied, read-only
file system) leaves nothing behind and becomes one `WriteError` line naming the path and the fix.

The reading side of a file another process replaces that way: `SecretFile` (the gateway's tokens).
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from infra.node.errors import WriteError

_FIX = {
    errno.ENOSPC: "the disk is full: free some space there and run the command again",
    errno.EDQUOT: "the disk quota is used up: free some space there and run the command again",
    errno.EACCES: "permission denied: make the folder writable by you (or point RAYFLEET_HOME "
                  "elsewhere) and run the command again",
    errno.EPERM: "permission denied: make the folder writable by you (or point RAYFLEET_HOME "
                 "elsewhere) and run the command again",
    errno.EROFS: "the file system is read-only: point RAYFLEET_HOME at a writable folder and run "
                 "the command again",
}


def write_error(path: Path | str, exc: OSError) -> WriteError:
    """The one line for an OSError while writing `path`."""
    fix = _FIX.get(exc.errno or 0, f"{exc.strerror or type(exc).__name__}: fix that and run the "
                                   "command again")
    return WriteError(f"cannot write {path}: {fix}")


@contextlib.contextmanager
def atomic_file(path: Path | str, mode: int | None = None) -> Iterator[BinaryIO]:
    """`atomic_write` for content written as a stream (a tar of a store, say): the block writes to
    the yielded file, and `path` is replaced only when the block ends without an error.

    `mode` None: 0o666 narrowed by the umask, as `open()` would make it; else exactly `mode`."""
    path = Path(path)
    # Per process and thread: two writers of one file never share a temporary one.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666 if mode is None else mode)
        if mode is not None:
            # An explicit mode is exact: a 0o600 secret stays 0o600 whatever the umask (and a
            # leftover temp file of ours with other bits never widens it). Before any content.
            os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise write_error(path, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    # The rename itself survives a crash only once the folder is on disk too.
    with contextlib.suppress(OSError):
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)


def atomic_write(path: Path | str, data: str | bytes, mode: int | None = None) -> None:
    """Replace `path` with `data` (text is UTF-8), all or nothing; mode as in `atomic_file`."""
    with atomic_file(path, mode) as handle:
        handle.write(data.encode() if isinstance(data, str) else data)


class SecretFile:
    """A secret file's content, read again whenever the file changes (`rotate-token` replaces
    the cluster's token file while the gateway runs)."""

    def __init__(self, path: str | None) -> None:
        self.path = Path(path) if path else None
        self._stamp: tuple[int, int] | None = None
        self._value: str | None = None

    def read(self) -> str | None:
        if self.path is None:
            return None
        try:
            info = self.path.stat()
        except OSError:
            return self._value
        stamp = (info.st_mtime_ns, info.st_ino)
        if stamp != self._stamp:
            try:
                self._value = self.path.read_text().strip() or None
            except OSError:
                return self._value
            self._stamp = stamp
        return self._value
