"""Autoscaling on Lambda: time from a job's submission to all the workers it needs joined Ray,
against the floor set by Lambda's rate limits and the instances' boot time.

Setup (tests/lambda_cloud/autoscale_bed.py): the test bed's hosts are the instances of the fake
Lambda API, which enforces the REAL limits (1 request/s, 1 launch/12 s) and boots an instance for
`--boot` seconds before it is active; Ray's autoscaler (v2) on the head runs our node provider.
The job asks for N one-GPU bundles at once (STRICT_SPREAD), so N workers must be launched.

Floor: the autoscaler may launch its first worker at once, each further one 12 s after the
previous (Lambda's launch limit); the last one then boots. floor(N) = 12 (N - 1) + boot.
Measured on top: the autoscaler noticing the demand (its loop runs every second here, the
documented AUTOSCALER_UPDATE_INTERVAL_S), the capacity check before each launch, and Ray's setup
of the worker over SSH and its `ray start`. Target: within 10 % of the floor.

With `--compare` (the default without `--quick`) the same measurement runs twice, in a fresh
test bed each: with the separated autoscaler rayfleet ships (Ray as `rayfleet-ray`, Ray's monitor
as `rayfleet-scaler`, issue 29), and with the start commands of before (Ray and its autoscaler as
the SSH user; bench/unseparated/sitecustomize.py). Target: separated / before <= 1.05.

Usage: python bench/lambda_autoscale.py [--boot 120] [--workers 2] [--pairs 1] [--quick] [--no-compare]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from infra.core import jobs, privilege  # noqa: E402
from infra.providers.base import Endpoint  # noqa: E402
from tests.lambda_cloud.autoscale_bed import (  # noqa: E402
    CLUSTER,
    LAUNCH,
    Scaled,
    autoscale_bed,
    capacity_for,
)

JOB = ROOT / "tests" / "data" / "lambda_gpu_job.py"


UNSEPARATED = ROOT / "bench" / "unseparated"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boot", type=float, default=120.0, help="fake boot time, seconds")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                        help="also measure the start commands of before issue 29 (default: on "
                             "without --quick)")
    parser.add_argument("--pairs", type=int, default=1,
                        help="with --compare: this many pairs, the order alternating (the load "
                             "of a shared machine drifts; the first of a pair must not always pay)")
    args = parser.parse_args()
    if args.quick:
        args.boot, args.workers = 1.0, 1
    if not (args.compare if args.compare is not None else not args.quick):
        return 0 if measure(args, SEPARATED) is not None else 1
    ratios = []
    for pair in range(args.pairs):
        order = (SEPARATED, BEFORE) if pair % 2 == 0 else (BEFORE, SEPARATED)
        took: dict[str, float] = {}
        for mode in order:
            print(f"\npair {pair + 1}/{args.pairs}, {MODES[mode]} (load {load()}):")
            seconds = measure(args, mode)
            if seconds is None:
                return 1
            took[mode] = seconds
        ratios.append(took[SEPARATED] / took[BEFORE])
        print(f"pair {pair + 1}: scale-up, separated autoscaler {took[SEPARATED]:.1f}s vs Ray as "
              f"the SSH user {took[BEFORE]:.1f}s: ratio {ratios[-1]:.3f} (target <= {TARGET})")
    ratio = statistics.median(ratios)
    print(f"\nseparated / before, median of {len(ratios)} pair(s): {ratio:.3f} (target <= "
          f"{TARGET}: {'met' if ratio <= TARGET else 'NOT met'}); pairs "
          f"{', '.join(f'{r:.3f}' for r in ratios)}; load {load()}")
    return 0


#: The two ways the bench starts Ray: as rayfleet ships it, and as before issue 29.
SEPARATED, BEFORE = "separated", "before"
MODES = {SEPARATED: "Ray as rayfleet-ray, its autoscaler as rayfleet-scaler",
         BEFORE: "Ray and its autoscaler as the SSH user (before issue 29)"}
TARGET = 1.05


def load() -> str:
    """The machine's load averages (1, 5, 15 min): the context every figure needs here."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(args: argparse.Namespace, mode: str) -> float | None:
    """Seconds from a job's submission until its workers joined Ray; None after a failure."""
    extra_env = {} if mode == SEPARATED else {"PYTHONPATH": os.pathsep.join(
        p for p in (str(UNSEPARATED), os.environ.get("PYTHONPATH", "")) if p)}
    with tempfile.TemporaryDirectory(prefix="rf-bench-autoscale-") as tmp, \
            autoscale_bed(Path(tmp), scale=1.0, boot_delay=args.boot, hosts=args.workers + 1,
                          idle_minutes=5, max_workers=args.workers,
                          capacity=capacity_for(args.workers)) as cluster:
        cluster.env.update(extra_env)
        started = time.monotonic()
        # The head boots for --boot seconds too: `up` itself is not what is measured.
        up = cluster.invoke("up", timeout=args.boot + 900)
        if up.returncode != 0:
            print(up.stdout + up.stderr, file=sys.stderr)
            return None
        print(f"up (head only): {time.monotonic() - started:.1f}s")
        done = scale_up(cluster, args.workers, args.boot)
        return done.joined if done else None


