"""How fast Ray's own GCP autoscaler brings a TPU node in and out, on the offline test bed.

The real `invoke up --provider=gcp-tpu` (real `ray up`, Ray's GCP provider, the head's autoscaler
v1) against the offline Google of tests/gcp_tpu (test-bed hosts as VMs and TPU hosts). Each round
submits `examples/tpu_example.py --placement-only` (one task needing `TPU: 4`) to a cluster with
no TPU node and measures, from the submit:
- create: the autoscaler's TPU create call reaches the fake;
- joined: a raylet runs on the TPU host (setup commands and `ray start` done);
- job done: the job has run on the node and `invoke submit` returned;
and, from the moment the job's task ended on the node, idle->deleted: the node is gone from the fake.

Floors (what the configuration allows at best): demand->create is bounded below by one autoscaler
update (`AUTOSCALER_UPDATE_INTERVAL_S`, 1 s here); idle->deleted by `idle_timeout_minutes` (0.2 min
= 12 s; the check runs once per update, so up to 1 s more). Everything above that is Ray's
machinery (SSH waits, node setup, Ray start, resource reports) and the machine's load. Needs root
(the test bed).

With `--compare` (the default without `--quick`) a second cluster runs on the same bed with the
start commands of before issue 29 (Ray and its autoscaler as the SSH user;
bench/unseparated/sitecustomize.py, on that cluster's `invoke` PYTHONPATH only), beside the
separated one rayfleet ships (Ray as `rayfleet-ray`, Ray's monitor as `rayfleet-scaler`, the
metadata server guarded), and the rounds alternate between them (the two heads and the one TPU
host the bed has left), so each pair meets the same load. The line to read: scale-up (submit ->
TPU host joined), separated / before per pair and their median, target <= 1.05.

Usage: python bench/gcp_autoscale.py [--rounds 3] [--quick] [--no-compare]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
UNSEPARATED = ROOT / "bench" / "unseparated"

from tests.gcp_tpu.offline import write_service_account_key  # noqa: E402
from tests.gcp_tpu.offline_bed import (  # noqa: E402
    IDLE_TIMEOUT_MINUTES,
    PROJECT,
    RAY_FAST,
    Offline,
    offline_bed,
    spec_file,
)


def _first(offline: Offline, kind: str, after: float) -> tuple[float, str] | None:
    return next(((t, name) for t, what, name in list(offline.fake.events)
                 if what == kind and t >= after), None)


def _env(offline: Offline, home: Path, before: bool) -> dict[str, str]:
    """`invoke`'s environment; `before`: with the start commands of before issue 29."""
    env = offline.env(home)
    if before:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(UNSEPARATED), env.get("PYTHONPATH", "")) if p)
    return env


@dataclass
class Demand:
    """One round's scale-up: seconds from the submit, and what the job printed."""
    started: float
    create: float
    joined: float
    job: float
    out: str


def demand(offline: Offline, home: Path, spec: Path, env: dict[str, str],
           hold: float = 0.0) -> Demand:
    """Submit one task needing `TPU: 4` to a cluster without a TPU node and time its scale-up
    (tests/gcp_tpu/test_e2e_cluster.py measures its own cluster's scale-up with this too, its task
    holding the chips `hold` seconds while the test preempts the node)."""
    started = time.time()
    job = subprocess.Popen(offline.argv("submit", "--cluster", str(spec), "examples/tpu_example.py",
                                        "--", "--wait-for-tpu", "300", "--placement-only",
                                        "--hold", f"{hold:g}"),
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True)
    joined = 0.0
    while job.poll() is None:
        created = _first(offline, "create", started)
        if created and not joined:
            hosts = offline.google.machines.host_of(created[1])
            if hosts and hosts[0].run("pgrep -x raylet || true").stdout.strip():
                joined = time.time()
        time.sleep(0.2)
    out, err = job.communicate()
    done = time.time()
    if job.returncode != 0:
        raise SystemExit(f"job failed:\n{out}\n{err}")
    created = _first(offline, "create", started)
    assert created is not None
    return Demand(started, created[0] - started, (joined or done) - started, done - started, out)


