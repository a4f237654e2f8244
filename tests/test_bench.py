"""Every script in bench/ runs once in its quick mode (`--quick`: smallest sizes, one repetition) and
prints its numbers, so none of them rots between the sessions that run them in full.

The numbers themselves are not judged here (a loaded CI machine says little about speed); that a
bench runs to the end and prints its summary line is. Costs on the 2-core CI machine: see
docs/benchmarks.md.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.testbed.preflight import require

NUMBER = r"[0-9]+(\.[0-9]+)?"

# bench script -> (what the machine needs: None, "testbed" or "slurm"; its summary line, a regex).
BENCHES: dict[str, tuple[str | None, str]] = {
    "tracking_up": (None, rf"median ratio up with tracking / without: {NUMBER}"),
    "metrics": (None, rf"median ratio CPU-bound job with scraping / without: {NUMBER}"),
    "serve_deploy": (None, rf"median ratio invoke serve-deploy / serve deploy \(to first answer\): {NUMBER}"),
    "doctor": (None, rf"median: {NUMBER}s over 1 runs"),
    "cli_startup": (None, rf"invoke plan +median +{NUMBER} ms +ratio to ray --help {NUMBER}"),
    "setup_install": (None, rf"re-run, median of 1: +{NUMBER} s"),
    "local_up": (None, rf"median ratio invoke up / raw ray start: {NUMBER}"),
    "gateway": (None, r"targets: list (met|MISSED), submit (met|MISSED), load errors met \(load average"),
    "lambda_up": (None, rf"worst overhead over the floor: -?{NUMBER}%"),
    "lambda_transit": (None, rf"over Limits.transit \({NUMBER} ms\): {NUMBER} of {NUMBER}"),
    "lambda_autoscale": ("testbed", rf"submission -> 1 workers joined: {NUMBER}s; floor {NUMBER}s"),
    "slurm_up": ("slurm", rf"1 node\(s\): rayfleet {NUMBER} +recipe {NUMBER} +ratio {NUMBER}"),
    "slurm_autoscale": ("slurm", rf"median seconds: rayfleet {NUMBER}, bare {NUMBER}; ratio {NUMBER}"),
    "gcp_autoscale": ("testbed", r"invoke teardown: [0-9.]+ s \(exit 0\)"),
    "gcp_queued": ("testbed", rf"floor for ACTIVE -> noticed: up to {NUMBER} s"),
}


def test_every_bench_script_is_listed() -> None:
    # A bench is a script; bench/ also holds modules the benches deploy (serve_echo.py).
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py") if "__main__" in path.read_text()}
    assert scripts == set(BENCHES), "add each bench/ script to BENCHES with its summary line"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(BENCHES))
def test_bench_quick_run(name: str) -> None:
    needs, summary = BENCHES[name]
    if needs:
        require(needs)
    done = subprocess.run([sys.executable, f"bench/{name}.py", "--quick"], cwd=ROOT,
                          env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=900, check=False)
    print(done.stdout)  # the numbers, for -s and for the log of a failing run
    assert done.returncode == 0, f"bench/{name}.py --quick exited {done.returncode}:\n{done.stdout}"
    assert re.search(summary, done.stdout), f"no summary line /{summary}/ in:\n{done.stdout}"
