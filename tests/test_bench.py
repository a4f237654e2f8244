"""Every script in bench/ runs once in its quick mode (`--quick`: smallest sizes, one repetition) and
prints its numbers, so none of them rots between the sessions that run them in full; a bench whose
scenario an e2e module runs anyway has its measuring code run there, on that module's cluster
(ON_E2E below; docs/benchmarks.md).

The numbers themselves are not judged here (a loaded CI machine says little about speed); that a
bench runs to the end and prints its summary line is. Costs on the 2-core CI machine: see
docs/benchmarks.md.
"""

from __future__ import annotations

import ast
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
    "cli_startup": (None, rf"invoke plan +median +{NUMBER} ms +ratio to ray --help {NUMBER}"),
    "setup_install": (None, rf"re-run, median of 1: +{NUMBER} s"),
    "lambda_up": (None, rf"worst overhead over the floor: -?{NUMBER}%"),
    "lambda_transit": (None, rf"over Limits.transit \({NUMBER} ms\): {NUMBER} of {NUMBER}"),
}


# bench script -> the e2e test that runs its measurement on that module's own cluster, and the
# function it calls: the scenario is the e2e's (a bed and a cluster of the bench's own would repeat
# it), the measuring and its printed lines are the bench's. The e2e checks the bench's summary.
ON_E2E: dict[str, tuple[str, str]] = {
    "lambda_autoscale": ("lambda_cloud/test_e2e_autoscale.py", "scale_up"),
    "gcp_autoscale": ("gcp_tpu/test_e2e_cluster.py", "demand"),
    "gcp_queued": ("gcp_tpu/test_e2e_queued.py", "hosts_up"),
    "slurm_autoscale": ("slurm/test_e2e_autoscale.py", "run_bare"),
    "isolation": ("local/test_e2e_isolation.py", "first_result"),
    "doctor": ("test_examples.py", "measure"),
    "serve_deploy": ("test_examples.py", "measure"),
    "tracking_up": ("test_examples.py", "run_arm"),
    "local_up": ("test_examples.py", "measure"),
    "metrics": ("local/test_e2e_metrics.py", "measure_jobs"),
    "slurm_up": ("slurm/test_e2e_cluster.py", "run_ours"),
    "gateway": ("local/test_e2e_classroom.py", "measure"),
}


def test_every_bench_script_is_listed() -> None:
    # A bench is a script; bench/ also holds modules the benches deploy (serve_echo.py).
    scripts = {path.stem for path in (ROOT / "bench").glob("*.py") if "__main__" in path.read_text()}
    assert scripts == set(BENCHES) | set(ON_E2E), \
        "add each bench/ script to BENCHES with its summary line (or to ON_E2E)"
    assert not set(BENCHES) & set(ON_E2E)


@pytest.mark.parametrize("name", list(ON_E2E))
def test_a_bench_measured_on_an_e2e_cluster_is_called_there_and_starts(name: str) -> None:
    module, function = ON_E2E[name]
    tree = ast.parse((ROOT / "tests" / module).read_text())
    # The name the module gives the bench (`from bench import doctor as doctor_bench`).
    bound = {alias.asname or alias.name for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module == "bench"
             for alias in node.names if alias.name == name}
    imported = bool(bound)
    called = any(isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                 and node.func.attr == function and isinstance(node.func.value, ast.Name)
                 and node.func.value.id in bound for node in ast.walk(tree))
    assert imported and called, f"tests/{module} must call bench/{name}.py's {function}()"
    # The script itself still starts and explains itself (its bed and `up` are the e2e's calls).
    done = subprocess.run([sys.executable, f"bench/{name}.py", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0 and "--quick" in done.stdout, done.stdout + done.stderr


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
