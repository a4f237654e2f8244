"""What `metrics: prometheus` costs: `invoke up` (local) with and without it, and a CPU-bound job's
time with the head's Prometheus scraping every node and without.

`up`: timed until it returns (the dashboard accepts jobs); `up` never waits for Prometheus. A
warm-up pair (not counted), then pairs of fresh clusters in alternating order (ABBA), each run
after the previous cluster is gone and a short pause.

The job: bench/cpu_job.py as a Ray job, 2 tasks (one per CPU of the cluster) of a fixed amount of
arithmetic, timed inside the driver, all on ONE cluster with `metrics: prometheus`, scraped at the
spec's default interval; "without" is the same cluster with its Prometheus held still (SIGSTOP,
so it scrapes nothing; SIGCONT after). Pairs alternate their order (ABBA), the warm-up pair is not
counted. Comparing jobs on two separately started clusters measured mostly how far each one's
start-up tail (Ray's agents, Prometheus's own start) still ran into the job: per-pair ratios
spread from 0.8 to 1.1 at the same load. One cluster, interleaved, compares only the scraping.

Prints every pair with the load average, then the median of the per-pair ratios (targets: up <=
1.05, job <= 1.02) and their spread, and the CPU time Prometheus itself used while the scraped jobs
ran, as a share of the machine: the most it can take from them, however busy the machine is
otherwise (the exporters' side of a scrape, in Ray's agents, is not in it).
Usage: python bench/metrics.py [--reps 5] [--job-reps 9] [--quick]
(--quick: one pair of each, no warm-up, a small job; for CI)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

# The pair machinery of the tracking bench (this script's folder is on sys.path when run).
from tracking_up import PAUSE_S, _invoke, _spread

from infra.node import supervise
from infra.node.metrics import CONFIG_FILE


@dataclass(frozen=True)
class Run:
    seconds: float
    load: float


def _up(spec: Path, env: dict[str, str], keep: bool = False) -> Run:
    """`invoke up` of a fresh cluster, timed; torn down after unless `keep`."""
    load = os.getloadavg()[0]
    cluster = ["--cluster", str(spec)]
    started = time.monotonic()
    done = _invoke(["up", *cluster], env, check=False)
    took = time.monotonic() - started
    if done.returncode or not keep:
        _invoke(["teardown", *cluster], env, check=False)
    if done.returncode:
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    if not keep:
        time.sleep(PAUSE_S)
    return Run(took, load)


def _job(spec: Path, env: dict[str, str], iterations: int) -> Run:
    load = os.getloadavg()[0]
    job = _invoke(["submit", "--cluster", str(spec), "bench/cpu_job.py", "--", "2",
                   str(iterations)], env)
    found = re.search(r"WORK ([0-9.]+)", job.stdout)
    if not found:
        raise SystemExit(f"the job printed no WORK line: {job.stdout[-300:]}")
    return Run(float(found.group(1)), load)


def _prometheus(home: Path, spec: Path) -> psutil.Process:
    """The cluster's Prometheus: the child of the runner its supervisor's pid file names."""
    state = json.loads((home / "state" / f"{spec.stem}.json").read_text())
    temp_dir = Path(state["resources"][0]["id"])
    pidfile = temp_dir / f"{CONFIG_FILE}.pid"

    def found() -> psutil.Process | None:
        child = supervise.read(pidfile)["child"]
        if child is None or not child.running():
            return None
        programs = [p for p in psutil.Process(child.pid).children()
                    if p.name() == "prometheus"]
        return programs[0] if programs else None

    deadline = time.monotonic() + 120
    while (program := found()) is None:
        if time.monotonic() > deadline:
            raise SystemExit(f"no Prometheus running under {pidfile} after 120 s")
        time.sleep(0.5)
    return program


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


def _pair(label: str, off: Run, on: Run, first: str, what: str) -> str:
    return (f"{label} ({first} first, load {off.load:.1f}/{on.load:.1f}): {what} "
            f"{off.seconds:.3f}s / with metrics {on.seconds:.3f}s = {on.seconds / off.seconds:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=5, help="counted pairs of `up`")
    parser.add_argument("--job-reps", type=int, default=9, help="counted pairs of the job")
    parser.add_argument("--quick", action="store_true", help="one pair each, no warm-up (for CI)")
    args = parser.parse_args()
    reps, job_reps = (1, 1) if args.quick else (args.reps, args.job_reps)
    # Full mode: ~10 s a task on an idle core (~60 ns an iteration), so that every job spans at
    # least one scrape at the default 10 s interval.
    iterations = 2_000_000 if args.quick else 160_000_000
    if shutil.which("prometheus") is None:
        raise SystemExit("no prometheus on this machine: apt-get install prometheus")
    work = Path(tempfile.mkdtemp(prefix="rf-bench-metrics-"))
    home = work / "home"
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAYFLEET_HOME": str(home)}
    base = "provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n"
    specs = {}
    for metrics in ("none", "prometheus"):
        specs[metrics] = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        specs[metrics].write_text(base + f"metrics: {metrics}\n")
    up_ratios: list[float] = []
    job_ratios: list[float] = []
    loads: list[float] = []
    first = 0 if args.quick else -1
    # Prometheus's own CPU while the scraped jobs ran: what it can take from them at most,
    # whatever the rest of the machine does (the wall-clock ratio moves with other work).
    prometheus_cpu = scraped_s = 0.0
    try:
        for pair in range(first, reps):
            order = ("none", "prometheus") if pair % 2 == 0 else ("prometheus", "none")
            # The job pairs below want a fresh `prometheus` cluster: the last pair's is kept when
            # it came second (nothing else then ran beside either timed `up`).
            kept = pair == reps - 1 and order[-1] == "prometheus"
            ups = {metrics: _up(specs[metrics], env, keep=kept and metrics == "prometheus")
                   for metrics in order}
            off, on = ups["none"], ups["prometheus"]
            print(_pair("warm-up" if pair < 0 else f"up pair {pair + 1}", off, on,
                        "with" if order[0] == "prometheus" else "without", "up"), flush=True)
            if pair >= 0:
                up_ratios.append(on.seconds / off.seconds)
                loads += [off.load, on.load]
        measured = specs["prometheus"]
        if not kept:
            _invoke(["up", "--cluster", str(measured)], env)
        try:
            program = _prometheus(home, measured)
            if args.quick:
                # What is left of the cluster's start-up (Ray's agents, Prometheus's own start)
                # would land in the first job: one untimed job takes it.
                _job(measured, env, iterations)
            for pair in range(first, job_reps):
                modes = (False, True) if pair % 2 == 0 else (True, False)
                jobs: dict[bool, Run] = {}
                for scraping in modes:
                    if not scraping:
                        program.send_signal(signal.SIGSTOP)
                    before = _cpu_seconds(program)
                    try:
                        jobs[scraping] = _job(measured, env, iterations)
                    finally:
                        program.send_signal(signal.SIGCONT)
                    if scraping and pair >= 0:
                        prometheus_cpu += _cpu_seconds(program) - before
                off, on = jobs[False], jobs[True]
                print(_pair("warm-up" if pair < 0 else f"job pair {pair + 1}", off, on,
                            "scraped" if modes[0] else "held", "job"), flush=True)
                if pair >= 0:
                    job_ratios.append(on.seconds / off.seconds)
                    loads += [off.load, on.load]
                    scraped_s += on.seconds
            assert program.is_running(), "Prometheus died during the job pairs"
        finally:
            _invoke(["teardown", "--cluster", str(measured)], env, check=False)
        print(f"up with metrics / without, per pair: {_spread(up_ratios)}")
        print(f"CPU-bound job scraped / not (one cluster), per pair: {_spread(job_ratios)}")
        cores = os.cpu_count() or 1
        print(f"Prometheus's own CPU during the scraped jobs: {prometheus_cpu:.2f} CPU-s in "
              f"{scraped_s:.1f} s of jobs on {cores} CPUs = "
              f"{100 * prometheus_cpu / (scraped_s * cores):.2f}% of the machine")
        print(f"load average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}, median "
              f"{statistics.median(loads):.1f} ({os.cpu_count()} CPUs)")
        print(f"median ratio up with metrics / without: {statistics.median(up_ratios):.3f} "
              f"(target <= 1.05, {reps} pairs)")
        print(f"median ratio CPU-bound job with scraping / without: "
              f"{statistics.median(job_ratios):.3f} (target <= 1.02, {job_reps} pairs)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
