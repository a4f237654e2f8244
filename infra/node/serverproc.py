"""Running one server in the foreground, below Ray's CPU priority, as the daemon that infra/node/supervise.py
restarts when it dies: the
MLflow tracking server (infra/node/tracking.py) and Prometheus (infra/node/metrics.py).

The server gets its own session and process group: a stop reaches every process it started (a
server's worker would otherwise outlive the supervisor, hold the port and escape the cluster's
process markers). SIGTERM or SIGINT to the supervisor stops the group, then the supervisor.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

#: How far below Ray's priority a server runs (a nice increment). Its start is a few CPU-seconds
#: of imports, right when Ray's agents finish starting and the first jobs arrive; on a 2-core head
#: it would take a core from them. Moderate, so that it still comes up on a busy machine and its
#: requests (a few ms each) are served while training saturates the head.
NICE = 5


def _yield_cpu() -> None:
    """Lower this process's priority by NICE; the server started after this inherits it."""
    with contextlib.suppress(OSError):
        os.nice(NICE)


def _yield_cpu_session(pid: int) -> None:
    """Give the session of `pid` this process's priority.

    With the kernel's autogroup scheduling (the default on desktop and many server kernels), each
    session shares the CPU as a whole, and a process's own nice value counts only inside its
    session; the server leads its own session, so its session's nice value is the one that yields
    to Ray. No file without autogroup (then the inherited nice value does it).
    """
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/autogroup").write_text(f"{os.getpriority(os.PRIO_PROCESS, 0)}\n")


def run_server(command: list[str], log_path: str, env: Mapping[str, str] | None = None,
               cwd: str | None = None, grace_s: float = 5.0) -> int:
    """Run `command` until it exits (its exit code) or the supervisor is told to stop."""
    _yield_cpu()
    with open(log_path, "a") as log:
        child = subprocess.Popen(command, env=env, cwd=cwd, stdout=log, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, start_new_session=True)
    _yield_cpu_session(child.pid)

    def stop(signum: int, _frame: Any) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGTERM)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        sys.exit(0)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return child.wait()
