"""Debug the test bed by hand.

    python -m tests.testbed up [N] [--slurm] [--workdir DIR]   # build, print, wait for Ctrl+C, tear down
    python -m tests.testbed local-slurm [--workdir DIR]         # single-node Slurm on 127.0.0.1
    python -m tests.testbed clean                               # remove leftovers of crashed runs
    python -m tests.testbed list                                # runs on this machine
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from tests.testbed import preflight, registry
from tests.testbed.core import Testbed
from tests.testbed.slurm import LocalSlurm, SlurmCluster


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _hold() -> None:
    print("\nup; Ctrl+C (or SIGTERM) tears it down", flush=True)
    # Explicitly, since a shell starts background jobs with SIGINT ignored.
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        print("\ntearing down", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.testbed", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start N hosts (and Slurm with --slurm) until Ctrl+C")
    up.add_argument("n", type=int, nargs="?", default=2)
    up.add_argument("--slurm", action="store_true", help="also run Slurm on the hosts")
    up.add_argument("--workdir", type=Path, help="configs and logs (default: a new temp dir)")
    local = sub.add_parser("local-slurm", help="single-node Slurm on 127.0.0.1 until Ctrl+C")
    local.add_argument("--workdir", type=Path)
    sub.add_parser("clean", help="remove namespaces, routes and processes of runs whose owner died")
    sub.add_parser("list", help="show the runs recorded on this machine")
    args = parser.parse_args(argv)

    if args.command in ("clean", "list"):
        reg = registry.Registry()
        if args.command == "clean":
            with reg.locked():
                done = reg.clean_stale()
            print("\n".join(done) or "nothing to clean")
        else:
            for rec in reg.load_all():
                alive = registry.is_alive(rec.owner_pid, rec.owner_start)
                print(f"{rec.run_id}  owner {rec.owner_pid} ({'alive' if alive else 'gone'})  "
                      f"{rec.subnet or '-'}  {rec.workdir}")
        return 0

    slurm = args.command == "local-slurm" or args.slurm
    reason = preflight.unavailable("slurm" if slurm else "testbed")
    if reason:
        print(f"cannot run the test bed: {reason}", file=sys.stderr)
        return 1
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rayfleet-testbed-"))
    if args.command == "local-slurm":
        with LocalSlurm(workdir) as slurm:
            print(f"single-node Slurm, work dir {slurm.workdir}, timings {slurm.timings}")
            print(f"  export SLURM_CONF={slurm.conf_path}")
            _hold()
        return 0
    if args.slurm:
        with SlurmCluster(args.n, workdir) as cluster:
            print(cluster.testbed.describe())
            print(f"  Slurm:          export SLURM_CONF={cluster.conf_path}; "
                  f"{shlex.join(cluster.cli_prefix)} sinfo   (or ssh to any host)")
            print(f"  timings:        {cluster.timings}")
            _hold()
        return 0
    with Testbed(args.n, workdir) as bed:
        print(bed.describe())
        print(f"  timings:        {bed.timings}")
        _hold()
    return 0


if __name__ == "__main__":
    sys.exit(main())
