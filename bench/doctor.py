"""Wall time of `invoke doctor` on a fresh local cluster (one node), several repetitions.

Prints each run and the median. Usage: python bench/doctor.py [--reps 3] [--quick]
(--quick: one run, for CI)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def invoke(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False, timeout=600)


def measure(spec: Path, env: dict[str, str], reps: int) -> list[float]:
    """`invoke doctor` on the running cluster `spec`, `reps` times: each run's seconds, printed
    with the median. CI calls this on tests/test_examples.py's cluster (its own `up` would only
    repeat that module's)."""
    times = []
    for rep in range(reps):
        started = time.monotonic()
        done = invoke("doctor", "--cluster", str(spec), env=env)
        times.append(time.monotonic() - started)
        print(f"doctor run {rep + 1}: {times[-1]:.1f}s (exit {done.returncode})", flush=True)
    print(f"median: {statistics.median(times):.1f}s over {reps} runs "
          f"(load average {os.getloadavg()[0]:.1f})")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="one run (CI keeps it running)")
    args = parser.parse_args()
    reps = 1 if args.quick else args.reps
    with tempfile.TemporaryDirectory(prefix="bench-doctor-") as folder:
        spec = Path(folder) / f"bd-{uuid.uuid4().hex[:6]}.yaml"
        spec.write_text("provider: local\nnum_cpus: 1\nobject_store_memory_mb: 100\n")
        env = {**os.environ, "RAYFLEET_HOME": str(Path(folder) / "home"),
               "RAY_USAGE_STATS_ENABLED": "0"}
        up = invoke("up", "--cluster", str(spec), env=env)
        if up.returncode:
            sys.exit(f"up failed: {up.stderr[-500:]}")
        try:
            measure(spec, env, reps)
        finally:
            invoke("teardown", "--cluster", str(spec), env=env)


if __name__ == "__main__":
    main()