def idle_deleted(offline: Offline, scaled: Demand) -> float:
    """Seconds from the end of the job's task on the TPU node until the node was deleted."""
    ended = float(json.loads(scaled.out.split("RESULT ", 1)[1].splitlines()[0])
                  ["results"][0]["ended_at"])
    while (deleted := _first(offline, "deleted", ended)) is None:
        if time.time() - scaled.started - scaled.job > 300:
            raise SystemExit("the idle TPU node was not deleted within 300 s")
        time.sleep(0.2)
    # The deleted node's host powers off before the next round may have it.
    offline.google.machines.wait_idle()
    return deleted[0] - ended


HEADER = (f"{'round':>5} {'cluster':>10} {'create s':>9} {'joined s':>9} {'job done s':>11} "
          f"{'idle->deleted s':>16} {'idle floor s':>13} {'load':>5}")


def row(n: int, name: str, scaled: Demand, idle: float) -> str:
    """One round's line under HEADER."""
    return (f"{n:>5} {name:>10} {scaled.create:>9.1f} {scaled.joined:>9.1f} {scaled.job:>11.1f} "
            f"{idle:>16.1f} {IDLE_TIMEOUT_MINUTES * 60:>13.1f} {os.getloadavg()[0]:>5.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds (pairs with --compare)")
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=None,
                        help="alternate rounds with a cluster on the start commands of before "
                             "issue 29 (default: on without --quick)")
    args = parser.parse_args()
    if args.quick:
        args.rounds = 1
    compare = args.compare if args.compare is not None else not args.quick
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    interval = float(RAY_FAST["AUTOSCALER_UPDATE_INTERVAL_S"])
    kinds = [False, True] if compare else [False]  # before issue 29?
    with tempfile.TemporaryDirectory(prefix="gcp-bench-") as tmp:
        work = Path(tmp)
        with offline_bed(work) as offline:
            key = write_service_account_key(work / "sa.json", offline.google.identity,
                                            f"bench@{PROJECT}.iam.gserviceaccount.com")
            clusters = {before: (work / ("home-before" if before else "home"),
                                 spec_file(work, key, name="gcpbefore" if before else "gcpe2e"))
                        for before in kinds}
            joined: dict[bool, list[float]] = {before: [] for before in kinds}
            try:
                for before, (home, spec) in clusters.items():
                    took, up = _invoke(offline, "up", home, spec, before)
                    if up.returncode != 0:
                        raise SystemExit(up.stdout + up.stderr)
                    print(f"invoke up (head VM + Ray + tunnel check): {took:.1f} s, "
                          f"{_name(before)}")
                print(HEADER)
                for n in range(1, args.rounds + 1):
                    # Alternate which goes first, so neither always follows the other's teardown.
                    for before in (kinds if n % 2 else kinds[::-1]):
                        home, spec = clusters[before]
                        scaled = demand(offline, home, spec, _env(offline, home, before))
                        idle = idle_deleted(offline, scaled)
                        joined[before].append(scaled.joined)
                        print(row(n, _name(before), scaled, idle), flush=True)
                print(f"floor for demand->create: {interval:g} s (one autoscaler update)")
            finally:
                for before, (home, spec) in clusters.items():
                    took, down = _invoke(offline, "teardown", home, spec, before)
                    print(f"invoke teardown: {took:.1f} s (exit {down.returncode}), "
                          f"{_name(before)}")
    if compare:
        pairs = list(zip(joined[False], joined[True], strict=True))
        ratios = [a / b for a, b in pairs]
        print(f"scale-up (submit -> TPU host joined), separated autoscaler vs Ray as the SSH user, "
              f"per pair: {', '.join(f'{a:.1f}/{b:.1f} s' for a, b in pairs)}; "
              f"ratios {', '.join(f'{r:.2f}' for r in ratios)}; median "
              f"{statistics.median(ratios):.3f} (target <= 1.05); load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


def _invoke(offline: Offline, verb: str, home: Path, spec: Path, before: bool
            ) -> tuple[float, subprocess.CompletedProcess[str]]:
    """`invoke VERB --cluster SPEC` through the offline bed: its seconds and its result."""
    started = time.monotonic()
    done = subprocess.run(offline.argv(verb, "--cluster", str(spec)),
                          env=_env(offline, home, before), capture_output=True, text=True,
                          timeout=600, check=False)
    return time.monotonic() - started, done


def _name(before: bool) -> str:
    return "before" if before else "separated"


if __name__ == "__main__":
    raise SystemExit(main())
