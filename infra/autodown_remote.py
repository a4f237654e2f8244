"""Putting the autodown watcher (infra/node/autodown.py) on a remote head over SSH, and reading its
marker.

Used by providers whose head this machine reaches over SSH (Lambda, GCP). `install_daemon` is the
general mechanism, for any `python -m <module> --config <file>` daemon on a head (the watcher, GCP's
queued-slice joiner): it puts the node package on the head whole (infra/shipping.py, one zip),
writes its config and any secret it needs (an API key) as 0600 files through SFTP (never on a
command line), and starts it detached with that zip on its PYTHONPATH unless one already runs.
`head_marker` reads the watcher's marker for `status`.
"""

from __future__ import annotations

import json
import shlex

from infra import shipping, ssh
from infra.errors import RayfleetError
from infra.node import autodown


def install(target: ssh.SshTarget, config: autodown.Config,
            secrets: dict[str, bytes] | None = None, python: str = "python3",
            activate: str = "") -> None:
    """Put the node package, the watcher's config and `secrets` (home-relative path -> content,
    0600) on the head, then start the watcher there if none runs."""
    text = json.dumps(config.__dict__, indent=2) + "\n"
    install_daemon(target, "infra.node.autodown", autodown.HEAD_CONFIG, text, secrets,
                   python=python, activate=activate, log=autodown.HEAD_LOG)


def install_daemon(target: ssh.SshTarget, module: str, config_path: str, config_text: str,
                   secrets: dict[str, bytes] | None = None, python: str = "python3",
                   activate: str = "", log: str = "") -> None:
    """Put a head-side daemon (`python -m <module> --config <config_path>`, a module of the node
    package) on the head: the package's zip (shipping.upload), `config_text` (0600) and `secrets`
    (home-relative path -> content, 0600) through SFTP, then start it detached with the zip on its
    PYTHONPATH unless its pid file names a live process. `config_path` and `log` are
    `~/`-relative paths on the head."""
    # The zip's name goes into the config: a daemon started with another checkout's code has
    # another config and is replaced, so that the head runs what this `up` ships.
    wanted = {**json.loads(config_text), "node_package": shipping.zip_name()}
    if _running_config(target, config_path) not in (None, wanted):
        stop_daemon(target, config_path)  # it keeps the config it started with: a new one takes over
    ssh.run(target, "umask 077 && mkdir -p .rayfleet && chmod 700 .rayfleet && mkdir -p "
            + shlex.quote(shipping.NODE_DIR), timeout=60, check=True)
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        remote_zip = shipping.upload(sftp)
        for remote, data in (secrets or {}).items():
            shipping.put(sftp, remote, data, 0o600)
        shipping.put(sftp, config_path.removeprefix("~/"),
                     (json.dumps(wanted, indent=2) + "\n").encode(), 0o600)
        sftp.close()
    finally:
        client.close()
    ssh.run(target, activate + start_command(module, config_path, log or f"{config_path}.log",
                                             python, f"$HOME/{remote_zip}"), timeout=60, check=True)


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


def head_marker(target: ssh.SshTarget) -> str | None:
    """The watcher's marker on a running head (None when the head cannot say)."""
    return read_file(target, autodown.HEAD_MARKER)
