"""An autoscaling Lambda cluster's world on the test bed, shared by the e2e tests and the bench.

The fake Lambda API (tests/lambda_cloud/fake_api.py) hands out the test-bed hosts' addresses as
instances (and nothing else); terminating an instance stops Ray on its host. The head reaches the
fake through a relay: the fake listens on 127.0.0.1 here, a socat in this namespace serves it as a
unix socket, and a socat on each host serves that socket on the host's own 127.0.0.1 (plain http
is allowed to loopback only). Every SSH session on the hosts gets `LAMBDA_API_URL` for that relay
plus the documented knobs that make Ray's autoscaler quick.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from infra.core.privilege import MONITOR_PID, RAY_USER, SCALER_LOGS, SCALER_USER
from infra.core.shipping import NODE_DIR
from tests.conftest import run_invoke
from tests.lambda_cloud.bed_firewall import EnforcedFirewall
from tests.lambda_cloud.fake_api import FakeLambda
from tests.testbed import Testbed
from tests.testbed.hosts import LIVE_PROCESSES
from tests.waiting import wait_until, wait_while

#: Drawn per run, so that no file of the project (which a job's working_dir uploads to the
#: cluster) contains it: the key scan then finds only what rayfleet put somewhere.
API_KEY = f"secret_lambda_{secrets.token_hex(12)}"
LAUNCH = "/instance-operations/launch"
CLUSTER = "ltscale"
RELAY_PORT = 18765
CAPACITY = {("cpu_4x_general", "us-west-1"): 1, ("gpu_1x_a10", "us-west-1"): 2,
            ("gpu_1x_a100_sxm4", "us-west-1"): 2}


def capacity_for(workers: int) -> dict[tuple[str, str], int]:
    """CAPACITY with room for `workers` GPU instances of the first choice (a bench's scale-up)."""
    return {**CAPACITY, ("gpu_1x_a10", "us-west-1"): max(workers, CAPACITY[("gpu_1x_a10", "us-west-1")])}


#: Ray's processes on a host, zombies (already dead, waiting for the reaper) excluded.
RAY_PROCESSES = f"{LIVE_PROCESSES} | grep -E '[r]aylet|[g]cs_server|[r]ay::|[d]ashboard' || true"


#: The head's Ray autoscaler processes: the monitor's own command line starts with its Python and
#: `-u -m ray.autoscaler...`; its supervisor's names it only after `run ... --` (the bracket keeps
#: the pattern from matching itself).
AUTOSCALER_PIDS = f"pgrep -u {SCALER_USER} -f '^[^ ]+ -u -m ray[.]autoscaler'"
#: The head's autoscaler's supervisor (privilege.start_monitor), as root on the head: `supervise`
#: from the node package the autoscaler's user holds, and its pid file.
SUPERVISE = (f"PYTHONPATH=$(ls -t ~{SCALER_USER}/{NODE_DIR}/*.zip | head -n 1) "
             f"python3 -m infra.node.supervise")
MONITOR_PIDFILE = f"~{SCALER_USER}/{MONITOR_PID}"
#: Whether a host reaches the fake through its relay (401: reached, without a key).
API_PROBE = ("echo \"# the API from here: HTTP $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 "
             f"http://127.0.0.1:{RELAY_PORT}/api/v1/instance-types)\"")
#: The head's part of `Scaled.explain` (as root on the host: the autoscaler's home is 0700). Ray's
#: CLI needs the cluster's token, which Ray's user holds. Of the autoscaler's logs: what happened to
#: instances (and every error) since it started, then its last lines; Ray's legacy-field warnings
#: (one pair per autoscaler loop) left out.
DIAGNOSE_HEAD = (
    f"echo '# ray status -v'; RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH=~{RAY_USER}/.rayfleet/ray-token"
    " timeout 30 ray status -v --address 127.0.0.1:6379 2>&1 | tail -n 60; "
    # Ray's monitor runs under the head's supervisor, which starts it again when it dies: none
    # running with a live supervisor means it keeps dying (its log says why); none at all, that
    # the supervisor went too. A dead one leaves demands pending and no node ever launched.
    f"pid=$(cat {MONITOR_PIDFILE} 2>/dev/null); "
    f"running=$({AUTOSCALER_PIDS} | tr '\\n' ' '); "
    "echo \"# the autoscaler: pid file says ${pid:-nothing}; running: ${running:-NONE}\"; "
    f"echo \"# its supervisor: $({SUPERVISE} status --pidfile {MONITOR_PIDFILE} 2>&1)\"; "
    f"for f in ~{SCALER_USER}/{SCALER_LOGS}/monitor.log ~{SCALER_USER}/{SCALER_LOGS}/monitor.out; "
    "do [ -f \"$f\" ] || continue; echo \"# $f: its instances' transitions, launches and errors\"; "
    "grep -E 'instance_manager|event_logger|node_provider|WARNING|ERROR|Error|Traceback' \"$f\" "
    "| grep -v 'legacy field' | cut -c1-400 | tail -n 60; echo \"# $f: its end\"; "
    "grep -v 'legacy field' \"$f\" | cut -c1-400 | tail -n 30; done; true")


def power_off(host: Any) -> None:
    """What terminating an instance does to its machine: Ray stops, and nothing of it is left
    (`ray stop --force` returns while the dashboard's subprocesses are still exiting)."""
    host.run("ray stop --force", timeout=60)
    wait_while(lambda: host.run(RAY_PROCESSES).stdout.strip(), "Ray's processes to exit",
               timeout=30, interval=0.2)


@dataclass
class Scaled:
    bed: Testbed
    fake: FakeLambda
    spec: Path
    home: Path
    env: dict[str, str]
    #: Set on a bed built with `enforce_firewall` (bed_firewall.py).
    firewall: EnforcedFirewall | None = None
    #: The API's relays (this namespace's, then each host's) and the folder of their logs.
    relays: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    work: Path | None = None

    def invoke(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """`invoke <verb> --cluster <spec> <rest>` as a user runs it."""
        return run_invoke(args[0], "--cluster", str(self.spec), *args[1:], env=self.env,
                          timeout=timeout)

    def launches(self) -> int:
        return len([s for _, s in self.fake.requests("POST", LAUNCH) if s == 200])

    def workers(self) -> list[dict[str, Any]]:
        """Our live autoscaled instances in the fake."""
        return [i for i in self.fake.inventory() if not i["foreign"]
                and i["tags"].get("ray-node-type") == "worker" and i["status"] != "terminated"]

    def head(self) -> dict[str, Any]:
        heads = [i for i in self.fake.inventory() if i["tags"].get("ray-node-type") == "head"
                 and i["status"] != "terminated"]
        assert len(heads) == 1, heads
        return heads[0]

    def host(self, ip: str) -> Any:
        return next(h for h in self.bed.hosts if h.ip == ip)

    def head_files_holding_the_key(self) -> list[str]:
        """The files on the head's own disk that hold the API key: its homes, Ray's logs and
        session files, shared memory; and every process's command line and environment. The key
        is fed to grep on stdin, so grep's own command line is clean. The host's /root and /home
        are copy-on-write layers over this machine's: what the machine had there is skipped (it
        is not the node's)."""
        head = self.host(self.head()["ip"])
        # Only the top level is this machine's: a folder of the same name deeper down (the
        # scaler's ~/.rayfleet beside this machine's /root/.rayfleet) is the node's own.
        listed = head.run("for top in /root /home; do ls -A \"$top\" | sed \"s|^|$top/|\"; done",
                          timeout=60).stdout.split()
        roots = [path for path in listed if not Path(path).is_dir()]
        found = head.run("cd /root && grep -rlsF --binary-files=text -f /dev/stdin "
                         f"{' '.join(shlex.quote(r) for r in roots)} "
                         "/tmp/ray /dev/shm /proc/[0-9]*/cmdline /proc/[0-9]*/environ; "
                         "true", input=API_KEY + "\n", timeout=300)
        return sorted(line for line in found.stdout.split("\n") if line)

    def wait(self, what: str, check: Callable[[], Any], timeout: float = 240) -> Any:
        return wait_until(check, what, timeout=timeout, interval=0.5)

    def autoscaler_pids(self) -> list[str]:
        """The head's Ray autoscaler processes (run apart as the autoscaler's user, under the
        head's supervisor): none means the cluster never scales again."""
        head = self.host(self.head()["ip"])
        return head.run(AUTOSCALER_PIDS).stdout.split()

    def explain(self) -> str:
        """What a failed scaling step needs for its post-mortem (the bed goes with the run): the
        fake's instances and requests, the enforced firewall, on the head Ray's view (`ray status
        -v`) and the separated autoscaler's log and process, and on every instance host its Ray
        processes and sshd log (the autoscaler sets workers up over SSH)."""
        inventory = self.fake.inventory()
        parts = ["--- fake Lambda: instances ---", *(json.dumps(i, sort_keys=True) for i in inventory)]
        with self.fake.lock:
            log = list(self.fake.log)
        start = log[0][0] if log else 0.0
        lines = [f"{t - start:8.2f} {m} {p} {s}" for t, m, p, s in log]
        # The autoscaler lists the instances every second: all but those listings, and the last few.
        polls = {i for i, (_, m, p, s) in enumerate(log) if (m, p, s) == ("GET", "/instances", 200)}
        shown = [line for i, line in enumerate(lines) if i not in polls or i >= len(log) - 10]
        parts.append(f"--- fake Lambda: {len(log)} requests (s since the first; now: "
                     f"{time.monotonic() - start:.2f}), without {len(polls)} plain instance "
                     "listings but the last ones ---")
        parts += shown[-120:]
        # The head reaches the fake only through the relays: a dead one blinds its autoscaler
        # while everything run from here still works.
        parts.append("--- API relays (exit status, None: running) ---")
        parts += [f"{name}: {proc.poll()}" for name, proc in self.relays.items()]
        for log_file in sorted(self.work.glob("relay-*.log")) if self.work else []:
            parts.append(f"{log_file.name}: {log_file.read_text(errors='replace')[-2000:]}")
        if self.firewall is not None:
            parts.append(f"--- bed firewall: errors {self.firewall.errors} ---")
            parts += [f"{ip}:\n{text}" for ip, text in self.firewall.applied.items()]
        live = {i["ip"]: i for i in inventory if i["ip"] and not i["foreign"]
                and i["status"] != "terminated"}
        for host in self.bed.hosts:
            inst = live.get(host.ip)
            if inst is None:
                continue
            parts.append(f"--- {host.name}: {inst['name']} ({inst['status']}) ---")
            command = (f"{API_PROBE}; {DIAGNOSE_HEAD}" if inst["tags"].get("ray-node-type") == "head"
                       else RAY_PROCESSES)
            with contextlib.suppress(Exception):
                parts.append(host.run(command, timeout=90).stdout[-15000:])
            parts.append(host.log_tail(40))
        return "\n".join(parts)

    @contextlib.contextmanager
    def explained(self) -> Iterator[None]:
        """Print `explain()` when the block fails (pytest shows it with the failure)."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(Exception):
                print(f"\n[post-mortem]\n{self.explain()}", flush=True)
            raise


@contextlib.contextmanager
def autoscale_bed(work: Path, *, scale: float, boot_delay: float, hosts: int = 4,
                  idle_minutes: float = 0.1, max_workers: int = 2,
                  capacity: dict[tuple[str, str], int] | None = None,
                  tracking: bool = False, instance_hosts: int | None = None,
                  enforce_firewall: bool = False) -> Iterator[Scaled]:
    """The test bed, the fake, the relays and the cluster's spec (with `tracking: mlflow` when
    `tracking`); tears the cluster down after. The fake hands out the first `instance_hosts`
    hosts (all by default); the others stay machines of the bed that are no instance (a member's
    laptop, someone outside). `enforce_firewall`: the rulesets attached to an instance filter what
    reaches its host (bed_firewall.py)."""
    relay_url = f"http://127.0.0.1:{RELAY_PORT}/api/v1"
    bed = Testbed(hosts, work / "bed", env={
        "AUTOSCALER_UPDATE_INTERVAL_S": "1", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0",
        "LAMBDA_API_URL": relay_url})
    fake = FakeLambda(API_KEY, scale=scale, boot_delay=boot_delay, terminate_delay=0.3,
                      forget_delay=30, capacity=dict(capacity or CAPACITY),
                      ip_pool=[h.ip for h in bed.hosts[:instance_hosts]])
    fake.add_foreign_instance(f"{CLUSTER}-head")  # a colleague's, same cluster name
    fake.add_foreign_ruleset(f"rayfleet-{CLUSTER}-colleague", "us-west-1")
    by_ip = {h.ip: h for h in bed.hosts}
    # Terminating an instance powers the machine off: Ray on that host stops with it.
    fake.on_terminate = lambda inst: power_off(by_ip[str(inst.ip)])
    fake.start()
    sock = work / "api.sock"
    port = fake.url.split(":")[2].split("/")[0]
    # socat's errors (it logs them on stderr) stay for the post-mortem, as the hosts' relays' do.
    with open(work / "relay-root.log", "ab") as relay_log:
        relay = subprocess.Popen(["socat", f"UNIX-LISTEN:{sock},fork,mode=600",
                                  f"TCP:127.0.0.1:{port}"], stdout=subprocess.DEVNULL,
                                 stderr=relay_log)
    relays = []
    enforcer = None
    home = work / "rayfleet-home"
    env = {"RAYFLEET_HOME": str(home), **fake.client_env(), "COLUMNS": "200"}
    spec = work / f"{CLUSTER}.yaml"
    try:
        wait_until(sock.exists, "the relay socket", timeout=10, interval=0.05)
        for host in bed.hosts:
            relays.append(host.popen(["socat", f"TCP-LISTEN:{RELAY_PORT},bind=127.0.0.1,fork,reuseaddr",
                                      f"UNIX-CONNECT:{sock}"], log=work / f"relay-{host.name}.log"))
        spec.write_text(yaml.safe_dump({
            "provider": "lambda",
            "head": {"choices": [{"instance_type": "cpu_4x_general", "region": "us-west-1"}]},
            "worker_types": {"gpu": {
                "choices": [{"instance_type": "gpu_1x_a10", "region": "us-west-1"},
                            {"instance_type": "gpu_1x_a100_sxm4", "region": "us-west-1"}],
                "min_workers": 0, "max_workers": max_workers, "resources": {"CPU": 1, "GPU": 1}}},
            "idle_timeout_minutes": idle_minutes,
            "ssh_user": "root", "ssh_proxy_command": bed.proxy_command, "env": "none",
            "ssh_source_ranges": ["203.0.113.0/24"],
            "object_store_memory_mb": 100, "boot_timeout_s": int(boot_delay) + 120,
            "ray_timeout_s": 300, **({"tracking": "mlflow"} if tracking else {}),
            # Workers live seconds here: scraped often enough for the report to see them.
            "metrics": "prometheus", "metrics_history": {"scrape_interval_s": 2},
        }))
        # The instances "boot" with the cluster's key authorized, as Lambda's would.
        saved = os.environ.get("RAYFLEET_HOME")
        os.environ["RAYFLEET_HOME"] = str(home)
        try:
            from infra.core import ssh

            bed.authorize_key(ssh.ensure_keypair(CLUSTER).public_key)
        finally:
            if saved is None:
                os.environ.pop("RAYFLEET_HOME", None)
            else:
                os.environ["RAYFLEET_HOME"] = saved
        if enforce_firewall:
            assert shutil.which("nft"), "the bed's firewall needs nftables (apt-get install nftables)"
            enforcer = EnforcedFirewall(fake, bed.hosts[:instance_hosts]).start()
        yield Scaled(bed, fake, spec, home, env, enforcer,
                     {"root": relay, **{h.name: p for h, p in zip(bed.hosts, relays, strict=True)}},
                     work)
    finally:
        with contextlib.suppress(Exception):
            run_invoke("teardown", "--cluster", str(spec), env=env, timeout=600)
        if enforcer is not None:
            enforcer.stop()
        for process in relays:
            process.terminate()
        relay.terminate()
        relay.wait(timeout=10)
        fake.stop()
        bed.close()


def stop_autoscaler(head: Any) -> None:
    """Stop the head's autoscaler for good, through its supervisor (pid file by identity), for a
    scenario that needs no autoscaler: a monitor killed alone is back within seconds."""
    head.run(f"{SUPERVISE} stop --pidfile {MONITOR_PIDFILE}", check=True, timeout=60)
    wait_while(lambda: head.run(AUTOSCALER_PIDS).stdout.strip(), "the autoscaler to stop",
               timeout=30, interval=0.2)
