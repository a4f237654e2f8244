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

import json
import os
import re
import shutil
import signal
import statistics
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402
from infra.node import supervise  # noqa: E402
from infra.node.metrics import CONFIG_FILE  # noqa: E402


@dataclass(frozen=True)
class Run:
    seconds: float
    load: float


def _up(spec: Path, env: dict[str, str], keep: bool = False) -> Run:
    """`invoke up` of a fresh cluster, timed; torn down after unless `keep`."""
    load = os.getloadavg()[0]
    cluster = ["--cluster", str(spec)]
    started = time.monotonic()
    done = common.invoke(["up", *cluster], env, check=False)
    took = time.monotonic() - started
    if done.returncode or not keep:
        common.invoke(["teardown", *cluster], env, check=False)
    if done.returncode:
        raise SystemExit(f"invoke up failed: {done.stderr.strip().splitlines()[-1:]}")
    if not keep:
        time.sleep(common.PAUSE_S)
    return Run(took, load)


def _job(spec: Path, env: dict[str, str], iterations: int) -> Run:
    load = os.getloadavg()[0]
    job = common.invoke(["submit", "--cluster", str(spec), "bench/cpu_job.py", "--", "2",
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
    args = common.options(__doc__, 5, quick="one pair each, no warm-up (for CI)", more=lambda p: (
        p.add_argument("--job-reps", type=int, default=9, help="counted pairs of the job")))
    reps, job_reps = (1, 1) if args.quick else (args.reps, args.job_reps)
    # Full mode: ~10 s a task on an idle core (~60 ns an iteration), so that every job spans at
    # least one scrape at the default 10 s interval.
    iterations = 2_000_000 if args.quick else 160_000_000
    if shutil.which("prometheus") is None:
        raise SystemExit("no prometheus on this machine: apt-get install prometheus")
    with common.workdir("rf-bench-metrics-") as (env, work):
        specs = {}
        for metrics in ("none", "prometheus"):
            specs[metrics] = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
            specs[metrics].write_text(common.LOCAL_SPEC + f"metrics: {metrics}\n")
        _measure(args.quick, reps, job_reps, iterations, specs, env, work / "home")


def _measure(quick: bool, reps: int, job_reps: int, iterations: int, specs: dict[str, Path],
             env: dict[str, str], home: Path) -> None:
    first = 0 if quick else -1
    up_ratios, loads, kept = _up_pairs(first, reps, specs, env)
    measured = specs["prometheus"]
    if not kept:
        common.invoke(["up", "--cluster", str(measured)], env)
    try:
        jobs = measure_jobs(measured, env, home, iterations, range(first, job_reps), warm=quick)
    finally:
        common.invoke(["teardown", "--cluster", str(measured)], env, check=False)
    print(f"up with metrics / without, per pair: {common.spread(up_ratios)}")
    loads += jobs.loads
    print(f"load average (1 min) at the runs: {min(loads):.1f}-{max(loads):.1f}, median "
          f"{statistics.median(loads):.1f} ({os.cpu_count()} CPUs)")
    print(f"median ratio up with metrics / without: {statistics.median(up_ratios):.3f} "
          f"(target <= 1.05, {reps} pairs)")
    jobs.summary(job_reps)


def _up_pairs(first: int, reps: int, specs: dict[str, Path], env: dict[str, str]
              ) -> tuple[list[float], list[float], bool]:
    """The `up` pairs (ABBA): their ratios, the loads, and whether the last `prometheus` cluster
    was kept up for the job pairs (when it came second: nothing else then ran beside either
    timed `up`)."""
    ratios: list[float] = []
    loads: list[float] = []
    kept = False
    for pair in range(first, reps):
        order = ("none", "prometheus") if pair % 2 == 0 else ("prometheus", "none")
        kept = pair == reps - 1 and order[-1] == "prometheus"
        ups = {metrics: _up(specs[metrics], env, keep=kept and metrics == "prometheus")
               for metrics in order}
        off, on = ups["none"], ups["prometheus"]
        print(_pair("warm-up" if pair < 0 else f"up pair {pair + 1}", off, on,
                    "with" if order[0] == "prometheus" else "without", "up"), flush=True)
        if pair >= 0:
            ratios.append(on.seconds / off.seconds)
            loads += [off.load, on.load]
    return ratios, loads, kept


@dataclass
class Jobs:
    """The job pairs' ratios, loads, and Prometheus's own CPU while the scraped jobs ran: what it
    can take from them at most, whatever the rest of the machine does (the wall-clock ratio moves
    with other work)."""
    ratios: list[float]
    loads: list[float]
    prometheus_cpu: float = 0.0
    scraped_s: float = 0.0

    def summary(self, pairs: int) -> None:
        cores = os.cpu_count() or 1
        print(f"CPU-bound job scraped / not (one cluster), per pair: {common.spread(self.ratios)}")
        print(f"Prometheus's own CPU during the scraped jobs: {self.prometheus_cpu:.2f} CPU-s in "
              f"{self.scraped_s:.1f} s of jobs on {cores} CPUs = "
              f"{100 * self.prometheus_cpu / (self.scraped_s * cores):.2f}% of the machine")
        print(f"median ratio CPU-bound job with scraping / without: "
              f"{statistics.median(self.ratios):.3f} (target <= 1.02, {pairs} pairs)")


def measure_jobs(spec: Path, env: dict[str, str], home: Path, iterations: int,
                 pairs: range, warm: bool) -> Jobs:
    """Job pairs on the running cluster `spec` (`metrics: prometheus`), its Prometheus held still
    (SIGSTOP) for one of each pair; negative pair numbers are warm-ups, not counted. `warm`: one
    untimed job first, which takes what is left of the cluster's start-up (Ray's agents,
    Prometheus's own start) that would land in the first timed job."""
    program = _prometheus(home, spec)
    if warm:
        _job(spec, env, iterations)
    jobs = Jobs([], [])
    for pair in pairs:
        modes = (False, True) if pair % 2 == 0 else (True, False)
        runs: dict[bool, Run] = {}
        for scraping in modes:
            if not scraping:
                program.send_signal(signal.SIGSTOP)
            before = _cpu_seconds(program)
            try:
                runs[scraping] = _job(spec, env, iterations)
            finally:
                program.send_signal(signal.SIGCONT)
            if scraping and pair >= 0:
                jobs.prometheus_cpu += _cpu_seconds(program) - before
        off, on = runs[False], runs[True]
        print(_pair("warm-up" if pair < 0 else f"job pair {pair + 1}", off, on,
                    "scraped" if modes[0] else "held", "job"), flush=True)
        if pair >= 0:
            jobs.ratios.append(on.seconds / off.seconds)
            jobs.loads += [off.load, on.load]
            jobs.scraped_s += on.seconds
    assert program.is_running(), "Prometheus died during the job pairs"
    return jobs


if __name__ == "__main__":
    main()
