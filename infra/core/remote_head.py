"""Reaching a cluster's head from this machine: the one home for every provider whose head is
behind SSH (Lambda, GCP, a Slurm head on a compute node), and for the endpoint every provider
returns.

- **The endpoint** (`endpoint`): the dashboard, Serve's proxy and the tracking server, through
  one SSH login's tunnels (or directly, for a head on this machine), as one `Endpoint` built one
  way (`build`). Long-lived tunnels for a shell that outlives rayfleet are infra/core/tunnels.py.
- **The node package** (`put_files`): the zip of infra/node/ (infra/core/shipping.py) and any file a
  daemon needs (configs, secrets, 0600), in one SFTP session, never on a command line.
- **Node modules on the head** (`node_command`): `python -m infra.node.<module>` with that zip
  on its PYTHONPATH, in the head's node environment.
- **Supervised daemons** (`install_daemon`, `stop_daemon`, `read_with_status`): the public "run this
  argv supervised on the head". Every head daemon (the idle watcher, the tracking server, GCP's
  joiner, and any later one) runs under infra/node/supervise.py, which starts it again within
  seconds when it dies and keeps its pid file by process identity (pid + start time). On this
  machine the same supervisor is `infra.node.supervise.ensure`. Ray's separated autoscaler runs
  under it too (`start_ray_up_monitor`; privilege.start_monitor).

Core layer: never imports a provider, never branches on a provider's name.
"""

from __future__ import annotations

import contextlib
import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from infra.core import privilege, shipping, ssh
from infra.core.endpoint import Endpoint
from infra.core.errors import RayfleetError
from infra.node import shell

#: Where head daemons keep their configs and pid files (0700, as the token's folder).
PRIVATE_DIR = ".rayfleet"


def home_word(path: str) -> str:
    """A `~/`-relative (or absolute) path as a double-quoted shell word that expands on the head."""
    return f'"{path}"' if path.startswith("/") else '"$HOME/' + path.removeprefix("~/") + '"'


def _relative(path: str) -> str:
    """`~/x` -> `x`: SFTP paths are relative to the login's home."""
    return path.removeprefix("~/")


# --- the endpoint ------------------------------------------------------------------------------


def direct(address: str, token_path: Path | None, dashboard: tuple[str, int],
           serve: tuple[str, int], tracking: tuple[str, int] | None = None,
           tracking_password: Path | None = None,
           metrics: tuple[str, int] | None = None) -> Endpoint:
    """The endpoint of a head this machine reaches directly (the local provider, a Slurm head on
    this host): each (host, port) as is."""
    remotes = services(dashboard, serve, tracking, metrics)
    return _endpoint([f"http://{host}:{port}" for host, port in remotes], address, token_path,
                     serve, tracking_password, tracking is not None, metrics is not None,
                     tunneled=False)


@contextlib.contextmanager
def endpoint(target: ssh.SshTarget | None, address: str, token_path: Path | None,
             dashboard: tuple[str, int], serve: tuple[str, int],
             tracking: tuple[str, int] | None = None,
             tracking_password: Path | None = None,
             metrics: tuple[str, int] | None = None) -> Iterator[Endpoint]:
    """The cluster's endpoint while the block runs: each (host, port) as the head sees it, reached
    from here through ONE SSH login's tunnels into `target` (every command that connects pays
    one handshake), or directly when `target` is None (the head is this machine)."""
    if target is None:
        yield direct(address, token_path, dashboard, serve, tracking, tracking_password, metrics)
        return
    with ssh.tunnels(target, services(dashboard, serve, tracking, metrics)) as ports:
        yield tunneled(ports, address, token_path, serve, tracking_password, tracking is not None,
                       metrics is not None)


def tunneled(ports: list[int], address: str, token_path: Path | None, serve: tuple[str, int],
             tracking_password: Path | None, tracked: bool, measured: bool) -> Endpoint:
    """The endpoint through local `ports` that forward to the head's `services`, in their order."""
    return _endpoint([f"http://127.0.0.1:{port}" for port in ports], address, token_path, serve,
                     tracking_password, tracked, measured, tunneled=True)


