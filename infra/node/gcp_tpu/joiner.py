"""The head's side of queued TPU slices: join ACTIVE ones to the cluster, replace lost spot ones.

A queue can take hours, so the head does this, not the laptop: `up` installs this daemon on the head
(through infra/core/remote_head.py, which ships the node package whole and supervises it) and it
runs there with only Ray, requests, Google's client and this package. Every `poll_s` it lists the cluster's
queued resources (queued.py) in every zone the slices may use, and:

- an ACTIVE request's hosts are set up over SSH from the head (Ray's `~/ray_bootstrap_key.pem`, a
  known_hosts file per request): the node installer from `~/rayfleet/setup`, the Ray token as a
  0600 file written through the SSH session's stdin (never on a command line), then the
  provider's start commands for TPU hosts (`start_commands`: Ray as an unprivileged user, the
  metadata server guarded) with `TPU: <chips per host>`, and `TPU-<type>-head: 1` on host 0;
- a FAILED or SUSPENDED request is recorded, and for spot slices a new request is queued in the
  next zone of the slice's list (wrapping around, at most `max_attempts` per slice).

Everything it sees goes into a JSON marker (`~/.rayfleet/queued-marker.json`) that `invoke status`
reads: per request its zone, state, since when, the hosts joined, and what replaced it.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from infra.node import raycli, shell
from infra.node.files import atomic_write
from infra.node.gcp_tpu import queued
from infra.node.gcp_tpu.api import ApiOptions, Gcp, GcpError
from infra.node.gcp_tpu.credentials import SCOPES, Credentials, find_credentials
from infra.node.wait import until
from infra.node.wire import VERSION, Wire

#: On the head, `~/`-relative (the 0700 folder that holds the token).
HEAD_CONFIG = "~/.rayfleet/queued.json"
HEAD_MARKER = "~/.rayfleet/queued-marker.json"
HEAD_LOG = "~/.rayfleet/queued.log"
SSH_TIMEOUT_S = 600


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def log(message: str) -> None:
    print(f"{now_iso()} queued: {message}", flush=True)


def _home(path: str) -> Path:
    return Path(path).expanduser()


@dataclass(frozen=True)
class Config(Wire):
    """What `up` writes for the joiner (infra/providers/gcp_tpu/slices.py; a 0600 file on the
    head, never a secret inside: the token and the tracking password are named by path)."""

    KIND = "the queued-slice joiner's config"

    cluster: str
    cluster_id: str
    project: str
    #: The head's GCS, host:port: the hosts' Ray joins it.
    head_address: str
    #: Who the joiner reaches the hosts as, with which key (Ray's copy of the cluster's key).
    ssh_user: str
    ssh_key: str
    #: The node installer's command line on a host.
    install_command: str
    #: queued.SliceRequest of each slice, as JSON (`requests`).
    slices: list[dict[str, Any]]
    token_path: str | None = None
    #: Where the marker goes; None: HEAD_MARKER.
    marker: str | None = None
    #: Seconds between rounds; None: 15.
    poll_s: float | None = None
    #: The autoscaled TPU hosts' start commands; None: a plain `ray start` (older providers).
    start_commands: list[str] | None = None
    #: `tracking: mlflow`: the head's server, its user and the head's copy of its password.
    tracking_url: str | None = None
    tracking_user: str | None = None
    tracking_password_path: str | None = None
    #: A service account key file; None: the head VM's own account.
    credentials_file: str | None = None
    api_endpoint: str | None = None
    #: Requests per spot slice before it is only reported; None: 10.
    max_attempts: int | None = None
    version: int = VERSION
    extra: dict[str, Any] = field(default_factory=dict)

    def requests(self) -> dict[str, queued.SliceRequest]:
        return {str(s["name"]): queued.SliceRequest.from_json(s) for s in self.slices}


def _credentials(config: Config) -> Credentials:
    """The head's own: a key file if the config names one, else google-auth's default, which on
    the head is its VM's service account through the metadata server (as Ray's autoscaler uses;
    asked directly, since the head is a Google VM by construction)."""
    if config.credentials_file:
        return find_credentials(config.credentials_file, "the head's joiner")
    import google.auth

    found, _ = google.auth.default(scopes=SCOPES)
    return Credentials(found, "the head's service account", None)


class Joiner:
    """One daemon's state: its config, the marker, and the joins under way."""

    def __init__(self, config: Config, api: Gcp | None = None) -> None:
        self.config = config
        self.cluster_id = str(config.cluster_id)
        self.slices = config.requests()
        self.api = api or Gcp(str(config.project), _credentials(config),
                              ApiOptions(endpoint=config.api_endpoint or None))
        self.marker_path = _home(str(config.marker or HEAD_MARKER))
        previous: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError):
            previous = json.loads(self.marker_path.read_text())
        # A restarted daemon keeps what it knew: which requests it joined and replaced.
        self.requests: dict[str, dict[str, Any]] = dict(previous.get("requests") or {})
        self.lock = threading.Lock()
        self.joining: dict[str, threading.Thread] = {}

    # --- marker ---------------------------------------------------------------------------

    def write_marker(self, error: str | None = None) -> None:
        with self.lock:
            data = {"cluster": self.config.cluster, "cluster_id": self.cluster_id,
                    "pid": os.getpid(), "checked_at": now_iso(), "error": error,
                    "requests": self.requests}
            text = json.dumps(data, indent=2) + "\n"
        # Join threads write it too: atomic_write's temporary file is per thread.
        atomic_write(self.marker_path, text)

    # --- one round ------------------------------------------------------------------------

    def zones(self) -> list[str]:
        seen: list[str] = []
        for request in self.slices.values():
            seen += [z for z in request.zones if z not in seen]
        return seen

    def step(self) -> None:
        """List the cluster's requests everywhere, record states, join or replace."""
        found: dict[str, dict[str, Any]] = {}
        for zone in self.zones():
            for resource in queued.listed(self.api, zone, self.cluster_id):
                found[queued.short(resource)] = resource
        for qr_id, resource in sorted(found.items()):
            state = queued.state_of(resource)
            zone = str(resource["name"]).split("/")[3]
            parsed = queued.parse_id(qr_id)
            assert parsed is not None  # queued.listed keeps only our ids
            with self.lock:
                record = self.requests.setdefault(qr_id, {
                    "zone": zone, "slice": parsed[1], "index": parsed[2], "attempt": parsed[3],
                    "state": None, "since": None, "joined": [], "replaced_by": None,
                    "error": None})
                if record["state"] != state:
                    log(f"{qr_id} ({zone}): {record['state'] or 'new'} -> {state}")
                    record.update(state=state, since=now_iso())
                failed = (resource.get("state") or {}).get("failedData") or {}
                if failed.get("error"):
                    record["error"] = str(failed["error"].get("message", ""))[:300]
            if state == queued.ACTIVE and not record["joined"] and qr_id not in self.joining:
                # The API is asked here, in this thread only: Google's client (httplib2) must
                # not be shared between threads; the joins only run SSH.
                hosts = self._hosts(resource)
                thread = threading.Thread(target=self._join, args=(qr_id, hosts), daemon=True)
                self.joining[qr_id] = thread
                thread.start()
            if state in queued.LOST and record["replaced_by"] is None:
                self._replace(qr_id, record, set(found))
        with self.lock:
            for qr_id, record in self.requests.items():
                if qr_id not in found and record["state"] != "GONE":
                    record.update(state="GONE", since=now_iso())
        for qr_id, thread in list(self.joining.items()):
            if not thread.is_alive():
                del self.joining[qr_id]

    def _replace(self, qr_id: str, record: dict[str, Any], existing: set[str]) -> None:
        request = self.slices.get(record["slice"])
        if request is None or request.provisioning != "spot":
            record["replaced_by"] = ""  # reported, not replaced (only spot slices are re-queued)
            return
        attempt = int(record["attempt"]) + 1
        if attempt >= int(self.config.max_attempts or 10):
            record["replaced_by"] = ""
            record["error"] = f"gave up after {attempt} requests"
            return
        zones = request.zones
        position = zones.index(record["zone"]) if record["zone"] in zones else -1
        zone = zones[(position + 1) % len(zones)]
        new_id = queued.request_id(self.cluster_id, request.name, int(record["index"]), attempt)
        if new_id not in existing:
            log(f"{qr_id} is {record['state']}: queueing {new_id} in {zone}")
            try:
                queued.create(self.api, zone, new_id,
                              queued.body(request, self.api.project, zone, new_id))
            except GcpError as exc:
                record["error"] = f"re-queueing in {zone} failed: {exc}"[:300]
                log(record["error"])
                return
        record["replaced_by"] = new_id

    # --- joining one ACTIVE request -----------------------------------------------------------

    def _hosts(self, resource: dict[str, Any]) -> list[str]:
        """The addresses of an ACTIVE request's hosts, host 0 first (the nodes' endpoints)."""
        hosts: list[str] = []
        for name in queued.node_names(resource):
            node = self.api.tpu_node(name)
            hosts += [str(e["ipAddress"]) for e in node.get("networkEndpoints") or []]
        return hosts

    def _join(self, qr_id: str, hosts: list[str]) -> None:
        record = self.requests[qr_id]
        request = self.slices[record["slice"]]
        try:
            log(f"{qr_id}: joining {len(hosts)} host(s) {', '.join(hosts)}")
            errors: list[str] = []
            threads = [threading.Thread(target=self._join_host_safe,
                                        args=(qr_id, request, ip, worker, errors))
                       for worker, ip in enumerate(hosts)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            with self.lock:
                if errors:
                    record["error"] = "; ".join(errors)[:300]
                else:
                    record.update(joined=hosts, joined_at=now_iso(), error=None)
            log(f"{qr_id}: {'joined' if not errors else 'failed: ' + '; '.join(errors)}")
        except Exception as exc:  # reported in the marker; the next round tries again
            with self.lock:
                record["error"] = f"{type(exc).__name__}: {exc}"[:300]
            log(f"{qr_id}: join failed: {record['error']}")
        self.write_marker()

    def _join_host_safe(self, qr_id: str, request: queued.SliceRequest, ip: str, worker: int,
                        errors: list[str]) -> None:
        try:
            self.join_host(qr_id, request, ip, worker)
        except Exception as exc:
            errors.append(f"{ip}: {exc}"[:200])

    def _ssh(self, qr_id: str, ip: str) -> list[str]:
        known = _home(f"~/.rayfleet/queued-known-hosts/{qr_id}")
        known.parent.mkdir(parents=True, exist_ok=True)
        # A fresh TPU VM: accept its key on first contact, pinned per request (a later slice
        # on a reused address gets a file of its own).
        return ["ssh", "-i", str(_home(self.config.ssh_key)), "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=accept-new", "-o", f"UserKnownHostsFile={known}",
                "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR",
                f"{self.config.ssh_user}@{ip}"]

    def _run(self, argv: list[str], what: str, stdin: Any = None, timeout: float = 600) -> None:
        done = subprocess.run(argv, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).split())[-200:]
            raise RuntimeError(f"{what} exited {done.returncode}: {tail}")

    def _send_secret(self, ssh: list[str], local: str, name: str, what: str) -> None:
        """The head's copy of a secret into the host's ~/.rayfleet/<name> (0600) through the
        session's stdin: never on a command line, never half-written."""
        with _home(local).open("rb") as handle:
            folder, tmp = shell.home("~/.rayfleet"), shell.home(f"~/.rayfleet/{name}.tmp")
            self._run([*ssh, shell.all_of(
                "umask 077", shell.argv("mkdir", "-p", folder), shell.argv("chmod", "700", folder),
                f"cat > {tmp}", shell.argv("mv", tmp, shell.home(f"~/.rayfleet/{name}")))],
                what, stdin=handle)

    def join_host(self, qr_id: str, request: queued.SliceRequest, ip: str, worker: int) -> None:
        """Set one TPU host up and start Ray there, joined to this head."""
        ssh = self._ssh(qr_id, ip)
        started = time.monotonic()
        self._copy_installer(ssh, ip)
        reached = time.monotonic()
        env = self._host_env(ssh, ip)
        script = self._start_script(qr_id, request, worker, env)
        self._run([*ssh, shell.argv("bash", "-c", shell.quoted(script))],
                  f"setting up {ip} and starting Ray", timeout=3600)
        log(f"{qr_id}: host {ip} joined (SSH after {reached - started:.1f} s, installer and "
            f"ray start {time.monotonic() - reached:.1f} s)")

    def _copy_installer(self, ssh: list[str], ip: str) -> None:
        """Once the host answers SSH: the node installer and the node users' scripts, as Ray's
        file_mounts put them on the head (a head from before the users has no users/: its hosts
        start Ray as before)."""
        until(lambda: subprocess.run([*ssh, "true"], stdin=subprocess.DEVNULL, capture_output=True,
                                     timeout=60, check=False).returncode == 0,
              SSH_TIMEOUT_S, 5, f"SSH to {ip}")
        folders = [f for f in ("setup", "users") if _home(f"~/rayfleet/{f}").is_dir()]
        with subprocess.Popen(["tar", "-C", str(_home("~/rayfleet")), "-cf", "-", *folders],
                              stdout=subprocess.PIPE) as tar:
            home = shell.home("~/rayfleet")
            self._run([*ssh, shell.all_of(shell.argv("mkdir", "-p", home),
                                          shell.argv("tar", "-C", home, "-xf", "-"))],
                      f"copying the installer to {ip}", stdin=tar.stdout)

    def _host_env(self, ssh: list[str], ip: str) -> dict[str, str]:
        """The environment of the host's Ray, its secrets sent to the host's 0600 copies first."""
        # Ray's own tools in jobs and actors (the state API, e.g. Ray Train's placement group
        # cleaner) find the cluster by RAY_ADDRESS, not by a scan for "the" Ray on the machine.
        env: dict[str, str] = {"RAY_USAGE_STATS_ENABLED": "0",
                               "RAY_ADDRESS": self.config.head_address}
        token = self.config.token_path
        if token:
            # Through the session's stdin: the token is never on a command line or in a file
            # other than this 0600 one.
            self._send_secret(ssh, str(token), "ray-token", f"sending the Ray token to {ip}")
            env.update(RAY_AUTH_MODE="token",
                       RAY_AUTH_TOKEN_PATH=shell.home("~/.rayfleet/ray-token"))
        tracking = self.config.tracking_url
        if tracking:
            # `tracking: mlflow`: the login the same way as the token; the start script reads it
            # from the host's 0600 copy, so it is on no command line.
            self._send_secret(ssh, str(self.config.tracking_password_path), "mlflow-password",
                              f"sending the tracking login to {ip}")
            env.update(MLFLOW_TRACKING_URI=str(tracking),
                       MLFLOW_TRACKING_USERNAME=str(self.config.tracking_user),
                       MLFLOW_TRACKING_PASSWORD=shell.Shell(
                           '"$(cat "$HOME/.rayfleet/mlflow-password")"'))
        return env

    def _start_script(self, qr_id: str, request: queued.SliceRequest, worker: int,
                      env: dict[str, str]) -> str:
        """The host's script: the installer, the environment's activation, then Ray's start."""
        resources: dict[str, float] = {"TPU": request.chips_per_host}
        if worker == 0:
            resources[f"TPU-{request.accelerator_type}-head"] = 1
        labels = f"rayfleet-queued={qr_id}"
        bashrc, activate = shell.home("~/.bashrc"), shell.home("~/rayfleet/env/rayfleet-activate.sh")
        prepare = [
            self.config.install_command,
            shell.subshell(shell.first_of(
                shell.argv("grep", "-qsF", "rayfleet-activate.sh", bashrc),
                f"{shell.argv('echo', f'. {activate}')} >> {bashrc}")),
            shell.argv(".", activate)]
        start = self.config.start_commands
        if start:
            # The autoscaled TPU hosts' own start commands (users, guard, Ray as Ray's user: the
            # provider builds them), given what Ray's updater would: the head's address and the
            # host's resources and labels as Ray's override variables.
            overrides = {"RAY_HEAD_IP": self.config.head_address.rsplit(":", 1)[0],
                         "RAY_OVERRIDE_RESOURCES": json.dumps({"CPU": request.cpus, **resources}),
                         "RAY_OVERRIDE_LABELS": json.dumps({"rayfleet-queued": qr_id})}
            return shell.all_of(*prepare, shell.export(overrides), *[str(c) for c in start])
        return shell.all_of(
            *prepare,
            shell.subshell(shell.first_of(f"{raycli.RAY} stop >/dev/null 2>&1", "true")),
            shell.lines(["ulimit -n 65536", shell.export(env), shell.argv(
                shell.Shell(raycli.RAY), "start", f"--address={self.config.head_address}",
                "--object-manager-port=8076", f"--num-cpus={request.cpus}",
                f"--resources={json.dumps(resources)}", f"--labels={labels}",
                "--disable-usage-stats")]))

    def run(self) -> None:
        every = float(self.config.poll_s or 15)
        log(f"watching queued slices of {self.config.cluster} in "
            f"{', '.join(self.zones())}, every {every:g} s")
        while True:
            error = None
            try:
                self.step()
            except Exception as exc:  # Google unreachable for a while: report, keep going
                error = f"{type(exc).__name__}: {exc}"[:300]
                log(error)
            self.write_marker(error)
            time.sleep(every)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.node.gcp_tpu.joiner",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    args = parser.parse_args(argv)
    path = args.config.expanduser()
    # Runs under infra/node/supervise.py, which keeps the pid file and starts it again if it dies.
    Joiner(Config.from_json(path.read_text())).run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
