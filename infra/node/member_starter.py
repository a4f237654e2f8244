"""The privileged starter of `sharing.isolation: cluster`: one verb about one member's Ray cluster.

    python -m infra.node.member_starter --config FILE start|stop|remove MEMBER_ID [PORT_BASE]

It runs as root (the gateway, unprivileged, calls it with `sudo -n`, or directly where it already
runs as root: the local provider's owner); everything it may do is fixed by FILE, a config only
root may write (member_clusters.StarterConfig). `start` makes the Unix user `rf-m-<id>` if
missing, a 0700 parent dir that user owns (Ray makes its temp dir 0777 and its files 0644: only
the parent keeps other users out), a 0600 Ray token there and the gateway's own 0600 copy of it,
then runs `ray start --head` as that user with its own port block, its temp dir under the parent,
bounded CPUs, usage stats off and, where the machine has them, cgroup limits on memory and CPU.
`stop` ends every process of that user (their cluster and jobs; the files stay). `remove` stops,
then deletes the user, their home, their parent dir and the gateway's copy of their token.
Standard library, psutil and Ray only (node rule).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import pwd
import re
import secrets
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from infra.node import raycli, rayproc
from infra.node.member_clusters import (
    StarterConfig,
    member_user,
    read_starter_config,
    short_id,
)
from infra.node.wait import WaitTimeout, until

#: Where cgroups v1 keeps the memory and CPU controllers (this machine's containers: no v2).
CGROUP_V1 = Path("/sys/fs/cgroup")
CGROUP_V2_FILE = CGROUP_V1 / "cgroup.controllers"


#: How long a user's creation or removal waits for the account files' lock: useradd and userdel
#: give up at once (exit 1 or 10, "cannot lock") while any other process changes an account, such
#: as two members' starts or removals at once. CI left a removed member's user behind this way.
ACCOUNT_LOCK_WAIT_S = 15.0


class StarterError(Exception):
    """A start, stop or removal that cannot go on; its text is one line for the gateway's answer."""


