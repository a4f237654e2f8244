"""What the bench scripts share (a module, not a bench): their command line (a repetition count and
`--quick`), `invoke` run as a user runs it, a fresh local cluster for the length of a measurement,
and how a series of ratios is summed up.

The scripts run as plain files (`python bench/NAME.py`) and are imported by the tests (`from bench
import NAME`): each puts the checkout on sys.path and imports this as `bench.common`.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The local cluster the local benches measure: two CPUs, a small object store.
LOCAL_SPEC = "provider: local\nnum_cpus: 2\nobject_store_memory_mb: 200\n"
#: Seconds between one cluster's teardown and the next `up` of a pair: what teardown's SIGKILLs
#: leave (exit of killed processes, freed memory) is done by then.
PAUSE_S = 2.0
QUICK_HELP = "smallest sizes, one repetition: CI runs it so the bench cannot rot"


def options(doc: str | None, reps: int, *, name: str = "reps", quick: str = QUICK_HELP,
            raw: bool = False,
            more: Callable[[argparse.ArgumentParser], object] | None = None) -> argparse.Namespace:
    """The bench's options: `--<name> N` (default `reps`) and `--quick`, which sets N to 1, plus
    whatever `more` adds; `raw` keeps the docstring's line breaks in --help."""
    parser = argparse.ArgumentParser(
        description=doc,
        formatter_class=argparse.RawDescriptionHelpFormatter if raw else argparse.HelpFormatter)
    parser.add_argument(f"--{name}", type=int, default=reps, help=f"repetitions (default {reps})")
    parser.add_argument("--quick", action="store_true", help=quick)
    if more:
        more(parser)
    args = parser.parse_args()
    if args.quick:
        setattr(args, name.replace("-", "_"), 1)
    return args


def bench_env(home: Path | None = None) -> dict[str, str]:
    """This environment, usage statistics off, and RAYFLEET_HOME at `home` when given."""
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0"}
    if home is not None:
        env["RAYFLEET_HOME"] = str(home)
    return env


def invoke(args: list[str], env: dict[str, str], check: bool = True,
           timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """`python -m invoke ARGS` in the checkout; with `check`, a failure ends the bench in one line."""
    done = subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env, check=False,
                          capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise SystemExit(f"invoke {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done


def timed(command: list[str], env: dict[str, str]) -> float:
    """Seconds `command` takes in the checkout (it must succeed)."""
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.monotonic() - started


def slurm_scratch(prefix: str) -> tuple[Path, dict[str, str]]:
    """For a bench on the Slurm test bed (which must be usable here): a temp folder, removed at
    exit (the bed's `with` block has ended by then), and the bench env with RAYFLEET_HOME in it."""
    from tests.testbed import preflight

    reason = preflight.unavailable("slurm")
    if reason:
        raise SystemExit(f"cannot run the Slurm test bed here: {reason}")
    work = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, work, True)
    return work, bench_env(work / "home")


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[tuple[dict[str, str], Path]]:
    """A temp folder for the `with` block, RAYFLEET_HOME in it: (env, folder); removed after."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield bench_env(work / "home"), work
    finally:
        shutil.rmtree(work, ignore_errors=True)


@contextlib.contextmanager
def local_cluster(prefix: str, spec_text: str = LOCAL_SPEC
                  ) -> Iterator[tuple[Path, dict[str, str], Path]]:
    """A fresh local cluster in a temp folder for the `with` block: (spec, env, folder); torn
    down and the folder removed after."""
    with workdir(prefix) as (env, work):
        spec = work / f"bench{uuid.uuid4().hex[:6]}.yaml"
        spec.write_text(spec_text)
        invoke(["up", "--cluster", str(spec)], env)
        try:
            yield spec, env, work
        finally:
            invoke(["teardown", "--cluster", str(spec)], env, check=False)


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.3f}, range {min(values):.3f}-{max(values):.3f}"
