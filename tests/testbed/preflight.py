"""Can this machine run the test bed? One sentence saying why not, or None."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from tests.testbed.hosts import ray_bin_dir

# Debian package that provides each program, for the message.
_NEEDS = {
    "testbed": {
        "ip": "iproute2", "nsenter": "util-linux", "unshare": "util-linux", "setpriv": "util-linux",
        "mount": "mount", "sshd": "openssh-server", "ssh": "openssh-client", "nc": "netcat-openbsd",
    },
    "slurm": {
        "munged": "munge", "slurmctld": "slurmctld", "slurmd": "slurmd", "sbatch": "slurm-client",
        "squeue": "slurm-client", "scancel": "slurm-client", "sinfo": "slurm-client",
        "scontrol": "slurm-client",
    },
}
_SBIN = "/usr/local/sbin:/usr/sbin:/sbin"


@functools.cache
def unavailable(kind: str = "testbed") -> str | None:
    """Why the `kind` ("testbed", "slurm" or "ray") cannot run here, or None if it can."""
    if os.geteuid() != 0:
        return "the test bed needs root (network, PID and mount namespaces)"
    needs = dict(_NEEDS["testbed"])
    if kind == "slurm":
        needs.update(_NEEDS["slurm"])
    path = f"{os.environ.get('PATH', '')}:{_SBIN}"
    missing = sorted({pkg for prog, pkg in needs.items() if shutil.which(prog, path=path) is None})
    if missing:
        return f"missing Debian package(s) for the test bed: {' '.join(missing)}"
    if kind == "ray" and not Path(ray_bin_dir(), "ray").exists():
        return f"no `ray` executable next to this Python ({ray_bin_dir()}); pip install 'ray[default]'"
    probe = subprocess.run(
        ["unshare", "--net", "--pid", "--fork", "--mount-proc", "--uts", "--",
         "sh", "-c", "mount -t tmpfs tmpfs /mnt && ip link set lo up"],
        capture_output=True, text=True, check=False,
    )
    if probe.returncode != 0:
        return f"cannot create namespaces here (unprivileged container?): {probe.stderr.strip()}"
    return None


def require(kind: str = "testbed") -> None:
    """In a test: skip unless this machine can run `kind`; under CI=true, fail instead of skipping."""
    import pytest  # here, so the CLI does not need pytest

    reason = unavailable(kind)
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run the test bed, but: {reason}", pytrace=False)
    pytest.skip(reason)
