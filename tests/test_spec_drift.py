"""A running cluster's spec changed since its last `up` (issue 37): `plan` names each changed field
and whether `up` applies it in place; what `up` did not apply stays pending in the kept spec."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.app import planning
from infra.cli import commands, loading
from infra.core import drift
from tests.classroom_owner import owner_cluster


def test_plan_shows_each_changed_field_and_whether_up_applies_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, "  max_job_hours: 2\n")
    drift.keep(loading.resolve(None, str(spec)), None, running_before=False)
    commands.plan(None, str(spec), False)
    assert "the spec changed" not in capfd.readouterr().out

    spec.write_text(spec.read_text().replace("max_job_hours: 2", "max_job_hours: 3")
                    + "metrics: prometheus\n")
    commands.plan(None, str(spec), False)
    out = capfd.readouterr().out
    assert "the spec changed since the last `invoke up` of this running cluster:" in out, out
    assert "sharing.max_job_hours: 2.0 -> 3.0 (up applies it)" in out, out
    assert ('metrics: "none" -> "prometheus" (needs a new cluster: `invoke teardown`, then '
            "`invoke up`)") in out, out
    commands.plan(None, str(spec), True)
    shown = json.loads(capfd.readouterr().out)["spec_changes"]
    assert {(c["field"], c["applied"]) for c in shown} == {("sharing.max_job_hours", True),
                                                           ("metrics", False)}


def test_what_up_did_not_apply_stays_pending(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, "  max_job_hours: 2\n")
    drift.keep(loading.resolve(None, str(spec)), None, running_before=False)
    before = drift.read_applied("class")
    spec.write_text(spec.read_text().replace("max_job_hours: 2", "max_job_hours: 3")
                    + "metrics: prometheus\n")
    changed = loading.resolve(None, str(spec))
    # `up` on the running cluster: the gateway's new config is in effect, metrics are not.
    drift.keep(changed, before, running_before=True)
    assert [(c.field, c.applied) for c in drift.changes(drift.read_applied("class"), changed)] == \
        [("metrics", False)]
    # A new cluster (`teardown`, then `up`): everything is in effect.
    drift.keep(changed, drift.read_applied("class"), running_before=False)
    assert drift.changes(drift.read_applied("class"), changed) == []



def test_plan_does_not_call_a_change_up_left_pending_no_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """`up` on a running cluster keeps what it rendered, `metrics` lines included, though the
    running head has none: the rendered files then match, and plan must not end "no changes"."""
    spec = owner_cluster(tmp_path, monkeypatch, "  max_job_hours: 2\n")
    drift.keep(loading.resolve(None, str(spec)), None, running_before=False)
    spec.write_text(spec.read_text() + "metrics: prometheus\n")
    commands.plan(None, str(spec), False)
    planning.keep_applied("class")  # what `up` does after it ran, whatever it could not apply
    capfd.readouterr()
    commands.plan(None, str(spec), False)
    out = capfd.readouterr().out
    assert 'metrics: "none" -> "prometheus" (needs a new cluster' in out, out
    assert "no changes since the last `invoke up`" not in out, out
    assert "does not have the changes above that need a new cluster" in out, out


def test_up_on_a_running_local_cluster_starts_no_daemon_the_spec_added_since(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`metrics: prometheus` added to a running local cluster: `up` says it needs a new cluster,
    so it must not start Prometheus beside a head that was started without it (the report then
    read it while plan said metrics were "none"); a daemon the head had comes back if it died."""
    from infra import providers

    spec = owner_cluster(tmp_path, monkeypatch, "  max_job_hours: 2\n")
    drift.keep(loading.resolve(None, str(spec)), None, running_before=False)
    spec.write_text(spec.read_text() + "metrics: prometheus\ntracking: mlflow\n")
    added = providers.create(loading.resolve(None, str(spec)))
    assert not added.as_started("metrics") and not added.as_started("tracking")
    assert added.as_started("sharing")
    drift.keep(loading.resolve(None, str(spec)), None, running_before=False)  # a new head
    assert added.as_started("metrics") and added.as_started("tracking")
