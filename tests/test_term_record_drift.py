"""Issue 49, defect 6: after a spec change `up` applies in place (a shared cluster's `sharing:`),
`plan` listed the field and then said "no changes since the last `invoke up`", and `up` said
only that the cluster was running. Now plan's summary agrees with its field list and `up` says
in one line what it applied. A local spec recorded as up, no Ray (tests/classroom_owner.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.app import lifecycle, planning
from infra.cli import commands, common
from infra.core import drift, state
from infra.core.endpoint import Endpoint
from infra.core.sharing import owner as sharing
from infra.providers.local.provider import Provider
from tests.classroom_owner import owner_cluster


def _applied_at(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hours: str) -> Path:
    """The spec with member_budget_hours 20 in effect (as `up` kept it), then set to `hours`."""
    spec = owner_cluster(tmp_path, monkeypatch, extra="  member_budget_hours: 20\n")
    selected, impl = common.select(None, str(spec))
    planning.write_rendered(selected.name, impl.plan(state.read(selected.name)))
    commands.keep_applied(selected.name)
    drift.keep(selected, None, False)
    spec.write_text(spec.read_text().replace("member_budget_hours: 20", f"member_budget_hours: "
                                             f"{hours}"))
    return spec


def test_term_record_plan_says_up_applies_a_sharing_change(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _applied_at(tmp_path, monkeypatch, "0.02")
    capsys.readouterr()
    commands.plan(None, str(spec), False)
    out = capsys.readouterr().out
    assert "sharing.member_budget_hours: 20.0 -> 0.02 (up applies it)" in out
    assert "no changes since the last" not in out
    assert "`invoke up` applies the spec changes above to the running cluster" in out


def test_term_record_up_says_what_it_applied_to_the_running_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _applied_at(tmp_path, monkeypatch, "0.02")
    endpoint = Endpoint("http://127.0.0.1:26265", "127.0.0.1:26379")
    monkeypatch.setattr(Provider, "up", lambda self, current, result, options: endpoint)
    monkeypatch.setattr(Provider, "head_access", lambda self, current: None)
    monkeypatch.setattr(lifecycle, "autodown_notices", lambda *a: None)  # not this test's
    gave: list[Any] = []
    monkeypatch.setattr(sharing, "ensure_gateway",
                        lambda selected, *a: gave.append(selected.sharing) or "https://gw")
    capsys.readouterr()
    commands.up(None, str(spec), False)
    out = capsys.readouterr().out
    assert gave and gave[0].member_budget_hours == 0.02  # the gateway got the new config
    assert "applied to the running cluster: sharing.member_budget_hours 20.0 -> 0.02" in out
    capsys.readouterr()
    commands.plan(None, str(spec), False)  # applied: nothing left to say
    assert "no changes since the last `invoke up`" in capsys.readouterr().out
