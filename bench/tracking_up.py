"""`invoke up` (local) with `tracking: mlflow` next to the same spec without it.

Each run is timed until `up` returns (the dashboard accepts jobs); `up` does not wait for the
tracking server. Right after `up` returns, a first job (examples/cpu_example.py, 2 tasks) is
submitted and timed to its end: that is where the server's start-up (a few CPU-seconds of imports)
would cost, competing with the job and with Ray's own work after readiness. The server's own time to
answer is printed beside.

Fairness: a warm-up pair (not counted) takes the cold caches (the first Ray and MLflow imports);
pairs then alternate their order (ABBA...), so neither arm always runs right after the other's
teardown; every run starts after the previous cluster is gone and a short pause. Prints each pair
with the load average, the median of the per-pair ratios (target: <= 1.05) and their spread.
The machine's load moves single runs far more than tracking does: judge the median and the spread.
Usage: python bench/tracking_up.py [--reps 5] [--quick]   (--quick: one pair, no warm-up, for CI)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: Seconds between one cluster's teardown and the next `up`: what teardown's SIGKILLs leave (exit
#: of killed processes, freed memory) is done by then.
PAUSE_S = 2.0


@dataclass(frozen=True)
class Run:
    up: float
    first_job: float
    #: Seconds from the start of `up` to the tracking server's first answer (None: no server).
    answered: float | None
    load: float


def _invoke(args: list[str], env: dict[str, str], check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True)
    if check and done.returncode:
        raise SystemExit(f"invoke {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done


def _run(spec: Path, env: dict[str, str], home: Path, tracking: bool) -> Run:
    import requests

    load = os.getloadavg()[0]
    cluster = ["--cluster", str(spec)]
    started = time.monotonic()
    done = _invoke(["up", *cluster], env, check=False)
    if done.returncode:
        _invoke(["teardown", *cluster], env, check=False)
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    took = time.monotonic() - started
    try:
        job_started = time.monotonic()
        _invoke(["submit", *cluster, "examples/cpu_example.py", "--", "2"], env)
        first_job = time.monotonic() - job_started
        answered = None
        if tracking:
            state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
            port = int(state["resources"][0]["attrs"]["port_base"]) + 9  # PortBlock.tracking
            while time.monotonic() - started < 300:
                try:
                    if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                        answered = time.monotonic() - started
                        break
                except requests.RequestException:
                    pass
                time.sleep(0.1)
    finally:
        _invoke(["teardown", *cluster], env)
        time.sleep(PAUSE_S)
    return Run(took, first_job, answered, load)


def _spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5, help="counted pairs")
    parser.add_argument("--quick", action="store_true", help="one pair, no warm-up (for CI)")
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    work = Path(tempfile.mkdtemp(prefix="rf-bench-tracking-"))
    home = work / "home"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAYFLEET_HOME": str(home)}
    base = "provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n"
    plain = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
    plain.write_text(base)
    tracked = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
    tracked.write_text(base + "tracking: mlflow\n")
    up_ratios: list[float] = []
    job_ratios: list[float] = []
    loads: list[float] = []
    try:
        for pair in range(0 if args.quick else -1, reps):
            # ABBA: the arm that goes first alternates, starting with "without".
            order = (False, True) if pair % 2 == 0 else (True, False)
            runs = {tracking: _run(tracked if tracking else plain, env, home, tracking)
                    for tracking in order}
            off, on = runs[False], runs[True]
            label = "warm-up" if pair < 0 else f"pair {pair + 1}"
            first = "with" if order[0] else "without"
            server = (f"server answered after {on.answered:.1f}s" if on.answered
                      else "server did not answer")
            print(f"{label} ({first} first, load {off.load:.1f}/{on.load:.1f}): "
                  f"up {off.up:.2f}s / with tracking {on.up:.2f}s = {on.up / off.up:.3f}   "
                  f"first job {off.first_job:.2f}s / {on.first_job:.2f}s = "
                  f"{on.first_job / off.first_job:.3f}   ({server})", flush=True)
            if pair >= 0:
                up_ratios.append(on.up / off.up)
                job_ratios.append(on.first_job / off.first_job)
                loads += [off.load, on.load]
        print(f"up with tracking / without, per pair: {_spread(up_ratios)}")
        print(f"first job after up, with tracking / without, per pair: {_spread(job_ratios)}")
        print(f"load average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}")
        print(f"median ratio up with tracking / without: {statistics.median(up_ratios):.3f} "
              f"(target <= 1.05, {reps} pairs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
