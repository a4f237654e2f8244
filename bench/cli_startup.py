"""Cold start of `invoke --list` and `invoke plan` (local) next to `ray --help`.

Each command runs N times alternating; prints medians and ratios (target: <= 0.5x `ray --help`).
Usage: python bench/cli_startup.py [--reps 10] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _time(command: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    return time.monotonic() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="smallest sizes, one repetition: CI runs it so the bench cannot rot")
    args = parser.parse_args()
    if args.quick:
        args.reps = 1
    env = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0",
           "RAYFLEET_HOME": tempfile.mkdtemp(prefix="rf-bench-")}
    ray = str(Path(sys.executable).with_name("ray"))
    commands = {
        "ray --help": [ray, "--help"],
        "invoke --list": [sys.executable, "-m", "invoke", "--list"],
        "invoke plan": [sys.executable, "-m", "invoke", "plan"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.reps):
        for name, command in commands.items():
            times[name].append(_time(command, env))
    baseline = statistics.median(times["ray --help"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:14s} median {median * 1000:6.0f} ms   ratio to ray --help {median / baseline:.2f}")
    print(f"(target <= 0.50; {args.reps} reps each)")


if __name__ == "__main__":
    main()
