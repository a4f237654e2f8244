"""A job that tries, from the head (the driver) and from an autoscaled TPU host (one task asking
for `TPU: 4`), what a hostile job on a Google VM would: ask the metadata server for the VM's
service-account token (with Google's `Metadata-Flavor` header, as google-auth does) and for any
other metadata, run `sudo -n true`, read the cluster's SSH private key where Ray and the
autoscaler keep it, and look for any private key file under the node's own trees.

Prints `RESULT <json>`: one report per node (the head's last). The test decides; the job only
tries.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.error
import urllib.request

import ray

METADATA = "http://metadata.google.internal/computeMetadata/v1/"
#: Where `ray up` and the node setup keep the cluster's private key on a head.
KEYS = ("/home/rayfleet-scaler/ray_bootstrap_key.pem", "/root/ray_bootstrap_key.pem")
#: The node's own trees (the test bed shares this machine's /usr, /work and toolchains with every
#: host, read-only to a job, and not where a node keeps its secrets).
ROOTS = ("/home", "/root", "/etc", "/tmp/ray", "/dev/shm", "/var", "/run", "/opt", "/srv")


def metadata(path: str) -> str:
    """The answer's status, or the error class that stopped the request."""
    request = urllib.request.Request(METADATA + path, headers={"Metadata-Flavor": "Google"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return f"HTTP {response.status}: {response.read(200)!r}"
    except urllib.error.HTTPError as exc:
        return f"HTTP {exc.code}"
    except urllib.error.URLError as exc:
        return type(exc.reason).__name__
    except OSError as exc:
        return type(exc).__name__


def read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return f"read {len(handle.read())} bytes"
    except OSError as exc:
        return type(exc).__name__


def private_keys() -> list[str]:
    found = []
    for root in ROOTS:
        for folder, dirs, names in os.walk(root, onerror=lambda _: None):
            dirs[:] = [d for d in dirs if d not in (".venv", "site-packages", ".pyenv")]
            for name in names:
                path = os.path.join(folder, name)
                try:
                    if not os.path.isfile(path) or os.path.getsize(path) > 65536:
                        continue
                    with open(path, "rb") as handle:
                        head = handle.read(80)
                except OSError:
                    continue
                if head.startswith(b"-----BEGIN") and b"PRIVATE KEY-----" in head:
                    found.append(path)
    return found


def probe() -> dict[str, object]:
    sudo = subprocess.run(["sudo", "-n", "true"], capture_output=True, check=False)
    return {
        "host": socket.gethostname(), "uid": os.getuid(),
        "user": subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip(),
        "groups": subprocess.run(["id", "-Gn"], capture_output=True, text=True).stdout.split(),
        "token": metadata("instance/service-accounts/default/token"),
        "project": metadata("project/project-id"),
        "sudo": sudo.returncode,
        "keys": {path: read(path) for path in KEYS},
        "private_keys": private_keys(),
        "tpu_env": {k: v for k, v in os.environ.items() if k.startswith("TPU_")},
    }


ray.init()


@ray.remote(num_cpus=0, resources={"TPU": 4})
def on_tpu_host() -> dict[str, object]:
    return probe()


reports = [ray.get(on_tpu_host.remote(), timeout=600), probe()]
print("RESULT " + json.dumps(reports), flush=True)
