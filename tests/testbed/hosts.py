"""Nodes of the test bed: process trees in their own PID, mount and UTS namespaces, and SSH hosts.

A node is `setpriv --pdeathsig KILL nsenter --net=<netns> unshare --pid --fork --kill-child --mount-proc
--uts python3 hostinit.py`: its own hostname, its own process list (`ray stop` in one host cannot see
another's Ray), private mounts, and death of the whole tree when its init is killed or when the
process that started it dies. `nsenter --net` is used, not `ip netns exec`, because the latter
remounts /sys and so hides the cgroup file system that slurmd needs.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from infra.node import wait
from tests.testbed import net
from tests.testbed.registry import MARKER, is_alive, proc_start_time

HOSTINIT = Path(__file__).with_name("hostinit.py")
#: A host's live processes, one `STAT ARGS` line each: zombies (already dead, their exit not yet
#: reaped by their parent or by hostinit.py) left out, for "nothing of X still runs" checks.
LIVE_PROCESSES = "ps -eo stat=,args= | awk '$1 !~ /^Z/'"
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Ray settings every process in the test bed gets: no usage reports to a public server, and the
#: autoscaler v1 with which a `ray up` from another machine does launch its workers (Ray 2.60).
RAY_SAFE_ENV = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_UP_enable_autoscaler_v2": "0"}
#: A login shell whose ~/.bashrc runs `pyenv init` (this machine's does, for every SSH session,
#: interactive or not) rehashes under a lock file in ~/.pyenv/shims, waiting up to 60 s for it.
#: Every host's /root is an overlay of this machine's: a lock left by a session killed mid-rehash,
#: here or on the host, made every later SSH session into the bed wait 60 s (tests timed out at 60 s
#: when groups ran side by side). One second is ample for a rehash nobody else holds.
PYENV_ENV = {"PYENV_REHASH_TIMEOUT": "1"}


def ray_bin_dir() -> str:
    """Directory of the `ray` executable that belongs to the Python running the tests."""
    scripts = sysconfig.get_path("scripts")
    if Path(scripts, "ray").exists():
        return scripts
    return str(Path(sys.executable).parent)


def node_env(run_id: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of everything run in a node, and of SSH sessions into a host.

    Deliberately not inherited from the test process: a node should look like a fresh login, and the
    run marker must be on every process so teardown can find strays.
    """
    return {
        "PATH": f"{ray_bin_dir()}:{SYSTEM_PATH}",
        "HOME": "/root",
        "USER": "root",
        "LOGNAME": "root",
        "SHELL": "/bin/bash",
        "LANG": "C.UTF-8",
        **RAY_SAFE_ENV,
        **PYENV_ENV,
        MARKER: run_id,
        **(extra or {}),
    }


