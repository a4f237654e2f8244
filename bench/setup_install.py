"""setup/install.sh: a first install (venv backend, reusing this interpreter's packages) and re-runs.

The issue's goal: a second run is a no-op "in seconds". Prints the first run's time and the median
of N re-runs, plus N concurrent re-runs on one prefix (as many nodes sharing an NFS home would).
Usage: python bench/setup_install.py [--reruns 5] [--quick]
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench import common  # noqa: E402  (after the path: run as a plain script)
from infra.core.versions import node_pins  # noqa: E402


def main() -> None:
    args = common.options(__doc__, 5, name="reruns")
    pins = node_pins()
    folder = Path(tempfile.mkdtemp(prefix="rf-bench-install-"))
    argv = ["bash", str(ROOT / "setup" / "install.sh"), "--env", "cpu",
            "--ray-version", pins["ray_version"], "--python-version", pins["python_version"],
            "--backend", "venv", "--python", sys.executable, "--prefix", str(folder / "env")]
    env = common.bench_env()
    try:
        started = time.monotonic()
        subprocess.run(argv, env=env, check=True, capture_output=True)
        first = time.monotonic() - started
        reruns = []
        for _ in range(args.reruns):
            started = time.monotonic()
            done = subprocess.run(argv, env=env, check=True, capture_output=True, text=True)
            reruns.append(time.monotonic() - started)
            assert done.stdout.startswith("rayfleet env already installed"), done.stdout
        started = time.monotonic()
        runs = [subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(args.reruns)]
        assert all(run.wait() == 0 for run in runs)
        concurrent = time.monotonic() - started
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print(f"first install (venv, packages reused):   {first:6.2f} s")
    print(f"re-run, median of {args.reruns}:                 {statistics.median(reruns):6.2f} s "
          f"(max {max(reruns):.2f} s)")
    print(f"{args.reruns} concurrent re-runs, one prefix:     {concurrent:6.2f} s")


if __name__ == "__main__":
    main()
