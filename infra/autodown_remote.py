"""Putting the autodown watcher (infra/autodown.py) on a remote head over SSH, and reading its marker.

Used by providers whose head this machine reaches over SSH (Lambda, GCP). Copies the watcher and the
few modules it imports into `~/rayfleet/autodown-pkg` on the head, writes its config and any secret
the removal action needs (an API key) as 0600 files through SFTP (never on a command line), and
starts it detached unless one already runs. `read_marker` fetches the marker for `status`, which
caches it on this machine so that the next `status` can still say when the cluster removed itself.
"""

from __future__ import annotations

import json
import shlex

from infra import autodown, paths, ssh
from infra.errors import RayfleetError

#: On the head, relative to the login user's home.
PKG_DIR = "rayfleet/autodown-pkg"
#: What every watcher imports; a provider adds its action module and what that imports.
CORE_FILES = ["infra/__init__.py", "infra/errors.py", "infra/net.py", "infra/identity.py",
              "infra/autodown.py", "infra/providers/__init__.py"]


def _put(sftp: object, remote: str, data: bytes, mode: int) -> None:
    """Write a file on the head: created with `mode` before any byte is in it, then renamed."""
    tmp = f"{remote}.rayfleet-tmp"
    with sftp.open(tmp, "wb") as handle:  # type: ignore[attr-defined]
        handle.chmod(mode)
        handle.write(data)
    sftp.posix_rename(tmp, remote)  # type: ignore[attr-defined]


def install(target: ssh.SshTarget, config: autodown.Config, files: list[str],
            secrets: dict[str, bytes] | None = None, python: str = "python3",
            activate: str = "") -> None:
    """Copy the watcher's modules (`CORE_FILES` + `files`), its config and `secrets` (home-relative
    path -> content, 0600) to the head, then start the watcher there if none runs."""
    wanted = sorted(set(CORE_FILES + files))
    dirs = sorted({f"{PKG_DIR}/{f.rsplit('/', 1)[0]}" for f in wanted})
    if _running_config(target) not in (None, config.__dict__):
        stop(target)  # a running watcher keeps the config it started with: a new one takes over
    ssh.run(target, "umask 077 && mkdir -p .rayfleet && chmod 700 .rayfleet && mkdir -p "
            + " ".join(shlex.quote(d) for d in dirs), timeout=60, check=True)
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        for name in wanted:
            _put(sftp, f"{PKG_DIR}/{name}", (paths.PROJECT_ROOT / name).read_bytes(), 0o644)
        for remote, data in (secrets or {}).items():
            _put(sftp, remote, data, 0o600)
        text = json.dumps(config.__dict__, indent=2) + "\n"
        _put(sftp, autodown.HEAD_CONFIG.removeprefix("~/"), text.encode(), 0o600)
        sftp.close()
    finally:
        client.close()
    ssh.run(target, activate + autodown.start_command(python, f"$HOME/{PKG_DIR}"), timeout=60,
            check=True)


def _running_config(target: ssh.SshTarget) -> dict[str, object] | None:
    """The config of the watcher running on the head (None when none runs, or it cannot say)."""
    config = f"$HOME/{autodown.HEAD_CONFIG.removeprefix('~/')}"
    result = ssh.run(target, f'[ -f "{config}.pid" ] && kill -0 "$(cat "{config}.pid")" 2>/dev/null '
                     f'&& cat "{config}"', timeout=30)
    try:
        found = json.loads(result.stdout) if result.ok else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def stop(target: ssh.SshTarget) -> None:
    """Stop the head's watcher (exactly the pid it recorded) and remove its config."""
    pid = f"$HOME/{autodown.HEAD_CONFIG.removeprefix('~/')}.pid"
    ssh.run(target, f'if [ -f "{pid}" ]; then kill "$(cat "{pid}")" 2>/dev/null; rm -f "{pid}"; fi; '
            f'rm -f "$HOME/{autodown.HEAD_CONFIG.removeprefix("~/")}"', timeout=30)


def read_marker(target: ssh.SshTarget, cluster: str) -> bool:
    """Fetch the head's marker into this machine's cache; False when the head cannot say."""
    try:
        result = ssh.run(target, f'cat "$HOME/{autodown.HEAD_MARKER.removeprefix("~/")}"',
                         timeout=20)
    except RayfleetError:
        return False
    if not result.ok or not result.stdout.strip():
        return False
    autodown.cache_marker(cluster, result.stdout)
    return True
