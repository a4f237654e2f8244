"""Issue 49: the roster never undoes the instructor, one person is one row, dates read one way
(defects 1, 3, 4, 11, 12). On the owner's machine without a cluster (tests/classroom_owner.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infra.cli import sharing as commands_sharing
from infra.cli import term as commands_term
from infra.core.errors import UsageError
from infra.core.sharing import term as sharing_term
from infra.node import gateway_state
from tests.classroom_owner import book, owner_cluster, registry


def _roster(folder: Path, text: str) -> Path:
    path = folder / "roster.csv"
    path.write_text(text)
    return path


def _token(folder: Path) -> str:
    return (folder / "ray-token").read_text()


def test_term_record_defect1_a_roster_skips_and_names_a_removed_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    roster = _roster(tmp_path, "name\nalice\nbob\n")
    commands_term.member_add_roster(None, str(spec), str(roster), "folders", None, False)
    old = _token(tmp_path / "folders" / "class-bob")
    commands_sharing.member_remove(None, str(spec), "bob", False)
    roster.write_text("name\nalice\nbob\nerin\n")
    capfd.readouterr()
    # bob's old folder is still in --out: the run neither fails nor brings him back.
    commands_term.member_add_roster(None, str(spec), str(roster), "folders", None, False)
    out = capfd.readouterr().out
    assert "added erin" in out and "re-added bob" not in out
    assert "skipped bob: removed" in out and "--readd --cluster=class.yaml" in out
    assert "bob" not in book()["members"] and _token(tmp_path / "folders" / "class-bob") == old
    assert gateway_state.Members(registry()).lookup(old) is None
    commands_sharing.members(None, str(spec), True)
    rows = json.loads(capfd.readouterr().out)["members"]
    assert [(r["name"], r["status"]) for r in rows if r["name"] == "bob"] == [("bob", "removed")]


def test_term_record_defect1_readd_refreshes_that_persons_folder_keeping_their_files(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    roster = _roster(tmp_path, "name\nbob\n")
    commands_term.member_add_roster(None, str(spec), str(roster), "folders", None, False)
    folder = tmp_path / "folders" / "class-bob"
    old = _token(folder)
    (folder / "train.py").write_text("print('mine')\n")
    commands_sharing.member_remove(None, str(spec), "bob", False)
    capfd.readouterr()
    commands_term.member_add_roster(None, str(spec), str(roster), "folders", None, False,
                                    readd=True)
    assert "re-added bob (member)" in capfd.readouterr().out
    new = _token(folder)
    assert new != old and (folder / "train.py").read_text() == "print('mine')\n"
    bundle = json.loads((folder / "class-bob.rayfleet.json").read_text())
    assert bundle["token"] == new
    found = gateway_state.Members(registry()).lookup(new)
    assert found is not None and found.name == "bob"


def test_term_record_defect1_a_folder_of_another_person_is_refused_in_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    with pytest.raises(UsageError) as caught:
        commands_sharing.member_add(None, str(spec), "carol", False, None, "class-alice")
    said = str(caught.value)
    assert "\n" not in said and "holds 'alice'" in said and "class-alice" in said
    assert "carol" not in book()["members"]


def test_term_record_defect1_an_expired_member_on_the_roster_is_named_not_renewed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "carol", False, None, None)
    commands_term.member_update(None, str(spec), "carol", "2020-01-01", None)
    capfd.readouterr()
    commands_term.member_add_roster(None, str(spec), str(_roster(tmp_path, "name\ncarol\n")),
                                    "x", None, False)
    out = capfd.readouterr().out
    assert "expired carol (on 2020-01-01 23:59 UTC), not renewed" in out
    assert "`invoke member-update carol --expires DATE --cluster=class.yaml`" in out
    assert book()["members"]["carol"]["expires"] == "2020-01-02T00:00:00+00:00"


def test_term_record_defect4_roster_hints_carry_the_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "carol", False, None, None)
    capfd.readouterr()
    commands_term.member_add_roster(None, str(spec),
                                    str(_roster(tmp_path, "name,expires\ncarol,2031-12-18\n")),
                                    None, None, False)
    out = capfd.readouterr().out
    assert "`invoke member-update carol --expires 2031-12-18 --cluster=class.yaml` applies" in out


def test_term_record_defect12_dates_read_one_way_and_a_past_expiry_warns(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    assert sharing_term.shown("2026-11-28T00:00:00+00:00") == "2026-11-27 23:59 UTC"
    assert sharing_term.shown("2026-11-27T17:30:05+01:00") == "2026-11-27 16:30 UTC"
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "dan", False, None, None)
    capfd.readouterr()
    commands_term.member_update(None, str(spec), "dan", "2020-03-04", None)
    said = capfd.readouterr()
    assert "access until 2020-03-04 23:59 UTC" in said.out
    assert "in the past" in said.err + said.out
    commands_sharing.members(None, str(spec), True)
    row = json.loads(capfd.readouterr().out)["members"][0]
    assert row["expires"] == "2020-03-05T00:00:00+00:00"  # JSON: ISO 8601, as stored


def test_term_record_defect3_11_one_person_one_row_narrow_and_formatted(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, "  member_budget_hours: 20\n")
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    first = book()["members"]["bob"]
    commands_sharing.member_remove(None, str(spec), "bob", False)
    commands_sharing.member_add(None, str(spec), "bob", False, None, "again")
    second = book()["members"]["bob"]
    start = 1_900_000_000_000.0
    usage = {"jobs": {"a": {"member": "bob", "member_id": first["id"], "status": "SUCCEEDED",
                            "start_time": start, "end_time": start + 3.6e6 * 4, "cost": 0.0},
                      "b": {"member": "bob", "member_id": second["id"], "status": "SUCCEEDED",
                            "start_time": start, "end_time": start + 3.6e6 * 12, "cost": 0.0}},
             "members": {}, "cluster": {}}
    (registry().parent / gateway_state.USAGE_FILE).write_text(json.dumps(usage))
    monkeypatch.setenv("COLUMNS", "250")
    capfd.readouterr()
    commands_sharing.members(None, str(spec), False)
    lines = capfd.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 100, lines
    rows = [line for line in lines if line.startswith("bob ")]
    assert len(rows) == 1 and "16.00 h" in rows[0] and "$0.00" in rows[0]
    assert "80% of 20 h" in rows[0]  # the budget carries over the removal and re-add
    nested = lines[lines.index(rows[0]) + 1]
    assert nested.startswith("  └ added ") and "removed" in nested and "re-added" in nested