def announced(dashboard: str, address: str, token_path: Path | None,
              tunneled: bool = False) -> Endpoint:
    """What `up` reports of a cluster it started: where its dashboard is, in words where no URL
    from here exists yet ("... on the head (SSH tunnel)"), and its Ray address; `connect` gives
    the endpoint to use."""
    return Endpoint(dashboard, address, tunneled=tunneled, token_path=token_path)


def services(dashboard: tuple[str, int], serve: tuple[str, int], tracking: tuple[str, int] | None,
             metrics: tuple[str, int] | None) -> list[tuple[str, int]]:
    """The head's services in the one order `_endpoint` reads: dashboard, serve, tracking?,
    metrics?"""
    return [dashboard, serve] + [r for r in (tracking, metrics) if r is not None]


def _endpoint(urls: list[str], address: str, token_path: Path | None, serve: tuple[str, int],
              tracking_password: Path | None, tracked: bool, measured: bool,
              tunneled: bool) -> Endpoint:
    """The one place an `Endpoint` is made from URLs: [dashboard, serve, tracking?, metrics?]."""
    return Endpoint(urls[0], address, tunneled=tunneled, token_path=token_path,
                    tracking_url=urls[2] if tracked else None,
                    tracking_password=tracking_password if tracked else None,
                    serve_url=urls[1], serve_bind=serve,
                    metrics_url=urls[-1] if measured else None)


# --- files and node modules on the head --------------------------------------------------------


def _make_folders(sftp: Any, folders: set[str], private: Callable[[str], bool]) -> None:
    """`folders` and their missing parents (`~/`-relative or absolute), parents first, as SFTP
    creates them (no shell, no extra round trip): 0700 where `private(folder)`, else 0755."""
    every = sorted({"/".join(f.split("/")[:i + 1]) for f in folders
                    for i in range(len(f.split("/")))} - {"", "."})
    for folder in every:
        try:
            sftp.stat(folder)
        except OSError:
            sftp.mkdir(folder, 0o700 if private(folder) else 0o755)


def _mkdirs(sftp: Any, folders: set[str]) -> None:
    """The private dir (0700, and every folder made inside it: a daemon's data dir is nobody
    else's), the node package's dir and `folders` (home-relative, with their parents)."""
    _make_folders(sftp, {PRIVATE_DIR, shipping.NODE_DIR, *folders},
                  lambda folder: folder == PRIVATE_DIR or folder.startswith(PRIVATE_DIR + "/"))
    sftp.chmod(PRIVATE_DIR, 0o700)


def _installer() -> dict[str, bytes]:
    """setup/users/users.sh where hand_over runs it: a head that an older rayfleet set up may
    have one that knows fewer users."""
    return {privilege.USERS_SCRIPT: (privilege.SCRIPTS_SOURCE / "users.sh").read_bytes()}


def put_private(target: ssh.SshTarget, files: dict[str, bytes], user: str | None = None) -> None:
    """Write 0600 files on the head in this order, in one SFTP session, each whole or not at all
    (shipping.put), their missing folders made 0700: `~/`-relative or absolute paths outside the
    private dir (a Slurm site's shared work dir), for what nobody else may read.

    `user` (a node user of infra/core/privilege.py): the files are that user's, at the same
    `~/`-relative paths in its home; the SSH user's copies go once handed over (users.sh writes
    each through one rename: a daemon reading it never sees it missing)."""
    client = ssh.connect(target)
    try:
        sftp = client.open_sftp()
        if user is not None:
            _make_folders(sftp, {privilege.USERS_DIR}, lambda _folder: False)
            for path, data in _installer().items():
                shipping.put(sftp, path, data, 0o644)
        for path, data in files.items():
            _make_folders(sftp, {str(Path(_relative(path)).parent)}, lambda _folder: True)
            shipping.put(sftp, _relative(path), data, 0o600)
        sftp.close()
    finally:
        client.close()
    if user is not None:
        paths = [_relative(p) for p in files]
        ssh.run(target, privilege.hand_over(user, paths, paths), timeout=60, check=True)