def write_ed25519_key(path: Path, comment: str) -> str:
    """Create an OpenSSH ed25519 key pair at `path` (private, mode 0600) and `path`.pub; return the
    public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(private)
    public = key.public_key().public_bytes(
        serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH
    ).decode() + f" {comment}"
    path.with_name(path.name + ".pub").write_text(public + "\n")
    return public


def tmpfs_over(target: str, mode: str = "1777") -> list[str]:
    """argv that mounts a fresh tmpfs over `target` (run inside a node's own mount namespace).

    Makes sure the mount point exists on the shared disk (an empty directory, harmless outside).
    """
    Path(target).mkdir(exist_ok=True)
    return ["mount", "-t", "tmpfs", "-o", f"mode={mode}", "tmpfs", target]


#: What a host writes to is its own: a copy-on-write layer over this machine's, private to the
#: host's mount namespace. /etc and /home, because node setup creates system users (useradd writes
#: /etc/passwd, /etc/shadow, /etc/group and makes /home/<user>): those must be the host's own, as on
#: a real instance, and never reach this machine's files or another host's.
#: Each with the mode of its merged root (which overlayfs takes from the upper directory, 0755 when
#: made by mkdir). /root as on a real machine, 0700, but for others' x bit: the tests' Python (and
#: so `ray`, which every user of a node runs) lives under this machine's /root/.pyenv, where a real
#: node has /usr. Others can pass through /root, not list it; the node's secrets there are 0700/0600.
PRIVATE_TREES = {"/root": "0711", "/etc": "0755", "/home": "0755"}


def host_setup(private: Path) -> list[list[str]]:
    """A host's private view of the machine, as argv run by its init: copy-on-write /root, /etc and
    /home whose upper layers live in a tmpfs at `private` (an empty directory), and empty /tmp/ray
    and /dev/shm."""
    path_line = f"export PATH={ray_bin_dir()}:$PATH  # rayfleet test bed: this host's private home only"
    overlays: list[list[str]] = []
    for tree, mode in PRIVATE_TREES.items():
        layer = f"{private}/{tree.strip('/')}"
        # Without the chmod every host's /root was 0755 and any user could list and read it.
        overlays += [["mkdir", f"{layer}-upper", f"{layer}-work"],
                     ["chmod", mode, f"{layer}-upper"],
                     ["mount", "-t", "overlay", "overlay", "-o",
                      f"lowerdir={tree},upperdir={layer}-upper,workdir={layer}-work", tree]]
    return [
        # Upper and work dirs on a tmpfs: overlayfs refuses some file systems (e.g. another overlay,
        # as in containers) as upper layer.
        ["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(private)],
        *overlays,
        # Login shells may put other Pythons first (pyenv or conda in ~/.bashrc): on this host, as a
        # setup script would on a real one, the tests' Python and Ray come first.
        ["sh", "-c", f"printf '%s\\n' {shlex.quote(path_line)} >> /root/.bashrc"],
        tmpfs_over("/tmp/ray"),
        tmpfs_over("/dev/shm"),
    ]


def sshd_config(host_key: Path, authorized_keys: Path, env: Mapping[str, str]) -> str:
    for name, value in env.items():
        if any(c.isspace() or c in "\"'" for c in name + value):
            raise ValueError(f"SetEnv cannot carry {name}={value!r}")
    return f"""\
# Written by tests/testbed for one test-bed host.
Port 22
HostKey {host_key}
PidFile none
AuthorizedKeysFile {authorized_keys}
# The keys live in the test bed's work directory, which is not root-only all the way up.
StrictModes no
# There is no PAM stack (nor logind behind it) to talk to inside the namespaces.
UsePAM no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UseDNS no
PrintMotd no
X11Forwarding no
AllowTcpForwarding yes
# Ray's cluster launcher opens many sessions at once.
MaxStartups 200
MaxSessions 200
Subsystem sftp internal-sftp
# Non-interactive sessions (what Ray and our tools use) get no profile: the PATH to `ray` and the
# no-usage-stats setting have to come from here.
SetEnv {" ".join(f"{k}={v}" for k, v in env.items())}
"""


@dataclass
class Node:
    """A process tree with its own PID, mount and UTS namespaces, in a network namespace."""

    # Short role name within the test bed: "client", "h1", "h2", ...
    name: str
    # Kernel hostname inside the node (its own UTS namespace).
    hostname: str
    # Address on the test network ("127.0.0.1" for a node in the root network namespace).
    ip: str
    # Network namespace name, or None for the root network namespace.
    netns: str | None
    # Environment of commands run in the node.
    env: dict[str, str]
    # Where the node's init and daemons write their output.
    log_path: Path
    # Root-namespace PID of the node's init (PID 1 inside), set by `start`.
    pid1: int = 0
    _pid1_start: int | None = field(default=None, repr=False)
    _proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    _popens: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    def start(self, setup: Sequence[Sequence[str]] = (), daemons: Sequence[Sequence[str]] = ()) -> int:
        """Launch the node's init (not waiting for it); return the PID to record for cleanup."""
        spec = {
            "hostname": self.hostname,
            "setup": [list(a) for a in setup],
            "daemons": [{"argv": list(a), "log": str(self.log_path)} for a in daemons],
        }
        argv = ["setpriv", "--pdeathsig", "KILL", "--"]
        if self.netns:
            argv += ["nsenter", f"--net={net.netns_path(self.netns)}", "--"]
        argv += ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--uts", "--"]
        argv += [sys.executable, str(HOSTINIT), json.dumps(spec)]
        # Truncated: a "ready" line left by an earlier run in the same directory must not count.
        with open(self.log_path, "wb") as log:
            # A session of its own: Ctrl+C on the CLI must reach our teardown, not kill hosts midway.
            self._proc = subprocess.Popen(
                argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                start_new_session=True,
            )
        return self._proc.pid

    def wait_started(self, deadline: float) -> None:
        """Wait until the init has done its setup; fail with the node's log if it died."""
        assert self._proc is not None, "start() first"
        process = self._proc
        children = Path(f"/proc/{process.pid}/task/{process.pid}/children")

        def ready() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"node {self.name} exited: {self.log_tail()}")
            if not self.pid1:
                with contextlib.suppress(OSError, ValueError, IndexError):
                    self.pid1 = int(children.read_text().split()[0])
                    self._pid1_start = proc_start_time(self.pid1)
            return bool(self.pid1) and b"hostinit: ready" in self.log_path.read_bytes()

        wait.until(ready, max(0.0, deadline - time.monotonic()), 0.01,
                   on_timeout=lambda: TimeoutError(f"node {self.name} not ready: {self.log_tail()}"))

    def log_tail(self, lines: int = 20) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def enter_argv(self, cwd: str = "/root") -> list[str]:
        """Prefix that runs a program inside this node (all its namespaces, as its processes see them)."""
        assert self.pid1, "node not started"
        return ["nsenter", f"--target={self.pid1}", "--net", "--mount", "--uts", "--pid", f"--wd={cwd}", "--"]

    def run(
        self, cmd: str, *, check: bool = False, timeout: float = 120, input: str | None = None,
        env: Mapping[str, str] | None = None, cwd: str = "/root",
    ) -> subprocess.CompletedProcess[str]:
        """Run a bash command line inside the node and wait for it (stdout/stderr captured).

        Background processes must redirect their output, or the capture waits for them.
        """
        done = subprocess.run(
            [*self.enter_argv(cwd), "bash", "-c", cmd], env={**self.env, **(env or {})},
            input=input, capture_output=True, text=True, timeout=timeout, check=False,
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"{self.name}: {cmd!r} exited {done.returncode}: {done.stderr.strip() or done.stdout.strip()}"
            )
        return done

    def popen(self, argv: Sequence[str], *, log: Path, env: Mapping[str, str] | None = None,
              ) -> subprocess.Popen[bytes]:
        """Start a long-running program inside the node; it gets SIGTERM when the Popen's process dies,
        and is killed with the node anyway."""
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [*self.enter_argv(), "setpriv", "--pdeathsig", "TERM", "--", *argv],
                env={**self.env, **(env or {})}, stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True,
            )
        self._popens.append(proc)
        return proc

    def stop(self) -> None:
        """Kill the node's init: the kernel then kills every process of its PID namespace."""
        if self.pid1 and is_alive(self.pid1, self._pid1_start):
            os.kill(self.pid1, signal.SIGKILL)
        # The unshare and nsenter parents exit once their child is gone; reaping them here (rather
        # than killing them first) leaves no zombie for the machine's init to collect.
        for proc in [*self._popens, *([self._proc] if self._proc else [])]:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        self._popens.clear()


