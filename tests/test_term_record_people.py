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