@dataclass(frozen=True)
class ScaleUp:
    job_id: str
    #: Seconds from the job's submission until its workers had joined Ray.
    joined: float


def scale_up(cluster: Scaled, workers: int, boot: float, *job_args: str) -> ScaleUp | None:
    """On a cluster that is up with no worker: submit a job needing `workers` GPU workers and
    time it until they joined Ray, printing where the time went and the summary line; None
    after a failure. tests/lambda_cloud/test_e2e_autoscale.py measures its own cluster's
    scale-up with this too (so CI runs this measurement there, not on a bed of its own)."""
    tunnel = subprocess.Popen([sys.executable, "-m", "invoke", "dashboard", "--cluster",
                               str(cluster.spec)], cwd=ROOT, env={**os.environ, **cluster.env},
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              # Ctrl+C closes it; a bench started in the background of a
                              # script inherits SIGINT ignored, and the tunnel would stay.
                              preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    before = cluster.launches()
    try:
        assert tunnel.stdout is not None
        url = tunnel.stdout.readline().strip()
        token = cluster.home / "keys" / CLUSTER / "ray-token"
        endpoint = Endpoint(url, "", tunneled=True, token_path=token)
        asked = time.monotonic()
        submit = cluster.invoke("submit", "--no-wait", str(JOB), "--", str(workers), *job_args)
        if submit.returncode != 0:
            print(submit.stdout + submit.stderr, file=sys.stderr)
            return None
        # The job exists from here on (the CLI's start, tunnel and upload are not the cluster's
        # reaction time; they are printed separately).
        submitted = time.monotonic()
        submitted_wall = time.time()
        print(f"`invoke submit --no-wait` took {submitted - asked:.1f}s")
        seen: dict[str, float] = {}
        while True:
            try:
                listed = jobs.list_nodes(endpoint)
            except Exception:  # the dashboard of a busy head may miss an answer; ask again
                time.sleep(0.5)
                continue
            alive = [n for n in listed if n.state == "ALIVE" and not n.is_head_node]
            for node in alive:
                seen.setdefault(node.node_ip, time.monotonic() - submitted)
            if len(alive) >= workers:
                break
            if time.monotonic() - submitted > boot + 12 * workers + 600:
                launches(cluster, submitted)
                started = cluster.workers()
                active = [w for w in started if w["status"] == "active"]
                print(f"workers did not join: {len(started)} of {workers} launched, "
                      f"{len(active)} active, {len(alive)} joined Ray", file=sys.stderr)
                return None
            # Often: the moment each worker joined is known to this step (it was 0.5 s).
            time.sleep(0.1)
        joined = time.monotonic() - submitted
    finally:
        tunnel.send_signal(signal.SIGINT)
        tunnel.wait(timeout=30)
    # Where the time went: each launch (the fake's log) and when that machine joined Ray.
    instances = [i for i in cluster.fake.instances.values()
                 if not i.foreign and dict((t["key"], t["value"]) for t in i.tags)
                 .get("ray-node-type") == "worker"]
    for inst in sorted(instances, key=lambda i: i.launched):
        launched = inst.launched - submitted
        print(f"  {inst.name}: launched at +{launched:.1f}s, active at "
              f"+{launched + boot:.1f}s, joined Ray at +{seen.get(str(inst.ip), -1):.1f}s")
    launches(cluster, submitted)
    phases(cluster, submitted_wall)
    worker_steps(cluster, instances, submitted_wall)
    # Lambda's launch limit, as the fake enforces it (12 s, or less on a bed scaled down).
    limit = cluster.fake.launches.interval
    floor = limit * (workers - 1) + boot
    print(f"submission -> {workers} workers joined: {joined:.1f}s; floor {floor:.0f}s "
          f"({limit:g} s x {workers - 1} + boot {boot:g}s); "
          f"{100 * (joined - floor) / floor:+.1f}% over the floor; "
          f"launch calls {cluster.launches() - before}; load {load()}")
    return ScaleUp(submit.stdout.strip().splitlines()[-1], joined)


def launches(cluster: Scaled, submitted: float) -> None:
    """The fake's view of the launches: when each reached it, the spacing (Lambda's limit is
    12 s), the 429s, and the requests the head sent before its first launch (what it waited
    for)."""
    with cluster.fake.lock:
        log = [entry for entry in cluster.fake.log if entry[0] >= submitted]
    launched = [t for t, method, path, status in log if path == LAUNCH and status == 200]
    refused = [(method, path) for _, method, path, status in log if status == 429]
    gaps = [f"{b - a:.2f}" for a, b in itertools.pairwise(launched)]
    print(f"  launches (fake): at {', '.join(f'+{t - submitted:.1f}s' for t in launched) or '-'}; "
          f"spacing {', '.join(gaps) or '-'} s (limit 12 s); 429s: {len(refused)} "
          f"({sum(1 for _, p in refused if p == LAUNCH)} on launch)")
    # Each launch's capacity check (the provider reads /instance-types first): for all but the
    # first it should fall inside the launch interval, costing nothing.
    checks = [t for t, method, path, status in log if path == "/instance-types" and status == 200]
    leads = [f"{t - max((c for c in checks if c <= t), default=t):.2f}" for t in launched]
    print(f"  capacity check -> launch, per launch: {', '.join(leads) or '-'} s")
    first = launched[0] if launched else float("inf")
    before = [f"+{t - submitted:.1f}s {method} {path} {status}" for t, method, path, status in log
              if t <= first]
    print(f"  requests up to the first launch: {'; '.join(before[-6:])}")


#: Where Ray's monitor logs on the head: as the autoscaler's user (separated), or in Ray's session.
MONITOR_LOGS = (f"/home/{privilege.SCALER_USER}/{privilege.SCALER_LOGS}",
                "/tmp/ray/session_latest/logs")
#: The monitor's lines that mark a phase of a scale-up: the demand seen, the launch, and the
#: updater's steps over SSH (Ray's LogTimer lines carry their own duration).
PHASE = re.compile(r"New instance|Update instance|Launched|LogTimer")


def log_time(line: str) -> float | None:
    """The wall-clock time (s) a line of Ray's monitor log starts with, if it does."""
    stamp = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3})", line)
    if not stamp:
        return None
    return time.mktime(time.strptime(stamp[1], "%Y-%m-%d %H:%M:%S")) + int(stamp[2]) / 1000


