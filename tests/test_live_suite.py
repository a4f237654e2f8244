"""tests/live (the live suite for real accounts) in the default run: its refusals, and the same
suite against the fakes (`--live-fake`), each in its own pytest subprocess exactly as a user runs
it. The live suite itself is never collected here (pyproject's norecursedirs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

#: The providers whose fake-backed live run is part of this run, and their cap options. CI time:
#: each run adds about 4 minutes on the 2-core machine; by default only Lambda's (the whole CI run
#: must stay under 40 minutes). `RAYFLEET_LIVE_FAKES=lambda,gcp-tpu,slurm` runs all three.
CAPS = {"lambda": "--max-usd=5", "gcp-tpu": "--max-usd=5", "slurm": "--max-node-hours=5"}
LIVE_FAKES = [p.strip() for p in os.environ.get("RAYFLEET_LIVE_FAKES", "lambda").split(",") if p.strip()]
#: Which of the live suite's scenarios run against the fakes (a `-k` expression; `all`: every one).
#: By default the sweep alone, on the whole harness (the fake's bed, both clusters planned against
#: the cap, the clean-up and its leftovers check): the fixed cluster's up, submit, dashboard,
#: autodown and teardown are what tests/lambda_cloud/test_e2e_cluster.py and test_e2e_autoscale.py's
#: test_busy_head_stays_idle_head_removes_the_whole_cluster
#: prove on the same fake, the autoscaling one's up with the head alone, 0 -> 1 -> 0 and teardown
#: what tests/lambda_cloud/test_e2e_autoscale.py proves there (test_up_starts_only_the_head,
#: test_job_needing_two_gpus_scales_from_zero_then_idle_back_to_zero); running them twice cost CI
#: about a minute of one worker each.
LIVE_SCENARIOS = os.environ.get("RAYFLEET_LIVE_SCENARIOS", "sweep")
#: How many scenarios each choice runs (tests/live/test_live.py has three).
SCENARIO_COUNT = {"all": 3, "sweep": 1, "autoscaling or sweep": 2}


def live(*args: str, ci: bool | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`python -m pytest tests/live ARGS`; `ci` sets (True) or drops (False) CI=true."""
    env = dict(os.environ)
    env.pop("PYTEST_ADDOPTS", None)
    if ci is False:
        env.pop("CI", None)
    elif ci:
        env["CI"] = "true"
    # -n 0: the live suite's steps build on each other; it never runs spread over workers.
    # Hydra's pytest plugin (installed with the examples' extras; the live suite uses nothing of
    # it) imports Hydra: half of each of these runs' CPU. The same for anyio's, platformdirs' and
    # xdist's looponfail plugins (installed with Ray and pytest-xdist): ~40% of a refusal's CPU.
    return subprocess.run([sys.executable, "-m", "pytest", "tests/live", "-q", "-n", "0",
                           "-p", "no:cacheprovider", "-p", "no:hydra_pytest", "-p", "no:anyio",
                           "-p", "no:platformdirs", "-p", "no:xdist.looponfail", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout, check=False)


def refused(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode != 0, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if "refusing to start" in line]
    assert len(lines) == 1, done.stdout + done.stderr
    assert "passed" not in done.stdout and "is up" not in done.stdout + done.stderr
    return lines[0]


def test_plain_pytest_never_collects_the_live_suite() -> None:
    # pytest collected only this module when given it and tests/ both, so tests/live was never
    # looked at. Now tests/ is given alone, its other folders and modules left out (collecting them
    # costs several CPU-s): only pyproject's norecursedirs keeps pytest out of tests/live.
    others = [f"--ignore={path.relative_to(ROOT)}" for path in sorted((ROOT / "tests").iterdir())
              if path.name not in ("live", Path(__file__).name)
              and (path.is_dir() or path.name.startswith("test_"))]
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-n", "0",
                           "-p", "no:cacheprovider", *others, "tests"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "tests/test_live_suite.py::" in done.stdout
    assert [line for line in done.stdout.splitlines() if line.startswith("tests/live")] == []


@pytest.mark.parametrize(("args", "ci", "says"), [
    ((), False, "tests/live runs only when asked: add --live="),
    (("--live=lambda", "--max-usd=5"), False, "--live=lambda: no credentials; add --live-credentials"),
    (("--live=slurm", "--max-node-hours=2"), False, "--live=slurm: no credentials"),
    (("--live=lambda", "--live-credentials=KEYFILE"), False, "--live=lambda: no cost cap; add --max-usd="),
    (("--live=slurm", "--live-credentials=KEYFILE", "--max-usd=5"), False,
     "--live=slurm: no cost cap; add --max-node-hours="),
    (("--live=lambda", "--live-credentials=KEYFILE", "--max-usd=5"), True,
     "CI=true: the live suite runs only against the fakes here; add --live-fake"),
    (("--live=lambda", "--live-fake"), True, "--live=lambda: no cost cap"),
])
def test_refuses_in_one_line_before_anything(tmp_path: Path, args: tuple[str, ...], ci: bool,
                                             says: str) -> None:
    key = tmp_path / "lambda.key"
    key.write_text("secret_never_used_0123\n")
    done = live(*(a.replace("KEYFILE", str(key)) for a in args), ci=ci)
    line = refused(done)
    assert done.returncode == 4 and says in line, line
    assert "secret_never_used" not in done.stdout + done.stderr


@pytest.mark.slow
def test_cap_below_the_worst_case_refuses_before_the_first_up() -> None:
    """Against the fakes: the provider's estimate of the run's worst case is above the cap."""
    done = live("--live=lambda", "--live-fake", "--max-usd=0.3", timeout=600)
    line = refused(done)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "exceeds --max-usd=0.3" in line and "$0.40/h at its largest" in line, line
    assert "spent at most $0.00 of the $0.30 cap (no cluster" in done.stdout + done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("provider", LIVE_FAKES)
def test_live_suite_against_the_fakes(provider: str) -> None:
    chosen = () if LIVE_SCENARIOS == "all" else ("-k", LIVE_SCENARIOS)
    done = live(f"--live={provider}", "--live-fake", CAPS[provider], "-s", *chosen, timeout=1500)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    passed = re.search(r"([0-9]+) passed", done.stdout)
    expected = SCENARIO_COUNT.get(LIVE_SCENARIOS)
    assert passed and " failed" not in done.stdout, done.stdout[-3000:]
    assert expected is None or int(passed[1]) == expected, done.stdout[-3000:]
    summary = [line for line in (done.stdout + done.stderr).splitlines()
               if "live run spent at most" in line]
    assert summary, done.stdout[-3000:] + done.stderr[-3000:]
    print(summary[-1])
    print(next(line for line in (done.stdout + done.stderr).splitlines() if line.startswith("seconds:")))


@pytest.mark.parametrize(("provider", "text", "says"), [
    ("lambda", "api key: none here\n", "no Lambda API key in it"),
    ("slurm", "provider: lambda\n", "expected your slurm spec"),
    ("gcp-tpu", "provider: gcp-tpu: [\n", "not a readable spec"),
])
def test_refuses_credentials_that_are_not_what_it_needs(tmp_path: Path, provider: str, text: str,
                                                        says: str) -> None:
    path = tmp_path / "credentials"
    path.write_text(text)
    cap = "--max-node-hours=1" if provider == "slurm" else "--max-usd=1"
    done = live(f"--live={provider}", f"--live-credentials={path}", cap, ci=False)
    line = refused(done)
    assert done.returncode == 3 and says in line, line
