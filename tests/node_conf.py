"""A node.conf (infra/core/node_start.py) read as setup/users/node.sh reads it: sourced by bash."""

from __future__ import annotations

import subprocess
import tempfile

#: Where Ray's launcher says the head is, when a worker's flags are read.
HEAD_IP = "10.9.8.7"


def array(conf: str, name: str) -> list[str]:
    """The array `name` of `conf` after bash sourced it (RAY_HEAD_IP set, as for a worker)."""
    with tempfile.NamedTemporaryFile("w", suffix=".conf") as file:
        file.write(conf)
        file.flush()
        run = subprocess.run(["bash", "-c", f'. "$1" && printf "%s\\n" "${{{name}[@]}}"', "conf",
                              file.name], capture_output=True, text=True, timeout=30,
                             env={"PATH": "/usr/bin:/bin", "HOME": "/home/x",
                                  "RAY_HEAD_IP": HEAD_IP})
    assert run.returncode == 0 and run.stderr == "", run.stderr
    return run.stdout.splitlines()


def words(conf: str, role: str) -> str:
    """What Ray's user's shell runs before `ray start` for `role` (node.sh joins them so)."""
    return " ".join(array(conf, f"{role}_env"))