def account_change(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """`useradd`/`userdel` `argv`, again while another process holds the account files' lock;
    its last answer."""
    answers: list[subprocess.CompletedProcess[str]] = []

    def attempt() -> subprocess.CompletedProcess[str] | None:
        done = subprocess.run(argv, capture_output=True, text=True, check=False,
                              env={**os.environ, "LC_ALL": "C"})
        answers.append(done)
        locked = done.returncode in (1, 10) and "lock" in done.stderr
        return None if locked else done

    with contextlib.suppress(WaitTimeout):
        return until(attempt, ACCOUNT_LOCK_WAIT_S, 0.2, "the account files' lock")
    return answers[-1]


def parent_dir(config: StarterConfig, member_id: str) -> Path:
    return Path(config.tmp_root) / f"rf-m-{short_id(member_id)}"


def ensure_user(name: str) -> pwd.struct_passwd:
    try:
        return pwd.getpwnam(name)
    except KeyError:
        pass
    done = account_change(["useradd", "--system", "--create-home", "--home-dir", f"/home/{name}",
                           "--user-group", "--shell", "/usr/sbin/nologin", name])
    if done.returncode not in (0, 9):  # 9: made meanwhile by another start
        raise StarterError(f"useradd {name} failed: {done.stderr.strip()[-200:]}")
    user = pwd.getpwnam(name)
    os.chmod(user.pw_dir, 0o700)
    return user


def private_dir(path: Path, user: pwd.struct_passwd) -> None:
    """`path` a 0700 dir of `user`'s: made so, or found so (never a link, never someone else's:
    in a shared /tmp another user could have made it first)."""
    try:
        os.mkdir(path, 0o700)
        os.chown(path, user.pw_uid, user.pw_gid)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != user.pw_uid:
        raise StarterError(f"{path} exists and is not {user.pw_name}'s own dir; remove it")
    os.chmod(path, 0o700)


def write_private(path: Path, text: str, uid: int, gid: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, 0o600)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def ensure_token(config: StarterConfig, member_id: str, user: pwd.struct_passwd) -> Path:
    """The member cluster's own Ray token (kept across stops), and the gateway's copy."""
    path = parent_dir(config, member_id) / "token"
    if path.is_file() and not path.is_symlink() and path.stat().st_uid == user.pw_uid:
        token = path.read_text().strip()
    else:
        token = secrets.token_hex(32)
        write_private(path, token, user.pw_uid, user.pw_gid)
    uid, gid = gateway_ids(config)
    copies = token_dir(config, gid)
    write_private(copies / f"{short_id(member_id)}.token", token, uid, gid)
    return path


def gateway_ids(config: StarterConfig) -> tuple[int, int]:
    """The gateway's uid and gid: by its user's name where the config gives one."""
    if not config.gateway_user:
        return config.gateway_uid, config.gateway_gid
    try:
        found = pwd.getpwnam(config.gateway_user)
    except KeyError:
        raise StarterError(f"no user {config.gateway_user} on this head (the gateway's); "
                           "run `invoke up` again") from None
    return found.pw_uid, found.pw_gid


def token_dir(config: StarterConfig, gid: int) -> Path:
    """The gateway's token copies' dir: root's, readable by the gateway's group only (0750),
    never a link: the gateway cannot swap it for one that turns root's writes elsewhere."""
    copies = Path(config.token_dir)
    copies.mkdir(mode=0o750, parents=True, exist_ok=True)
    info = os.lstat(copies)
    if not os.path.isdir(copies) or os.path.islink(copies) or info.st_uid != 0:
        raise StarterError(f"{copies} is not root's own dir; remove it")
    os.chown(copies, 0, gid)
    os.chmod(copies, 0o750)
    return copies


def cgroup_dirs(name: str) -> list[Path]:
    """Where this member's limits go: cgroups v1 memory and cpu dirs when those controllers are
    there and writable; none otherwise (limits then are only Ray's `--num-cpus`)."""
    if CGROUP_V2_FILE.exists():
        if "memory" in CGROUP_V2_FILE.read_text().split():
            return [CGROUP_V1 / name]
        return []
    return [CGROUP_V1 / c / name for c in ("memory", "cpu") if (CGROUP_V1 / c).is_dir()]


def make_cgroups(config: StarterConfig, name: str) -> list[Path]:
    made = []
    for path in cgroup_dirs(name):
        try:
            path.mkdir(exist_ok=True)
        except OSError:
            continue  # a read-only hierarchy: no limit of that kind here
        limits = {"memory.limit_in_bytes": str(config.memory_mb * 1024 * 1024),
                  "memory.max": str(config.memory_mb * 1024 * 1024),
                  "cpu.cfs_quota_us": str(int(config.cpus * 100_000)),
                  "cpu.max": f"{int(config.cpus * 100_000)} 100000"}
        for key, value in limits.items():
            if (path / key).exists():
                (path / key).write_text(value)
        made.append(path)
    return made


def start(config: StarterConfig, member_id: str, port_base: int) -> dict[str, object]:
    """Start the member's head unless it runs; where it answers."""
    if not (config.first_port <= port_base <= config.last_port
            and (port_base - config.first_port) % config.block_step == 0):
        raise StarterError(f"port base {port_base} is outside the member blocks")
    user = ensure_user(member_user(member_id))
    stop(member_id, grace_s=2.0)  # a cluster left by a gateway that died holds the temp dir
    parent = parent_dir(config, member_id)
    private_dir(parent, user)
    token = ensure_token(config, member_id, user)
    block = rayproc.PortBlock(port_base)
    groups = make_cgroups(config, user.pw_name)
    python_bin = config.python_bin or str(Path(sys.executable).parent)
    python = str(Path(python_bin) / "python")
    env = {"HOME": user.pw_dir, "USER": user.pw_name, "LOGNAME": user.pw_name,
           "PATH": f"{python_bin}:/usr/local/bin:/usr/bin:/bin",
           "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_ADDRESS": f"127.0.0.1:{block.gcs}",
           "AUTOSCALER_METRIC_PORT": str(block.autoscaler_metrics),
           "DASHBOARD_METRIC_PORT": str(block.dashboard_metrics)}

    def become() -> None:  # in the child, before exec: the limits first, then the user
        for group in groups:
            (group / "cgroup.procs").write_text(str(os.getpid()))
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    # Only whether the user may enter its folders (milliseconds; `import ray` takes seconds).
    check = subprocess.run([python, "-I", "-S", "-c", ""], env=env, cwd=user.pw_dir,
                           preexec_fn=become, capture_output=True, text=True, check=False)
    if check.returncode != 0:
        raise StarterError(f"{user.pw_name} cannot run {python} ({check.stderr.strip()[-120:]}); "
                           "install Ray's Python where other users may enter (not a 0700 home)")
    argv = [*raycli.argv_here(str(Path(python_bin) / "ray")), "start", "--head",
            "--dashboard-host=127.0.0.1", *block.flags(), f"--temp-dir={parent}/t",
            f"--num-cpus={config.num_cpus}", f"--object-store-memory={config.object_store_mb << 20}",
            "--disable-usage-stats", "--log-style=record"]
    if argv[0] == sys.executable:
        argv[0] = python  # the same Python, by the path the member's user can enter
    done = subprocess.run(argv, env=env, cwd=user.pw_dir, preexec_fn=become, capture_output=True,
                          text=True, timeout=config.start_timeout_s, check=False)
    if done.returncode != 0:
        raise StarterError(f"ray start as {user.pw_name} failed: "
                           f"{(done.stderr or done.stdout).strip().splitlines()[-1:]}")
    return {"dashboard_port": block.dashboard, "gcs_port": block.gcs, "user": user.pw_name}


def stop(member_id: str, grace_s: float = 5.0) -> int:
    """End every process of the member's user; how many there were."""
    import psutil

    try:
        uid = pwd.getpwnam(member_user(member_id)).pw_uid
    except KeyError:
        return 0
    # Only this machine's processes: a member cluster runs in the starter's network namespace,
    # and a process elsewhere with the same uid is another machine's user (the test bed's hosts
    # share this kernel's process table; CI ended a Lambda bed head's Ray this way).
    here = os.readlink("/proc/self/ns/net")
    procs = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and
             p.info["uids"].real == uid and _net_of(p.pid) == here]
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            proc.send_signal(signal.SIGTERM)
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()
    psutil.wait_procs(alive, timeout=grace_s)
    return len(procs)