def put_files(target: ssh.SshTarget, files: dict[str, tuple[bytes, int]] | None = None,
              client: Any = None) -> str:
    """Put the node package's zip and `files` (`~/`-relative path -> (content, mode)) on the
    head in one SFTP session (their folders made as needed, the private one 0700), each file
    created with its mode before any byte is in it; returns the zip's home-relative path."""
    own = client is None
    client = client or ssh.connect(target)
    try:
        sftp = client.open_sftp()
        _mkdirs(sftp, {str(Path(_relative(r)).parent) for r in (files or {})} - {"."})
        remote_zip = shipping.upload(sftp)
        for remote, (data, mode) in (files or {}).items():
            shipping.put(sftp, _relative(remote), data, mode)
        sftp.close()
    finally:
        if own:
            client.close()
    return remote_zip


def node_command(module: str, args: str, python: str = "python3", activate: str = "",
                 node_zip: str | None = None) -> str:
    """Shell that runs `python -m <module> <args>` on the head with the node package on its
    PYTHONPATH: this checkout's zip (`put_files` puts it there), or, when the head lacks it (this
    checkout changed since `up`), the newest one the head has. `args` is shell, already quoted."""
    wanted = home_word(node_zip or shipping.head_path())
    newest = f'$(ls -t "$HOME/{shipping.NODE_DIR}"/*.zip 2>/dev/null | head -n 1)'
    return (f'{activate}rf_zip={wanted}; [ -f "$rf_zip" ] || rf_zip="{newest}"; '
            f'PYTHONPATH="$rf_zip" "{python}" -m {module} {args}')


def read_file(target: ssh.SshTarget, path: str, user: str | None = None) -> str | None:
    """A small file on the head (`~/`-relative: in the node user `user`'s home when given, e.g.
    a daemon's marker that `install_daemon(user=...)` writes), or None when the head cannot say."""
    command = f"cat {home_word(path)}"
    try:
        result = ssh.run(target, command if user is None else privilege.as_user(user, command),
                         timeout=20)
    except RayfleetError:
        return None
    return result.stdout if result.ok and result.stdout.strip() else None


# --- supervised daemons ------------------------------------------------------------------------


def pidfile(config_path: str) -> str:
    """The supervisor's pid file of the daemon configured by `config_path` (beside it)."""
    return f"{config_path}.pid"


def install_daemon(target: ssh.SshTarget, module: str, config_path: str, config_text: str,
                   secrets: dict[str, bytes] | None = None, python: str = "python3",
                   activate: str = "", log: str = "", user: str | None = None,
                   copies: tuple[str, ...] = (), restart: str = "on-failure") -> bool:
    """Run `python -m <module> --config <config_path>` (a module of the node package) on the
    head, supervised: started again within seconds whenever it dies, until it exits 0 (with
    `restart` "always": whenever it ends unasked, exit 0 included); True when this call started it.

    The public "run this daemon supervised on the head". Puts the package's zip, `config_text`
    (0600) and `secrets` (`~/`-relative path -> content, 0600) on the head through SFTP, then, in
    one SSH command, starts the supervisor unless one runs for this config (by identity, never
    by a bare pid). A running daemon whose config differs (another checkout's code: the config
    names the zip) is stopped and started with the new one. `config_path` and `log` are
    `~/`-relative paths on the head; no secret is on any command line.

    `user` (one of the node's users, infra/core/privilege.py): the supervisor and its daemon run as
    that user, and every `~/` path is in that user's home. The files go up as above, are handed
    to the user (the secrets then leave the SSH user's home, so that the user's 0600 copy is the
    only one), and a supervisor the SSH user ran for this config before is stopped first.
    `copies`: files of the SSH user's (`~/`-relative, e.g. the Ray token) that the user gets a
    copy of, the SSH user keeping its own; a missing one is skipped.
    """
    wanted = {**json.loads(config_text), "node_package": shipping.zip_name()}
    staged = f"{config_path}.new"
    files = {remote: (data, 0o600) for remote, data in (secrets or {}).items()}
    files[staged] = ((json.dumps(wanted, indent=2) + "\n").encode(), 0o600)
    if user is not None:
        files.update({path: (data, 0o644) for path, data in _installer().items()})
    remote_zip = put_files(target, files)
    daemon = f'"{python}" -m {module} --config {home_word(config_path)}'
    args = (f"ensure --restart {shlex.quote(restart)} --pidfile {home_word(pidfile(config_path))} "
            f"--log {home_word(log or f'{config_path}.log')} "
            f"--replace-config {home_word(staged)} {home_word(config_path)} -- {daemon}")
    if user is None:
        command = 'cd "$HOME" && ' + node_command("infra.node.supervise", args, python, activate,
                                                  remote_zip)
    else:
        before = node_command("infra.node.supervise",
                              f"stop --pidfile {home_word(pidfile(config_path))}", python,
                              activate, remote_zip)
        handed = [_relative(p) for p in (staged, *(secrets or {}), remote_zip, *copies)]
        command = shell.all_of(
            f"{{ [ ! -e {home_word(pidfile(config_path))} ] || "
            f"{{ {before}; rm -f {home_word(config_path)}; }}; }}",
            # The secrets' and the staged config's SSH user's copies go: nothing left behind.
            privilege.hand_over(user, handed, [_relative(p) for p in (staged, *(secrets or {}))]),
            privilege.as_user(user, node_command("infra.node.supervise", args, python, "",
                                                 remote_zip), activate))
    # `supervise ensure` says last whether it started one or one was running.
    said = ssh.run(target, command, timeout=60, check=True).stdout.split()
    return bool(said) and said[-1] == "started"


