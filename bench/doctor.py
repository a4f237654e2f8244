"""Wall time of `invoke doctor` on a fresh local cluster (one node), several repetitions.

Prints each run and the median. Usage: python bench/doctor.py [--reps 3] [--quick]
(--quick: one run, for CI)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402


@dataclass(frozen=True)
class Run:
    seconds: float
    done: subprocess.CompletedProcess[str]


def measure(spec: Path, env: dict[str, str], reps: int, *args: str) -> list[Run]:
    """`invoke doctor --cluster spec ARGS` on the running cluster, `reps` times: each run, printed
    with the median. CI calls this on tests/test_examples.py's cluster (its own `up` would only
    repeat that module's), with `--json` there so that its doctor test reads the same run."""
    runs = []
    for rep in range(reps):
        started = time.monotonic()
        done = common.invoke(["doctor", "--cluster", str(spec), *args], env, check=False)
        runs.append(Run(time.monotonic() - started, done))
        print(f"doctor run {rep + 1}: {runs[-1].seconds:.1f}s (exit {done.returncode})", flush=True)
    print(f"median: {statistics.median(run.seconds for run in runs):.1f}s over {reps} runs "
          f"(load average {os.getloadavg()[0]:.1f})")
    return runs


def main() -> None:
    args = common.options(__doc__, 3, quick="one run (CI keeps it running)")
    with common.local_cluster("bench-doctor-", "provider: local\nnum_cpus: 1\n"
                              "object_store_memory_mb: 100\n") as (spec, env, _):
        measure(spec, env, args.reps)


if __name__ == "__main__":
    main()
