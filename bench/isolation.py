"""`sharing.isolation: cluster` on the local provider: a member's first job on a cold member
cluster against the same job on the shared (base) cluster, and the head machine's memory per
active member cluster.

Measured on tests/local/test_e2e_isolation.py's cluster (its bed: a real local cluster, root, a
mount namespace of its own), side by side in one run: `first_result` times stock `ray job submit`
(which waits for the job's end and prints its output) through the gateway, for a member whose
cluster is not running yet (the start is inside the time), again on their now warm cluster, and
for the owner on the base cluster (the gateway forwards it there, as in `isolation: shared`);
`member_memory` sums the resident memory (RSS, and PSS: shared pages split among their users) of
every process of the member's Unix user with their cluster idle. The line to read:
cold - shared (target <= 10 s), and MB per active member.

Usage: python bench/isolation.py [--quick]   (as root; runs that e2e module's bench test)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JOB = ("python", "-c", "print(6 * 7)")


def first_result(submit: Callable[[], str]) -> float:
    """Seconds until `submit` (a stock `ray job submit` that waits) returned the job's output."""
    started = time.monotonic()
    output = submit()
    took = time.monotonic() - started
    if "42" not in output:
        raise RuntimeError(f"the job's result is not in its output: {output[-300:]}")
    return took


def member_memory(uid: int) -> tuple[float, float]:
    """(RSS, PSS) in MB of every process of `uid` (one member cluster, idle)."""
    import psutil

    rss = pss = 0
    for proc in psutil.process_iter(["uids"]):
        try:
            if proc.info["uids"] and proc.info["uids"].real == uid:
                info = proc.memory_full_info()
                rss, pss = rss + info.rss, pss + getattr(info, "pss", info.rss)
        except psutil.Error:
            continue
    return rss / 2**20, pss / 2**20


def summary(cold: float, warm: float, shared: float, rss: float, pss: float) -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"first job result: cold member {cold:.1f} s, warm member {warm:.1f} s, shared "
            f"{shared:.1f} s; cold - shared {cold - shared:.1f} s (target <= 10 s); head memory "
            f"per active member cluster RSS {rss:.0f} MB PSS {pss:.0f} MB (load average {load})")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    parser.parse_args()
    if os.geteuid() != 0:
        print("bench/isolation.py needs root (member users are made)", file=sys.stderr)
        return 2
    return subprocess.run(["flock", "/tmp/rayfleet-e2e.lock", sys.executable, "-m", "pytest",
                           "-n", "0", "-p", "no:cacheprovider", "-s", "-q",
                           "tests/local/test_e2e_isolation.py", "-k", "bench"],
                          cwd=ROOT, check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