def stop_daemon(target: ssh.SshTarget, config_path: str, python: str = "python3",
                activate: str = "", user: str | None = None) -> None:
    """Stop a head daemon and its supervisor (exactly the processes its pid file identifies) and
    remove its config (`user`: the daemon runs as that node user, as `install_daemon` put it)."""
    stop = node_command("infra.node.supervise", f"stop --pidfile {home_word(pidfile(config_path))}",
                        python, "" if user else activate)
    command = f"{stop}; rm -f {home_word(config_path)}"
    ssh.run(target, command if user is None else privilege.as_user(user, command, activate),
            timeout=30)


def start_ray_up_monitor(target: ssh.SshTarget, gcs_port: int, token: bool, activate: str = "",
                         replace: bool = True) -> None:
    """Ray's v1 monitor, supervised, as the autoscaler's user on a head that `ray up` started
    (node_start.ray_up_head): the node package goes up and to that user first (the
    supervisor is in it). `replace`: a new Ray runs there (`ray up` ran), so the monitor that
    runs is replaced; otherwise one starts only when none runs."""
    remote_zip = put_files(target)
    command = shell.all_of(
        privilege.hand_over(privilege.SCALER_USER, [_relative(remote_zip)]),
        privilege.ray_up_monitor(gcs_port, token, _relative(remote_zip), activate, replace))
    ssh.run(target, command, timeout=60, check=True)


#: Between a file's content and a daemon's status in one command's output.
_STATUS_SEPARATOR = "--rayfleet-daemon-status--"


def with_status_command(read: str, status: str) -> str:
    """Shell that prints a file (`read`), then a daemon's status (`status`, a `supervise status`
    command), for `split_status`: one round trip for both."""
    return f"{read} 2>/dev/null; echo; echo {shlex.quote(_STATUS_SEPARATOR)}; {status}"


def split_status(output: str) -> tuple[str | None, dict[str, Any] | None]:
    """(the file's text or None, the daemon's status or None) from `with_status_command`'s output."""
    text, _, rest = output.partition(_STATUS_SEPARATOR)
    try:
        found = json.loads(rest.strip().splitlines()[-1]) if rest.strip() else None
    except ValueError:
        found = None
    return (text if text.strip() else None), (found if isinstance(found, dict) else None)


def read_with_status(target: ssh.SshTarget, path: str, config_path: str, python: str = "python3",
                     activate: str = "", user: str | None = None,
                     ) -> tuple[str | None, dict[str, Any] | None]:
    """A small file on the head and a daemon's status, in one SSH command (`status` reads the
    watcher's marker and whether the watcher runs); `user`: the daemon's node user, whose home
    holds both."""
    status = node_command("infra.node.supervise",
                          f"status --pidfile {home_word(pidfile(config_path))}", python,
                          "" if user else activate)
    command = with_status_command(f"cat {home_word(path)}", status)
    if user is not None:
        command = privilege.as_user(user, command, activate)
    try:
        result = ssh.run(target, command, timeout=30)
    except RayfleetError:
        return None, None
    return split_status(result.stdout)
