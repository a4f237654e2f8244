"""`Testbed`: N SSH hosts and a client namespace on a private network, all on this one machine."""

from __future__ import annotations

import atexit
import ipaddress
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from tests.testbed import hosts, net
from tests.testbed.hosts import Host, Node
from tests.testbed.registry import Registry, RunRecord

CLIENT_OCTET = 10
FIRST_HOST_OCTET = 11

# Runs inside the client namespace: one process polls every address, instead of one `nc` per try.
_WAIT_TCP = """
import socket, sys, time
deadline = time.monotonic() + float(sys.argv[1])
pending = set(sys.argv[2:])
while pending:
    for target in sorted(pending):
        host, port = target.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=0.2).close()
            pending.discard(target)
        except OSError:
            pass
    if pending:
        if time.monotonic() > deadline:
            sys.exit("not listening: " + " ".join(sorted(pending)))
        time.sleep(0.05)
"""


class Testbed:
    """Hosts reachable over real SSH, each with its own network, PID, mount and UTS namespaces.

    `Testbed(n_hosts, workdir)` builds everything (about a second) and tears it all down on `close()`,
    on leaving a `with` block, or at interpreter exit. `env` is added to the environment of commands
    run on the hosts, by `Host.run` and over SSH alike (e.g. `SLURM_CONF`).
    """

    __test__ = False  # not a pytest test class, despite the name

    def __init__(self, n_hosts: int, workdir: Path, *, env: Mapping[str, str] | None = None,
                 ready_timeout: float = 30) -> None:
        if n_hosts < 1:
            raise ValueError("a test bed needs at least one host")
        self.workdir = Path(workdir).resolve()
        #: Seconds spent in each phase of `__init__` and `close`, for the test report.
        self.timings: dict[str, float] = {}
        self.hosts: list[Host] = []
        self._extra_env = dict(env or {})
        self._registry = Registry()
        self._record: RunRecord | None = None
        self._nodes: list[Node] = []
        self._closed = False
        atexit.register(self.close)
        try:
            self._start(n_hosts, ready_timeout)
        except BaseException:
            self.close()
            raise

    # --- identity and addresses -------------------------------------------------------------

    @property
    def run_id(self) -> str:
        assert self._record is not None
        return self._record.run_id

    @property
    def subnet(self) -> ipaddress.IPv4Network:
        assert self._record is not None
        return ipaddress.IPv4Network(self._record.subnet)

    def netns_name(self, role: str) -> str:
        return f"{net.NETNS_PREFIX}{self.run_id}-{role}"

    def address(self, octet: int) -> str:
        return str(self.subnet.network_address + octet)

    @property
    def netns_names(self) -> list[str]:
        """Every network namespace of this test bed (bridge, client, hosts)."""
        return [self.netns_name("br"), *(n.netns for n in self._nodes if n.netns)]

    # --- the client namespace ---------------------------------------------------------------

    @property
    def client_prefix(self) -> list[str]:
        """argv prefix running a program in the client namespace (network only; the machine's files)."""
        return ["nsenter", f"--net={net.netns_path(self.client.netns or '')}", "--"]

    @property
    def proxy_command(self) -> str:
        """SSH ProxyCommand (OpenSSH `-o ProxyCommand=`, Ray's `auth.ssh_proxy_command`, or
        `paramiko.ProxyCommand` after substituting %h and %p) reaching any host from the root namespace."""
        return " ".join(self.client_prefix) + " nc %h %p"

    def client_run(self, cmd: str, *, check: bool = False, timeout: float = 120,
                   env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a bash command line in the client namespace (address .10) with the machine's files."""
        return self.client.run(cmd, check=check, timeout=timeout, env=env)

    def wait_tcp(self, targets: list[tuple[str, int]], timeout: float = 30) -> None:
        """Wait until every (ip, port) accepts TCP connections from the client namespace."""
        done = subprocess.run(
            [*self.client_prefix, sys.executable, "-c", _WAIT_TCP, str(timeout),
             *(f"{h}:{p}" for h, p in targets)],
            capture_output=True, text=True, timeout=timeout + 10, check=False,
        )
        if done.returncode != 0:
            raise TimeoutError(done.stderr.strip())

    # --- keys ---------------------------------------------------------------------------------

    @property
    def ssh_key_path(self) -> Path:
        return self.workdir / "ssh" / "id_ed25519"

    @property
    def known_hosts_path(self) -> Path:
        return self.workdir / "ssh" / "known_hosts"

    @property
    def authorized_keys_path(self) -> Path:
        return self.workdir / "ssh" / "authorized_keys"

    def authorize_key(self, public_key: str) -> None:
        """Let another key (e.g. one a fake cloud API generated) log into every host; takes effect at once."""
        with open(self.authorized_keys_path, "a") as out:
            out.write(public_key.strip() + "\n")

    # --- names -------------------------------------------------------------------------------

    @property
    def hosts_file(self) -> Path:
        """The /etc/hosts every node sees (one file, bind-mounted into each node)."""
        return self.workdir / "etc_hosts"

    def add_host_names(self, ip: str, names: list[str]) -> None:
        """Make every node resolve `names` to `ip` (e.g. a fake cloud API's real host names, so
        that clients without an endpoint setting reach the fake). Appended in place: the nodes'
        bind mounts keep seeing the same file."""
        with open(self.hosts_file, "a") as out:
            out.write(f"{ip} {' '.join(names)}\n")

    # --- lifecycle ----------------------------------------------------------------------------

    def _lap(self, phase: str, since: float) -> float:
        now = time.monotonic()
        self.timings[phase] = round(now - since, 3)
        return now

    def _start(self, n_hosts: int, ready_timeout: float) -> None:
        t0 = t = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        # Before any namespace exists: claim a subnet and blackhole it in the root namespace.
        self._record = self._registry.claim(self.workdir)
        t = self._lap("claim", t)

        ssh_dir = self.workdir / "ssh"
        ssh_dir.mkdir(exist_ok=True)
        pub = hosts.write_ed25519_key(self.ssh_key_path, f"rayfleet-testbed-{self.run_id}")
        self.authorized_keys_path.write_text(pub + "\n")
        env = hosts.node_env(self.run_id, self._extra_env)
        node_dir = self.workdir / "nodes"
        node_dir.mkdir(exist_ok=True)

        self.client = Node(
            name="client", hostname=f"rft{self.run_id}-client", ip=self.address(CLIENT_OCTET),
            netns=self.netns_name("c"), env=env, log_path=node_dir / "client.log",
        )
        for i in range(1, n_hosts + 1):
            self.hosts.append(Host(
                name=f"h{i}", hostname=f"rft{self.run_id}-h{i}",
                ip=self.address(FIRST_HOST_OCTET + i - 1), netns=self.netns_name(f"h{i}"), env=env,
                log_path=node_dir / f"h{i}.log", ssh_key_path=self.ssh_key_path,
                known_hosts_path=self.known_hosts_path, proxy_command=self.proxy_command,
            ))
        self._nodes = [self.client, *self.hosts]
        # Every node resolves every other by name (`hostname --ip-address`, Slurm, Ray logs).
        etc_hosts = self.hosts_file
        etc_hosts.write_text(
            "127.0.0.1 localhost\n" + "".join(f"{n.ip} {n.hostname}\n" for n in self._nodes)
        )
        known = []
        for host in self.hosts:
            key_path = ssh_dir / f"host_{host.name}_ed25519"
            known.append(f"{host.ip} {hosts.write_ed25519_key(key_path, host.hostname)}\n")
            cfg = ssh_dir / f"sshd_config_{host.name}"
            cfg.write_text(hosts.sshd_config(key_path, self.authorized_keys_path, env))
        self.known_hosts_path.write_text("".join(known))
        t = self._lap("files", t)

        net.build(self.subnet, self.netns_name("br"),
                  [net.Member(n.netns or "", n.ip) for n in self._nodes])
        t = self._lap("network", t)

        # sshd refuses to start without its privilege-separation directory.
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
        bind_hosts = ["mount", "--bind", str(etc_hosts), "/etc/hosts"]
        self._start_node(self.client, [bind_hosts], [])
        for host in self.hosts:
            private = node_dir / f"{host.name}-private"
            private.mkdir(exist_ok=True)
            sshd = ["/usr/sbin/sshd", "-D", "-e", "-f", str(ssh_dir / f"sshd_config_{host.name}"),
                    "-o", f"ListenAddress={host.ip}"]
            self._start_node(host, [*hosts.host_setup(private), bind_hosts], [sshd])
        deadline = time.monotonic() + ready_timeout
        for node in self._nodes:
            node.wait_started(deadline)
        t = self._lap("nodes", t)

        self.wait_tcp([(h.ip, 22) for h in self.hosts], timeout=max(1.0, deadline - time.monotonic()))
        t = self._lap("sshd", t)
        self.timings["up"] = round(t - t0, 3)

    def _start_node(self, node: Node, setup: list[list[str]], daemons: list[list[str]]) -> None:
        assert self._record is not None
        self._registry.add_pid(self._record, node.start(setup, daemons))

    def close(self) -> None:
        """Tear everything down (idempotent): processes, namespaces, the route, the run record."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.close)
        t0 = time.monotonic()
        errors: list[BaseException] = []
        for node in self._nodes:
            try:
                node.stop()
            except Exception as exc:  # keep going: the rest must still be removed
                errors.append(exc)
        if self._record is not None:
            with self._registry.locked():
                self._registry.release(self._record)
        self.timings["down"] = round(time.monotonic() - t0, 3)
        if errors:
            raise errors[0]

    def __enter__(self) -> Testbed:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def describe(self) -> str:
        """Human summary: hosts, IPs, key, proxy command."""
        lines = [f"test bed {self.run_id}: subnet {self.subnet}, work dir {self.workdir}",
                 f"  client     {self.client.ip:<15} {self.client.hostname}  (netns {self.client.netns})"]
        lines += [f"  {h.name:<10} {h.ip:<15} {h.hostname}  (netns {h.netns})" for h in self.hosts]
        lines += [f"  ssh user:       {self.hosts[0].ssh_user}",
                  f"  ssh key:        {self.ssh_key_path}",
                  f"  known_hosts:    {self.known_hosts_path}",
                  f"  proxy command:  {self.proxy_command}",
                  f"  e.g.            {shlex.join(self.hosts[0].ssh_argv())}"]
        return "\n".join(lines)
