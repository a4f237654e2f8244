"""A job that tries, from the head (the driver) and from N autoscaled workers (one task each, a
STRICT_SPREAD placement group of one-GPU bundles), everything a hostile job would to get at the
cluster's cloud credential and the machines: it reads every file its user can open under the
node's own trees, looking for anything shaped like a Lambda API key or an SSH private key; calls
the Lambda API (LAMBDA_API_URL, as the test bed gives every node) with each key found and with
none; runs `sudo -n true`; writes into the autoscaler's home; logs into the other nodes over SSH
with each private key found and the SSH client's defaults; and lists every process (`ps`). It
also asks the cluster's tracking server, with the login jobs get, which must still answer.

Usage: privilege_probe.py N [PATH TO SKIP]...
Prints `RESULT <json>`: one report per node. The test decides; the job only tries.
"""

from __future__ import annotations

import base64
import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import ray
from ray.util.placement_group import placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

#: A Lambda API key's shape (secret_<name>_<hex>), and an OpenSSH/PEM private key's first line.
KEY = re.compile(rb"secret_[A-Za-z0-9_]{8,}")
PRIVATE = b"PRIVATE KEY-----"
#: The node's own trees (the test bed shares this machine's /usr, /work and toolchains read-only
#: with every host: the same on each, and not where a node keeps its secrets).
ROOTS = ("/home", "/root", "/tmp", "/dev/shm", "/etc", "/var", "/run", "/opt", "/srv", "/mnt")
LIMIT_BYTES = 4 * 1024 * 1024
BUDGET_S = 300.0
#: Paths the test names after the count: what the test bed's hosts share with the machine that runs
#: the tests (its own users' homes under /home), not the node's.
SKIP = tuple(sys.argv[2:])


def scan() -> dict[str, object]:
    keys: dict[str, list[str]] = {}
    private: list[str] = []
    files = denied = 0
    started = time.monotonic()
    paths = [f"/proc/{p}/{f}" for p in os.listdir("/proc") if p.isdigit() for f in ("cmdline", "environ")]
    for root in (*ROOTS, os.getcwd()):
        for folder, dirs, names in os.walk(root, onerror=lambda _: None):
            # Another PID namespace's view of /proc is not ours; the venv of the tests is shared code.
            dirs[:] = [d for d in dirs if d not in ("proc", "sys", ".venv", "site-packages")
                       and os.path.join(folder, d) not in SKIP]
            paths += [os.path.join(folder, n) for n in names]
    for path in paths:
        if time.monotonic() - started > BUDGET_S:
            break
        try:
            # (/proc's files say size 0 and are read whatever they say)
            special = path.startswith("/proc/")
            if not special and (not os.path.isfile(path) or os.path.getsize(path) > LIMIT_BYTES):
                continue
            with open(path, "rb") as handle:
                data = handle.read(LIMIT_BYTES)
        except OSError:
            denied += 1
            continue
        files += 1
        for found in set(KEY.findall(data)):
            keys.setdefault(found.decode(), []).append(path)
        # A key file, not a file that mentions one (the project's own fakes and references do).
        if data.lstrip().startswith(b"-----BEGIN") and PRIVATE in data[:80]:
            private.append(path)
    return {"keys": keys, "private_keys": private, "files_read": files, "denied": denied,
            "complete": time.monotonic() - started <= BUDGET_S}


def call_api(keys: list[str]) -> dict[str, int]:
    url = os.environ.get("LAMBDA_API_URL", "") + "/instances"
    answers = {}
    for key in ["", *keys]:
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                answers[key[:14] or "(none)"] = response.status
        except urllib.error.HTTPError as exc:
            answers[key[:14] or "(none)"] = exc.code
        except OSError as exc:
            answers[key[:14] or "(none)"] = -1
            print(f"API call failed: {exc}", file=sys.stderr)
    return answers


def run(argv: list[str]) -> int:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode
    except (OSError, subprocess.TimeoutExpired):
        return -1


def ssh_logins(others: list[str], keys: list[str]) -> dict[str, int]:
    tried = {}
    options = ["-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
               "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=5", "-o", "LogLevel=ERROR"]
    for ip in others:
        for user in ("root", "ubuntu", "rayfleet-ray", "rayfleet-scaler"):
            for key in [None, *keys]:
                identity = ["-i", key] if key else []
                tried[f"{user}@{ip} {key or 'default keys'}"] = run(
                    ["ssh", *options, *identity, f"{user}@{ip}", "true"])
    return tried


def tracking() -> int:
    """The cluster's MLflow server, with the login Ray hands every job: the HTTP status."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return -2
    login = f"{os.environ.get('MLFLOW_TRACKING_USERNAME')}:{os.environ.get('MLFLOW_TRACKING_PASSWORD')}"
    request = urllib.request.Request(
        f"{uri}/api/2.0/mlflow/experiments/search?max_results=1",
        headers={"Authorization": "Basic " + base64.b64encode(login.encode()).decode()})
    # The server may still be starting (`up` does not wait for MLflow's first answer): a refused
    # connection is retried for a while, as MLflow's own client does.
    deadline = time.monotonic() + 180
    while True:
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return int(response.status)
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError as exc:
            if time.monotonic() > deadline:
                print(f"tracking server at {uri}: {exc}", file=sys.stderr)
                return -1
            time.sleep(2)


def write_scaler_home() -> str:
    try:
        with open("/home/rayfleet-scaler/written-by-a-job", "w") as handle:
            handle.write("x")
    except OSError as exc:
        return type(exc).__name__
    return "written"


def probe(others: list[str]) -> dict[str, object]:
    found = scan()
    keys = sorted(found["keys"])  # type: ignore[call-overload]
    ps = subprocess.run(["ps", "-eo", "user:20,args"], capture_output=True, text=True, check=False)
    return {
        "host": socket.gethostname(), "uid": os.getuid(),
        "user": subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(),
        "groups": subprocess.run(["id", "-Gn"], capture_output=True, text=True).stdout.split(),
        "scan": found, "api": call_api(keys), "sudo": run(["sudo", "-n", "true"]),
        "write_scaler_home": write_scaler_home(), "tracking": tracking(),
        "ssh": ssh_logins(others, found["private_keys"]),  # type: ignore[arg-type]
        "ps": ps.stdout,
    }


count = int(sys.argv[1]) if len(sys.argv) > 1 else 2
ray.init()
group = placement_group([{"GPU": 1}] * count, strategy="STRICT_SPREAD")
ray.get(group.ready(), timeout=900)
nodes = [n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]]


@ray.remote(num_gpus=1, num_cpus=0)
def remote_probe(addresses: list[str]) -> dict[str, object]:
    own = ray.util.get_node_ip_address()
    return probe([a for a in addresses if a != own])


reports = ray.get([remote_probe.options(
    scheduling_strategy=PlacementGroupSchedulingStrategy(group, i)).remote(nodes)
    for i in range(count)])
own = ray.util.get_node_ip_address()
reports.append(probe([a for a in nodes if a != own]))
print("RESULT " + json.dumps(reports), flush=True)