def _net_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def _rmdir(group: Path) -> bool:
    """Whether `group` is gone now (removed, or never there)."""
    try:
        group.rmdir()
    except FileNotFoundError:
        pass
    except OSError:
        return False
    return True


def remove(config: StarterConfig, member_id: str) -> None:
    """Everything of the member's gone: processes, user, home, parent dir, token copy, cgroups."""
    name = member_user(member_id)
    stop(member_id)
    shutil.rmtree(parent_dir(config, member_id), ignore_errors=True)
    (Path(config.token_dir) / f"{short_id(member_id)}.token").unlink(missing_ok=True)
    for group in cgroup_dirs(name):
        # The kernel lets go of a cgroup once its last process is reaped: a moment after stop.
        with contextlib.suppress(WaitTimeout):
            until(functools.partial(_rmdir, group), 2.0, 0.1, f"cgroup {group} to be empty")
    try:
        home = pwd.getpwnam(name).pw_dir
    except KeyError:
        return
    # --force: userdel refuses a uid that any process in /proc has, and the test bed's hosts (their
    # own PID namespaces, nested in this one) run their own users under the same uids; stop above
    # ended every process of this user on this machine (its network namespace).
    done = account_change(["userdel", "--force", name])
    shutil.rmtree(home, ignore_errors=True)
    if done.returncode not in (0, 6):  # 6: no such user, removed meanwhile
        raise StarterError(f"userdel {name} failed: {done.stderr.strip()[-200:]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Start, stop or remove one member's Ray cluster.")
    parser.add_argument("--config", required=True)
    parser.add_argument("verb", choices=("start", "stop", "remove"))
    parser.add_argument("member_id")
    parser.add_argument("port_base", nargs="?", type=int, default=0)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print(json.dumps({"error": "the member starter needs root to create member users"}))
        return 2
    if not re.fullmatch(r"[A-Za-z0-9_-]{1,80}", args.member_id):
        print(json.dumps({"error": "a member id is letters, digits, '_' or '-'"}))
        return 2
    config = read_starter_config(Path(args.config))
    try:
        if args.verb == "start":
            print(json.dumps(start(config, args.member_id, args.port_base)))
        elif args.verb == "stop":
            print(json.dumps({"stopped": stop(args.member_id)}))
        else:
            remove(config, args.member_id)
            print(json.dumps({"removed": True}))
    except (StarterError, OSError, subprocess.TimeoutExpired) as exc:
        print(json.dumps({"error": str(exc).splitlines()[0][:300]}))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
