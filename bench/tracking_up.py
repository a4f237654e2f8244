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

import json
import os
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402


@dataclass(frozen=True)
class Run:
    up: float
    first_job: float
    #: Seconds from the start of `up` to the tracking server's first answer (None: no server).
    answered: float | None
    load: float


def run_arm(spec: Path, env: dict[str, str], home: Path, tracking: bool,
            keep: bool = False) -> Run:
    """One arm: `invoke up` of `spec` timed, then its first job, then (with `tracking`) the wait for
    the server's first answer; torn down after unless `keep`. CI runs both arms in
    tests/test_examples.py, whose own cluster is the tracked one (ON_E2E in tests/test_bench.py)."""
    load = os.getloadavg()[0]
    cluster = ["--cluster", str(spec)]
    started = time.monotonic()
    done = common.invoke(["up", *cluster], env, check=False)
    if done.returncode:
        common.invoke(["teardown", *cluster], env, check=False)
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    took = time.monotonic() - started
    try:
        job_started = time.monotonic()
        common.invoke(["submit", *cluster, "examples/cpu_example.py", "--", "2"], env)
        first_job = time.monotonic() - job_started
        answered = _answered(home, spec, started) if tracking else None
    finally:
        if not keep:
            common.invoke(["teardown", *cluster], env)
            time.sleep(common.PAUSE_S)
    return Run(took, first_job, answered, load)


def _answered(home: Path, spec: Path, started: float) -> float | None:
    """Seconds from `started` to the tracking server's first answer (None: none within 300 s)."""
    import requests

    state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
    port = int(state["resources"][0]["attrs"]["port_base"]) + 9  # PortBlock.tracking
    while time.monotonic() - started < 300:
        try:
            if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return time.monotonic() - started
        except requests.RequestException:
            pass
        time.sleep(0.1)
    return None


def pair_line(label: str, off: Run, on: Run, tracked_first: bool) -> str:
    server = (f"server answered after {on.answered:.1f}s" if on.answered
              else "server did not answer")
    return (f"{label} ({'with' if tracked_first else 'without'} first, load "
            f"{off.load:.1f}/{on.load:.1f}): up {off.up:.2f}s / with tracking {on.up:.2f}s = "
            f"{on.up / off.up:.3f}   first job {off.first_job:.2f}s / {on.first_job:.2f}s = "
            f"{on.first_job / off.first_job:.3f}   ({server})")


def summary(pairs: list[tuple[Run, Run]]) -> None:
    """The counted (without, with) pairs' ratios: their spread and median."""
    loads = [run.load for pair in pairs for run in pair]
    print(f"up with tracking / without, per pair: {common.spread([on.up / off.up for off, on in pairs])}")
    print(f"first job after up, with tracking / without, per pair: "
          f"{common.spread([on.first_job / off.first_job for off, on in pairs])}")
    print(f"load average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}")
    print(f"median ratio up with tracking / without: "
          f"{statistics.median(on.up / off.up for off, on in pairs):.3f} "
          f"(target <= 1.05, {len(pairs)} pairs)")


def main() -> None:
    args = common.options(__doc__, 5, quick="one pair, no warm-up (for CI)")
    with common.workdir("rf-bench-tracking-") as (env, work):
        home = work / "home"
        plain = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        plain.write_text(common.LOCAL_SPEC)
        tracked = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        tracked.write_text(common.LOCAL_SPEC + "tracking: mlflow\n")
        pairs: list[tuple[Run, Run]] = []
        for pair in range(0 if args.quick else -1, args.reps):
            # ABBA: the arm that goes first alternates, starting with "without".
            order = (False, True) if pair % 2 == 0 else (True, False)
            runs = {tracking: run_arm(tracked if tracking else plain, env, home, tracking)
                    for tracking in order}
            label = "warm-up" if pair < 0 else f"pair {pair + 1}"
            print(pair_line(label, runs[False], runs[True], order[0]), flush=True)
            if pair >= 0:
                pairs.append((runs[False], runs[True]))
        summary(pairs)


if __name__ == "__main__":
    main()
