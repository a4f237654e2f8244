"""How fast the head's joiner brings a queued TPU slice into the cluster once Google grants it, on
the offline test bed (tests/gcp_tpu: test-bed hosts as VMs and TPU hosts).

Each round is a real `invoke up --provider=gcp-tpu` of a cluster with two queued slices (a v4-8 and
a 2-host v4-16) that the fake makes ACTIVE after a short wait, then `invoke teardown`. It measures,
per slice, from the moment the fake reports it ACTIVE:
- hosts up: a raylet runs on every host of the slice (the joiner's SSH setup, the node installer,
  the token, `ray start`);
and the time `invoke teardown` takes with the slices joined.

Floor: the joiner looks every 5 s (its `poll_s`), so ACTIVE->noticed is up to 5 s; everything above
is the per-host setup (SSH, installer run, Ray start) and the machine's load. Needs root.

Usage: python bench/gcp_queued.py [--rounds 2] [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.gcp_tpu.offline import write_service_account_key  # noqa: E402
from tests.gcp_tpu.offline_bed import PROJECT, ZONE, Offline, offline_bed, spec_file  # noqa: E402
from tests.testbed.hosts import Host  # noqa: E402

POLL_S = 5.0


def _event(offline: Offline, kind: str, qr_suffix: str, after: float) -> float | None:
    return next((t for t, what, name in list(offline.fake.events)
                 if what == kind and name.endswith(qr_suffix) and t >= after), None)


SLICES = {"one": {"accelerator_type": "v4-8", "cpus": 1},
          "two": {"accelerator_type": "v4-16", "cpus": 1}}
SLICE_HOSTS = {"one": 1, "two": 2}


def hosts_up(offline: Offline, names: tuple[str, ...], after: float) -> dict[str, float]:
    """For each queued slice named: seconds from the fake's ACTIVE (after `after`, a time.time())
    until a raylet runs on every host of the slice. tests/gcp_tpu/test_e2e_queued.py measures
    its own cluster's 2-host slice with this too (so CI runs it there, not on a bed of its own)."""
    result: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while any(f"{name}: ACTIVE -> hosts up" not in result for name in names):
        for name in names:
            if f"{name}: ACTIVE -> hosts up" in result:
                continue
            active = _event(offline, "queued-active", f"-{name}-0-0", after)
            if active is None:
                continue
            qr_id = next(k for k in offline.fake.queued_states() if k.endswith(f"-{name}-0-0"))
            hosts = offline.google.machines.host_of(qr_id)
            if hosts and all(h.run("pgrep -x raylet || true").stdout.strip() for h in hosts):
                result[f"{name}: ACTIVE -> hosts up"] = time.time() - active
        if time.monotonic() > deadline:
            raise SystemExit(f"the slices did not join within 600 s: {result}")
        time.sleep(0.5)
    return result


def print_joiner(head: Host) -> None:
    """The joiner's own account of each host (on the head), once the last `ray start` returned."""
    time.sleep(2)  # the joiner logs a host once its `ray start` has returned
    for line in head.run("grep -hE 'joined|failed' ~/.rayfleet/queued.log").stdout.splitlines():
        print("   joiner: " + line.split(" queued: ", 1)[-1], flush=True)


def one_round(offline: Offline, work: Path, n: int, names: tuple[str, ...]) -> dict[str, float]:
    home = work / f"home-{n}"
    key = write_service_account_key(work / f"sa-{n}.json", offline.google.identity,
                                    f"bench@{PROJECT}.iam.gserviceaccount.com")
    spec = spec_file(work, key, name=f"gcpqbench{n}", tpu_workers={},
                     queued_slices={name: SLICES[name] for name in names})
    started = time.time()
    up = offline.invoke(home, "up", "--cluster", str(spec), timeout=600)
    if up.returncode != 0:
        raise SystemExit(up.stdout + up.stderr)
    result = {"up": time.time() - started}
    try:
        result.update(hosts_up(offline, names, started))
        # Where the time went, as the joiner logged it on the head.
        heads = [i for i in offline.fake.instances.values()
                 if i["labels"].get("ray-node-type") == "head"
                 and i["labels"].get("rayfleet-name") == f"gcpqbench{n}"]
        head_ip = heads[0]["networkInterfaces"][0]["accessConfigs"][0]["natIP"]
        print_joiner(next(h for h in offline.bed.hosts if h.ip == head_ip))
    finally:
        down_started = time.time()
        down = offline.invoke(home, "teardown", "--cluster", str(spec), timeout=900)
        result["teardown"] = time.time() - down_started
        if down.returncode != 0:
            raise SystemExit(down.stdout + down.stderr)
        offline.google.machines.wait_idle()
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    args = parser.parse_args()
    # Quick: the 1-host slice only (a head and one TPU host instead of four test-bed hosts).
    names = ("one",) if args.quick else ("one", "two")
    if args.quick:
        args.rounds = 1
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    with tempfile.TemporaryDirectory(prefix="gcp-qbench-") as tmp:
        work = Path(tmp)
        with offline_bed(work, hosts=1 + sum(SLICE_HOSTS[n] for n in names)) as offline:  # + the head
            offline.fake.queue_wait_s, offline.fake.queue_provision_s = 2.0, 1.0
            print(f"zone {ZONE}; queue wait 2 s, provisioning 1 s; joiner poll {POLL_S:g} s")
            columns = ["up", *(f"{name}: ACTIVE -> hosts up" for name in names), "teardown"]
            print("round  " + "  ".join(f"{c:>24}" for c in columns))
            for n in range(1, args.rounds + 1):
                r = one_round(offline, work, n, names)
                print(f"{n:>5}  " + "  ".join(f"{r[c]:>22.1f} s" for c in columns), flush=True)
            print(f"floor for ACTIVE -> noticed: up to {POLL_S:g} s (the joiner's poll)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