def phases(cluster: Scaled, submitted: float) -> None:
    """The head's monitor log from the submission on, each line at its offset (s): which step of
    the scale-up took the time."""
    head = cluster.host(str(cluster.head()["ip"]))
    logs = " ".join(f"{d}/monitor.{kind}" for d in MONITOR_LOGS for kind in ("log", "out"))
    text = head.run(f"cat {logs} 2>/dev/null; true", timeout=60).stdout
    print("  the monitor's log (seconds after the submission):")
    for line in sorted(text.splitlines()):
        at = log_time(line)
        if at is None or not PHASE.search(line):
            continue
        if at >= submitted - 1:
            message = line.split(" -- ", 1)[-1] if " -- " in line else line[24:]
            print(f"    +{at - submitted:6.1f}  {message[:150]}")
    # Ray's GCS on the head: the job's supervisor actor registered, its driver added, its
    # placement group registered (the demand the autoscaler then sees): the first of each.
    gcs = head.run("grep -h -E 'Registering actor|Registering job|Registering placement group' "
                   "/tmp/ray/session_latest/logs/gcs_server.out; true", timeout=60).stdout
    print("  the head's GCS (seconds after the submission):")
    seen: set[str] = set()
    for line in gcs.splitlines():
        at = log_time(line.lstrip("["))
        kind = next((k for k in GCS_MARKS if k in line), "")
        if at is not None and at >= submitted - 1 and kind not in seen:
            seen.add(kind)
            print(f"    +{at - submitted:6.1f}  {line.split(': ', 1)[-1][:110]}")


GCS_MARKS = ("Registering actor", "Registering job", "Registering placement group")


#: On a worker, as root: when its node start made Ray's user's files (the newest in its home),
#: when `ray start` made the session dir (its birth), and the raylet's first and "started" lines.
WORKER_STEPS = (
    f"echo \"users $(find ~{privilege.RAY_USER} -printf '%C@\\n' 2>/dev/null | sort -n | tail -n 1)\"; "
    "d=$(readlink -f /tmp/ray/session_latest); echo \"session $(stat -c %.3W \"$d\")\"; "
    "echo \"raylet $(head -n 1 \"$d/logs/raylet.out\" | cut -c2-24)\"; "
    "echo \"registered $(grep -m 1 'Raylet of id' \"$d/logs/raylet.out\" | cut -c2-24)\"")


def worker_steps(cluster: Scaled, instances: list[Any], submitted_wall: float) -> None:
    """Each worker's own clock marks of its start (seconds after the submission): Ray's user's
    files handed over (node.sh's users.sh), `ray start`'s session dir, the raylet's first line,
    the raylet started (registered with the head)."""
    for inst in sorted(instances, key=lambda i: i.launched):
        text = cluster.host(str(inst.ip)).run(WORKER_STEPS, timeout=60).stdout
        marks = []
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            value = value.strip()
            at = log_time(value) if "-" in value else (float(value) if value else None)
            marks.append(f"{name} +{at - submitted_wall:.1f}s" if at else f"{name} ?")
        print(f"  {inst.name} on its host: {', '.join(marks)}")


if __name__ == "__main__":
    raise SystemExit(main())
