"""Issue 49: a budget is per person per term (item "budgets carry over a removal and re-add"):
the owner's `status` warns of a person near their budget from every entry of theirs. On the
owner's machine without a cluster (tests/classroom_owner.py)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from infra.cli import common
from infra.cli import sharing as commands_sharing
from infra.core.sharing import owner as sharing
from tests.classroom_owner import book, owner_cluster


def _usage(jobs: dict[str, dict]) -> None:
    path = sharing.folder("class") / "usage.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": jobs, "members": {}, "cluster": {}}))


def _hours_job(member_id: str, hours: float) -> dict:
    end = time.time() * 1000
    return {"member": "bob", "member_id": member_id, "status": "SUCCEEDED",
            "start_time": end - hours * 3.6e6, "end_time": end, "cost": 0.0}


def test_term_record_status_warns_of_a_person_near_budget_across_a_re_add(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, extra="  member_budget_hours: 1\n")
    commands_sharing.member_add(None, str(spec), "bob", False, None, str(tmp_path / "b1"))
    first = book()["members"]["bob"]["id"]
    commands_sharing.member_remove(None, str(spec), "bob", False)
    commands_sharing.member_add(None, str(spec), "bob", False, None, str(tmp_path / "b2"))
    assert book()["members"]["bob"]["id"] != first
    _usage({"raysubmit_1": _hours_job(first, 0.9)})  # all under the first entry
    selected, _ = common.select(None, str(spec))
    found = sharing.budget_status(selected, None)
    assert found is not None
    assert [(n["name"], round(n["used"], 2)) for n in found["members_near"]] == [("bob", 0.9)]


def test_term_record_owners_status_shows_the_gateway_and_the_members(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from infra.cli import commands
    from infra.cli import term as commands_term
    from tests.classroom_owner import URL

    spec = owner_cluster(tmp_path, monkeypatch, extra="  member_budget_hours: 1\n")
    for name in ("alice", "bob"):
        commands_sharing.member_add(None, str(spec), name, False, None, str(tmp_path / name))
    commands_sharing.member_remove(None, str(spec), "bob", False)
    _usage({"raysubmit_1": {**_hours_job(book()["members"]["alice"]["id"], 0.25),
                            "member": "alice"}})
    capsys.readouterr()
    commands.status(None, str(spec), True)  # nothing runs here: the members all the same
    found = json.loads(capsys.readouterr().out)["sharing"]
    assert [(p["name"], p["status"], p["total_jobs"]) for p in found["members"]] == \
        [("alice", "active", 1), ("bob", "removed", 0)]
    selected, _ = common.select(None, str(spec))
    shown = commands_term.status_sharing(selected, True)
    assert shown is not None
    commands_term.print_status_sharing(selected, shown)
    out = capsys.readouterr().out
    assert f"gateway: {URL}" in out
    assert any(line.startswith("alice") and "active" in line and "25% of 1 h" in line
               for line in out.splitlines())
    assert any(line.startswith("bob") and "removed" in line for line in out.splitlines())