@dataclass
class Host(Node):
    """A test-bed host: a node with its own network namespace, private home and sshd."""

    ssh_user: str = "root"
    # Private key (0600) accepted by every host's sshd.
    ssh_key_path: Path = Path()
    # known_hosts with every host's key, by IP.
    known_hosts_path: Path = Path()
    # SSH ProxyCommand template (with %h %p) that reaches the host from the root namespace.
    proxy_command: str = ""

    def ssh_argv(self, cmd: str | None = None) -> list[str]:
        """OpenSSH command line that logs into this host (and runs `cmd`, if given)."""
        opts = {
            "IdentitiesOnly": "yes",
            "BatchMode": "yes",
            "StrictHostKeyChecking": "yes",
            "UserKnownHostsFile": str(self.known_hosts_path),
            "ProxyCommand": self.proxy_command,
            "ConnectTimeout": "10",
            "LogLevel": "ERROR",
        }
        argv = ["ssh", "-F", "/dev/null", "-i", str(self.ssh_key_path)]
        for key, value in opts.items():
            argv += ["-o", f"{key}={value}"]
        return [*argv, f"{self.ssh_user}@{self.ip}", *([cmd] if cmd is not None else [])]

    def ssh(self, cmd: str, *, check: bool = False, timeout: float = 60, input: str | None = None,
            ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` on the host over real SSH, through the client namespace."""
        done = subprocess.run(self.ssh_argv(cmd), input=input, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if check and done.returncode != 0:
            raise RuntimeError(f"ssh {self.name}: {cmd!r} exited {done.returncode}: {done.stderr.strip()}")
        return done
