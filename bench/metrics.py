"""What `metrics: prometheus` costs: `invoke up` (local) with and without it, and a CPU-bound job's
time with the head's Prometheus scraping every node and without.

`up` is timed until it returns (the dashboard accepts jobs); `up` never waits for Prometheus. Right
after, bench/cpu_job.py runs as a Ray job: 2 tasks (one per CPU of the cluster) of a fixed amount
of arithmetic, timed inside the driver, with Prometheus scraping at the spec's default interval.

Fairness: a warm-up pair (not counted), then pairs in alternating order (ABBA), each run after the
previous cluster is gone and a short pause. Prints every pair with the load average, then the
median of the per-pair ratios (targets: up <= 1.05, job <= 1.02) and their spread. On a shared
machine the load moves single runs far more than a scrape does: judge the median and the spread.
Usage: python bench/metrics.py [--reps 5] [--quick]   (--quick: one pair, no warm-up, small job)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

# The pair machinery of the tracking bench (this script's folder is on sys.path when run).
from tracking_up import PAUSE_S, _invoke, _spread


@dataclass(frozen=True)
class Run:
    up: float
    job: float
    load: float


def _run(spec: Path, env: dict[str, str], iterations: int) -> Run:
    load = os.getloadavg()[0]
    cluster = ["--cluster", str(spec)]
    started = time.monotonic()
    done = _invoke(["up", *cluster], env, check=False)
    if done.returncode:
        _invoke(["teardown", *cluster], env, check=False)
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    took = time.monotonic() - started
    try:
        job = _invoke(["submit", *cluster, "bench/cpu_job.py", "--", "2", str(iterations)], env)
        found = re.search(r"WORK ([0-9.]+)", job.stdout)
        if not found:
            raise SystemExit(f"the job printed no WORK line: {job.stdout[-300:]}")
        seconds = float(found.group(1))
    finally:
        _invoke(["teardown", *cluster], env)
        time.sleep(PAUSE_S)
    return Run(took, seconds, load)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5, help="counted pairs")
    parser.add_argument("--quick", action="store_true", help="one pair, no warm-up (for CI)")
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    iterations = 2_000_000 if args.quick else 20_000_000
    if shutil.which("prometheus") is None:
        raise SystemExit("no prometheus on this machine: apt-get install prometheus")
    work = Path(tempfile.mkdtemp(prefix="rf-bench-metrics-"))
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAYFLEET_HOME": str(work / "home")}
    base = "provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n"
    specs = {}
    for metrics in ("none", "prometheus"):
        specs[metrics] = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        specs[metrics].write_text(base + f"metrics: {metrics}\n")
    up_ratios: list[float] = []
    job_ratios: list[float] = []
    loads: list[float] = []
    try:
        for pair in range(0 if args.quick else -1, reps):
            order = ("none", "prometheus") if pair % 2 == 0 else ("prometheus", "none")
            runs = {metrics: _run(specs[metrics], env, iterations) for metrics in order}
            off, on = runs["none"], runs["prometheus"]
            label = "warm-up" if pair < 0 else f"pair {pair + 1}"
            print(f"{label} ({'with' if order[0] == 'prometheus' else 'without'} first, load "
                  f"{off.load:.1f}/{on.load:.1f}): up {off.up:.2f}s / with metrics {on.up:.2f}s = "
                  f"{on.up / off.up:.3f}   job {off.job:.3f}s / scraped {on.job:.3f}s = "
                  f"{on.job / off.job:.3f}", flush=True)
            if pair >= 0:
                up_ratios.append(on.up / off.up)
                job_ratios.append(on.job / off.job)
                loads += [off.load, on.load]
        print(f"up with metrics / without, per pair: {_spread(up_ratios)}")
        print(f"CPU-bound job scraped / not, per pair: {_spread(job_ratios)}")
        print(f"load average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}")
        print(f"median ratio up with metrics / without: {statistics.median(up_ratios):.3f} "
              f"(target <= 1.05, {reps} pairs)")
        print(f"median ratio CPU-bound job with scraping / without: "
              f"{statistics.median(job_ratios):.3f} (target <= 1.02, {reps} pairs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
