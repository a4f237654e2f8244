"""Cold start of `invoke --list` and `invoke plan` (local) next to `ray --help`.

Each command runs N times alternating; prints medians and ratios (target: <= 0.5x `ray --help`).
Usage: python bench/cli_startup.py [--reps 10] [--quick]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402


def main() -> None:
    args = common.options(__doc__, 10)
    env = common.bench_env(Path(tempfile.mkdtemp(prefix="rf-bench-")))
    ray = str(Path(sys.executable).with_name("ray"))
    commands = {
        "ray --help": [ray, "--help"],
        "invoke --list": [sys.executable, "-m", "invoke", "--list"],
        "invoke plan": [sys.executable, "-m", "invoke", "plan"],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(args.reps):
        for name, command in commands.items():
            times[name].append(common.timed(command, env))
    baseline = statistics.median(times["ray --help"])
    for name, values in times.items():
        median = statistics.median(values)
        print(f"{name:14s} median {median * 1000:6.0f} ms   ratio to ray --help {median / baseline:.2f}")
    print(f"(target <= 0.50; {args.reps} reps each)")


if __name__ == "__main__":
    main()
