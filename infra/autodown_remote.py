"""Putting the autodown watcher (infra/autodown.py) on a remote head over SSH, and reading its marker.

Used by providers whose head this machine reaches over SSH (Lambda, GCP). `install_daemon` is the
general mechanism, for any `python -m <module> --config <file>` daemon on a head (the watcher, GCP's
queued-slice joiner): it copies the daemon and the few modules it imports into
`~/rayfleet/autodown-pkg` on the head, writes its config and any secret it needs (an API key) as
0600 files through SFTP (never on a command line), and starts it detached unless one already runs.
`read_marker` fetches the watcher's marker for `status`, which caches it on this machine so that the
next `status` can still say when the cluster removed itself.
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
    text = json.dumps(config.__dict__, indent=2) + "\n"
    install_daemon(target, "infra.autodown", autodown.HEAD_CONFIG, text, files, secrets,
                   python=python, activate=activate, log=autodown.HEAD_LOG)


def install_daemon(target: ssh.SshTarget, module: str, config_path: str, config_text: str,
                   files: list[str], secrets: dict[str, bytes] | None = None,
                   python: str = "python3", activate: str = "", log: str = "") -> None:
    """Put a head-side daemon (`python -m <module> --config <config_path>`) on the head: copy
    `CORE_FILES` + `files` into `PKG_DIR`, write `config_text` (0600) and `secrets` (home-relative
    path -> content, 0600) through SFTP, then start it detached unless its pid file names a live
    process. `config_path` and `log` are `~/`-relative paths on the head."""
    wanted = sorted(set(CORE_FILES + files))
    dirs = sorted({f"{PKG_DIR}/{f.rsplit('/', 1)[0]}" for f in wanted})
    if _running_config(target, config_path) not in (None, json.loads(config_text)):
        stop_daemon(target, config_path)  # it keeps the config it started with: a new one takes over
    ssh.run(target, "umask 077 && mkdir -p .rayfleet && chmod 700 .rayfleet && mkdir -p "
            + " ".join(shlex.quote(d) for d in dirs), timeout=60, check=True)
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        for name in wanted:
            _put(sftp, f"{PKG_DIR}/{name}", (paths.PROJECT_ROOT / name).read_bytes(), 0o644)
        for remote, data in (secrets or {}).items():
            _put(sftp, remote, data, 0o600)
        _put(sftp, config_path.removeprefix("~/"), config_text.encode(), 0o600)
        sftp.close()
    finally:
        client.close()
    ssh.run(target, activate + start_command(module, config_path, log or f"{config_path}.log",
                                             python, f"$HOME/{PKG_DIR}"), timeout=60, check=True)


def start_command(module: str, config_path: str, log: str, python: str = "python3",
                  pythonpath: str = "") -> str:
    """Shell that starts `python -m <module> --config <config_path>` on a head, detached, unless
    the pid file `<config_path>.pid` (which the daemon writes) names a live process. No secret on
    this line: the config names files."""
    env = f'PYTHONPATH="{pythonpath}" ' if pythonpath else ""
    # Double quotes: $HOME in the paths must expand on the head.
    pid = f"{config_path}.pid".replace("~", "$HOME", 1)
    config = config_path.replace("~", "$HOME", 1)
    out = log.replace("~", "$HOME", 1)
    return (f'if [ -f "{pid}" ] && kill -0 "$(cat "{pid}")" 2>/dev/null; then :; else '
            f'{env}nohup "{python}" -m {module} --config "{config}" '
            f'>> "{out}" 2>&1 < /dev/null & fi')


def read_file(target: ssh.SshTarget, path: str) -> str | None:
    """A small file on the head (`~/`-relative), or None when the head cannot say."""
    try:
        result = ssh.run(target, f'cat "$HOME/{path.removeprefix("~/")}"', timeout=20)
    except RayfleetError:
        return None
    return result.stdout if result.ok and result.stdout.strip() else None


def _running_config(target: ssh.SshTarget, config_path: str) -> dict[str, object] | None:
    """The config of the daemon running on the head (None when none runs, or it cannot say)."""
    config = f"$HOME/{config_path.removeprefix('~/')}"
    result = ssh.run(target, f'[ -f "{config}.pid" ] && kill -0 "$(cat "{config}.pid")" 2>/dev/null '
                     f'&& cat "{config}"', timeout=30)
    try:
        found = json.loads(result.stdout) if result.ok else None
    except ValueError:
        return None
    return found if isinstance(found, dict) else None


def stop(target: ssh.SshTarget) -> None:
    """Stop the head's autodown watcher and remove its config."""
    stop_daemon(target, autodown.HEAD_CONFIG)


def stop_daemon(target: ssh.SshTarget, config_path: str) -> None:
    """Stop a head-side daemon (exactly the pid it recorded) and remove its config."""
    config = f"$HOME/{config_path.removeprefix('~/')}"
    ssh.run(target, f'if [ -f "{config}.pid" ]; then kill "$(cat "{config}.pid")" 2>/dev/null; '
            f'rm -f "{config}.pid"; fi; rm -f "{config}"', timeout=30)


def read_marker(target: ssh.SshTarget, cluster: str) -> bool:
    """Fetch the head's marker into this machine's cache; False when the head cannot say."""
    text = read_file(target, autodown.HEAD_MARKER)
    if text is None:
        return False
    autodown.cache_marker(cluster, text)
    return True
