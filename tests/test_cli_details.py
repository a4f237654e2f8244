"""The small traps a new user met (issue 23), each as `invoke` shows it: help that says what to
type, one-line errors, no cluster-less side effects, output that survives a pipe. No cluster runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infra.core import costs, jobs
from infra.core.costs import Cost
from tests.conftest import ROOT
from tests.forked_cli import run_invoke, run_rayfleet


def test_help_shows_positionals_and_value_placeholders() -> None:
    submit = run_rayfleet("submit", "--help")
    assert submit.returncode == 0
    assert "SCRIPT " in submit.stdout and "--script" not in submit.stdout
    assert "invoke submit [OPTIONS] SCRIPT [-- ARGS...]" in submit.stdout
    assert "-t NUMBER, --timeout=NUMBER" in run_rayfleet("list", "--help").stdout
    assert "-o VALUE, --only=VALUE" in run_rayfleet("sweep", "--help").stdout
    sync = run_rayfleet("sync", "--help")
    assert sync.returncode == 0 and "DIRECTION" in sync.stdout and "REMOTE" in sync.stdout
    assert "JOB " in run_rayfleet("logs", "--help").stdout
    assert "-w, --[no-]wait" in submit.stdout
    # Invoke's own program in a checkout: `TASK --help` of a task with one positional argument
    # shows the same help (the task re-runs it); `--help TASK` is Invoke's own.
    assert run_invoke("submit", "--help").stdout == submit.stdout
    listed = run_invoke("--help", "list")
    assert listed.returncode == 0 and "--timeout" in listed.stdout


def test_an_option_without_its_value_is_one_line_naming_it() -> None:
    done = run_rayfleet("list", "--timeout")
    assert done.returncode != 0
    assert done.stderr.strip() == \
        "--timeout needs a value, e.g. --timeout=NUMBER (see `rayfleet --help list`)"


def test_optional_positionals_may_be_left_out_and_required_ones_may_not() -> None:
    # Parsed (the job is "": the last one), then refused for its unknown provider.
    for task in ("logs", "stop-job"):
        done = run_rayfleet(task, "--provider", "nosuch")
        assert done.stderr.strip().startswith("error: --provider: unknown provider"), done.stderr
    sync = run_rayfleet("sync", "up")
    assert sync.returncode != 0 and "'local', 'remote'" in sync.stderr


def test_teardown_of_a_never_created_lambda_cluster_needs_no_key(rf_home: Path,
                                                                  tmp_path: Path) -> None:
    env = {"LAMBDA_API_KEY": "", "HOME": str(tmp_path)}
    done = run_invoke("teardown", "--provider=lambda", env=env)
    assert done.returncode == 0, done.stderr
    assert "nothing to tear down" in done.stdout
    assert not (rf_home / "state" / "lambda.lock").exists(), "no lock file is left behind"
    assert not (rf_home / "state" / "lambda.json").exists()


def test_plan_without_a_lambda_key_fails_with_the_fix(rf_home: Path, tmp_path: Path) -> None:
    done = run_invoke("plan", "--provider=lambda", "--json",
                      env={"LAMBDA_API_KEY": "", "HOME": str(tmp_path)})
    assert done.returncode == 1
    planned = json.loads(done.stdout)
    assert planned["diff"] == "" and "no Lambda API key" in planned["problems"][0]
    assert "assigned-at-first-up" in json.dumps(planned["resources"])


def test_tables_are_not_cut_when_output_is_not_a_terminal(rf_home: Path) -> None:
    done = run_invoke("plan", env={"COLUMNS": ""})
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    assert "/rf-XXXXXXXX/local" in done.stdout


def test_a_free_cluster_costs_nothing_in_plain_words() -> None:
    from infra.providers.local.provider import FREE

    line = costs.describe_cost(Cost(1, 0.0, 61.0, 0.0, source=FREE))
    assert line == "1 node(s), free, up 0:01:01 (runs on this machine)"
    paid = costs.describe_cost(Cost(2, 1.5, 3600.0, 1.5, source="Lambda /instance-types"))
    assert paid == "2 node(s), $1.50/h now, up 1:00:00, accrued $1.50 (Lambda /instance-types)"


def test_a_hydra_sweeps_multirun_folder_is_ignored_and_never_uploaded(tmp_path: Path) -> None:
    ignored = subprocess.run(["git", "check-ignore", "-q", "multirun/2026-11-24/0/x.log"],
                             cwd=ROOT, check=False)
    assert ignored.returncode == 0, "multirun/ is git-ignored"
    assert "multirun/" in jobs.runtime_env(None, tmp_path)["excludes"]


@pytest.mark.parametrize("colour", [False, True])
def test_job_log_filter_drops_ray_internals_and_colour_off_a_terminal(colour: bool) -> None:
    from infra.core import raynoise

    lines = raynoise.LineFilter(colour=colour)
    chunks = ["\x1b[36m(pid=7)\x1b[0m step 1\n\x1b[36m(pid=7)\x1b[0m [mutex.cc : 4",
              "52] RAW: Lock blocking 0x55 @ 0x7f\nstep 2\nno newline yet"]
    shown = "".join(lines.feed(chunk) for chunk in chunks) + lines.flush()
    assert "RAW:" not in shown and "step 2\n" in shown and shown.endswith("no newline yet")
    assert ("\x1b[" in shown) == colour


def test_money_is_written_one_way_from_dollars() -> None:
    from infra.providers.lambda_cloud import costs as lambda_costs

    assert costs.usd(1234.5) == "$1,234.50" and costs.usd(None) == "?"
    # Lambda's API prices in cents: converted once, then written the same way.
    assert lambda_costs.usd_from_cents(150) == costs.usd(1.5) == "$1.50"


def test_tables_fold_long_cells_in_a_narrow_terminal_never_cut_them() -> None:
    # A real terminal's width (COLUMNS=80, as rich reads it) with a job whose entrypoint is wider.
    # One word wider than the column: rich's default cuts it with "…".
    entrypoint = "python " + "/".join(f"folder-{i}" for i in range(12)) + "/train.py --lr=0.1"
    code = ("from infra.cli import common; common.table('jobs', [{'job': 'raysubmit_x', "
            f"'status': 'RUNNING', 'entrypoint': {entrypoint!r}}}])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "80"}, check=False, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout and max(map(len, done.stdout.splitlines())) <= 80
    cells = "".join(line.split("│")[-2].strip() for line in done.stdout.splitlines()
                    if line.count("│") == 4)
    assert cells.replace(" ", "") == entrypoint.replace(" ", "")


def test_check_prints_every_fix_whole_in_a_narrow_terminal(rf_home: Path, tmp_path: Path) -> None:
    done = run_invoke("check", "--timeout", "20", env={"COLUMNS": "80", "LAMBDA_API_KEY": "",
                                                       "HOME": str(tmp_path)}, timeout=120)
    assert done.returncode == 0, done.stderr
    fix = "set LAMBDA_API_KEY or put `api_key = ...` in ~/.lambda_cloud/lambda_keys"
    assert fix in done.stdout and "…" not in done.stdout


def test_every_verbs_one_line_in_the_list_is_a_whole_sentence() -> None:
    """`rayfleet --list` shows each docstring's first line only: one that runs on ("... and
    write") reads cut off; the details go after a blank line."""
    from invoke import Collection

    from infra.cli import tasks

    verbs = Collection.from_module(tasks)
    cut = {}
    for name in verbs.task_names:
        lines = (verbs[name].__doc__ or "").strip().splitlines()
        if not lines or (len(lines) > 1 and lines[1].strip()):
            cut[name] = lines[0] if lines else ""
    assert not cut, cut
