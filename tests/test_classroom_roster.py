"""A term's members on the owner's machine, without a cluster (tests/classroom_owner.py): the
roster, `member-update`, `sharing.ends`, removed and expired members in `members`, budgets, and
what the gateway reads of it all (its own reader, gateway_state.Members, on the same file)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import pytest

from infra.cli import loading
from infra.cli import sharing as commands_sharing
from infra.cli import term as commands_term
from infra.core.errors import SpecError, UsageError
from infra.core.sharing import owner as sharing
from infra.core.sharing import term as sharing_term
from infra.node import gateway_config, gateway_state
from tests.classroom_owner import book, owner_cluster, registry


def _token(folder: Path) -> str:
    return (folder / "ray-token").read_text()


def _gateway_sees(token: str) -> gateway_state.Member | None:
    return gateway_state.Members(registry()).lookup(token)


def _roster(folder: Path, text: str) -> Path:
    path = folder / "roster.csv"
    path.write_text(text)
    return path


def test_roster_adds_each_member_once_with_a_folder_and_a_second_run_changes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    roster = _roster(tmp_path, "name,role,expires\nalice,,\nbob,admin,2030-06-01\n\ncarl,member,\n")
    commands_term.member_add_roster(None, str(spec), str(roster), "term", 10.0, False)
    first = capfd.readouterr().out
    assert "added alice (member)" in first and "added bob (admin)" in first
    assert "roster: 3 added, 0 unchanged" in first
    tokens = {n: _token(tmp_path / "term" / f"class-{n}") for n in ("alice", "bob", "carl")}
    entries = book()["members"]
    assert entries["bob"]["expires"] == "2030-06-02T00:00:00+00:00"  # the end of that day, UTC
    # An empty cell takes the default: role member, expiry --expires-days from now.
    assert entries["alice"]["role"] == "member"
    alice_ends = dt.datetime.fromisoformat(entries["alice"]["expires"])
    assert dt.timedelta(days=9.9) < alice_ends - dt.datetime.now(dt.timezone.utc) \
        < dt.timedelta(days=10.1)
    for name, token in tokens.items():
        found = _gateway_sees(token)
        assert found is not None and found.name == name, name

    before = registry().read_bytes()
    commands_term.member_add_roster(None, str(spec), str(roster), "term", 10.0, False)
    again = capfd.readouterr().out
    assert "roster: 0 added, 3 unchanged" in again and "unchanged bob (same token)" in again
    assert {n: _token(tmp_path / "term" / f"class-{n}") for n in tokens} == tokens
    assert json.loads(registry().read_bytes())["members"] == json.loads(before)["members"]


def test_a_roster_row_that_differs_says_how_to_apply_it_and_keeps_the_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    token = _token(tmp_path / "class-alice")
    roster = _roster(tmp_path, "name,role,expires\nalice,admin,\n")
    commands_term.member_add_roster(None, str(spec), str(roster), None, 30.0, False)
    out = capfd.readouterr().out
    # An empty expires cell takes the default, which is no change of theirs to report.
    assert "unchanged alice" in out
    assert "`invoke member-update alice --role admin --cluster=class.yaml` applies" in out
    roster.write_text("name,role,expires\nalice,member,2031-01-01\n")
    commands_term.member_add_roster(None, str(spec), str(roster), None, None, False)
    out = capfd.readouterr().out
    assert "`invoke member-update alice --expires 2031-01-01 --cluster=class.yaml` applies" in out
    found = _gateway_sees(token)
    assert found is not None and found.role == "member"


@pytest.mark.parametrize(("text", "expected"), [
    ("name,email\nalice,a@x\n", "column 'email' is not one of name, role, expires"),
    ("alice,member\n", "the first line must name the columns"),
    ("name,role\nalice,teacher\n", "line 2: role 'teacher': give member or admin"),
    ("name,expires\nalice,next friday\n", "line 2: expires 'next friday': give a date"),
    ("name\nalice\nAlice Smith\n", "line 3: name 'Alice Smith'"),
    ("name\nalice\nbob\nalice\n", "line 4: 'alice' is already on line 2"),
    ("name,role\n", "no members listed"),
    ("name,role\nalice,member,2030-01-01\n", "3 cells for 2 columns"),
])
def test_a_bad_roster_is_one_line_and_nothing_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, expected: str) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "zed", False, None, None)
    before = registry().read_bytes()
    roster = _roster(tmp_path, text)
    with pytest.raises(UsageError) as refused:
        commands_term.member_add_roster(None, str(spec), str(roster), "term", None, False)
    assert expected in str(refused.value) and "\n" not in str(refused.value), refused.value
    assert str(roster) in str(refused.value)
    assert registry().read_bytes() == before and not (tmp_path / "term").exists()


def test_a_roster_whose_new_member_has_a_folder_already_writes_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    (tmp_path / "term" / "class-bob").mkdir(parents=True)
    roster = _roster(tmp_path, "name\nalice\nbob\n")
    with pytest.raises(UsageError, match="class-bob: it exists"):
        commands_term.member_add_roster(None, str(spec), str(roster), "term", None, False)
    assert not (tmp_path / "term" / "class-alice").exists() and book()["members"] == {}


def test_member_update_changes_role_and_expiry_keeping_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, 1.0, None)
    token = _token(tmp_path / "class-alice")
    digest = book()["members"]["alice"]["token_sha256"]
    commands_term.member_update(None, str(spec), "alice", "2031-03-04T10:00:00+01:00", "admin")
    assert "same token" in capfd.readouterr().out
    entry = book()["members"]["alice"]
    assert entry["token_sha256"] == digest and entry["expires"] == "2031-03-04T09:00:00+00:00"
    found = _gateway_sees(token)
    assert found is not None and found.role == "admin" and found.sees_all
    assert not gateway_state.expired(found)
    # Past: the gateway's own check refuses the member from their next request on.
    commands_term.member_update(None, str(spec), "alice", "2020-01-01", None)
    found = _gateway_sees(token)
    assert found is not None and gateway_state.expired(found)
    commands_term.member_update(None, str(spec), "alice", "never", None)
    found = _gateway_sees(token)
    assert found is not None and found.expires is None


@pytest.mark.parametrize(("args", "expected"), [
    (("nobody", "2030-01-01", None), "no member 'nobody'"),
    (("alice", None, None), "nothing to change"),
    (("alice", None, "owner"), "--role 'owner': give member or admin"),
    (("alice", "soon", None), "--expires 'soon'"),
])
def test_member_update_refuses_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           args: tuple[Any, ...], expected: str) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    before = registry().read_bytes()
    with pytest.raises(UsageError) as refused:
        commands_term.member_update(None, str(spec), *args)
    assert expected in str(refused.value) and "\n" not in str(refused.value)
    assert registry().read_bytes() == before


def test_sharing_ends_caps_every_member_and_follows_the_spec_at_the_next_up(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, "  ends: 2030-01-31\n")
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)  # no own expiry
    commands_sharing.member_add(None, str(spec), "bob", False, 3.0, None)  # earlier than ends
    members = book()["members"]
    assert members["alice"]["expires"] == "2030-02-01T00:00:00+00:00"
    assert members["bob"]["expires"] == members["bob"]["member_expires"] != "2030-02-01T00:00:00+00:00"
    token = _token(tmp_path / "class-alice")
    # The term is cut short: the next `up` writes the new end into what the gateway reads.
    spec.write_text(spec.read_text().replace("ends: 2030-01-31", "ends: 2020-01-31T12:00:00Z"))
    assert sharing.apply_term(loading.resolve(None, str(spec)))
    found = _gateway_sees(token)
    assert found is not None and found.expires == "2020-01-31T12:00:00+00:00"
    assert gateway_state.expired(found)
    # And lengthened again: each member's own expiry comes back, not the old end.
    spec.write_text(spec.read_text().replace("ends: 2020-01-31T12:00:00Z", ""))
    assert sharing.apply_term(loading.resolve(None, str(spec)))
    assert book()["members"]["alice"]["expires"] is None
    assert book()["members"]["bob"]["expires"] == book()["members"]["bob"]["member_expires"]
    assert not sharing.apply_term(loading.resolve(None, str(spec)))  # nothing to change


def _usage(jobs: dict[str, dict[str, Any]], accrued: float = 0.0) -> None:
    path = sharing.folder("class") / gateway_state.USAGE_FILE
    path.write_text(json.dumps({"jobs": jobs, "members": {},
                                "cluster": {"accrued_usd": accrued, "hourly_usd": 1.0}}))


def _ms(when: str) -> float:
    return dt.datetime.fromisoformat(when).timestamp() * 1000


def test_removed_and_expired_members_stay_in_members_marked_with_their_usage(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    commands_sharing.member_add(None, str(spec), "erin", False, None, None)
    old_token = _token(tmp_path / "class-bob")
    bob = book()["members"]["bob"]
    start = _ms(bob["added"]) + 1000
    _usage({"j1": {"member": "bob", "member_id": bob["id"], "status": "SUCCEEDED",
                   "start_time": start, "end_time": start + 2 * 3.6e6, "cost": 1.5}})
    commands_sharing.member_remove(None, str(spec), "bob", False)
    assert _gateway_sees(old_token) is None  # the gateway reads no removed member
    assert "token_sha256" not in json.dumps(book()["removed"])
    commands_term.member_update(None, str(spec), "erin", "2020-01-01", None)
    capfd.readouterr()
    commands_sharing.members(None, str(spec), True)
    rows = {r["name"]: r for r in json.loads(capfd.readouterr().out)["members"]}
    assert rows["bob"]["status"] == "removed" and rows["bob"]["removed"]
    assert rows["bob"]["job_hours"] == pytest.approx(2.0) and rows["bob"]["cost_share_usd"] == 1.5
    assert rows["erin"]["status"] == "expired"
    commands_sharing.members(None, str(spec), False)
    table = capfd.readouterr().out
    assert "removed 20" in table and "expired" in table


def test_a_name_added_again_gets_a_new_token_and_each_entry_keeps_its_own_jobs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    old_token = _token(tmp_path / "class-bob")
    commands_sharing.member_remove(None, str(spec), "bob", False)
    # The roster brings bob back: a new token, the old one still refused.
    commands_term.member_add_roster(None, str(spec), str(_roster(tmp_path, "name\nbob\n")),
                                    "again", None, False, readd=True)
    assert "re-added bob" in capfd.readouterr().out
    new_token = _token(tmp_path / "again" / "class-bob")
    assert new_token != old_token and _gateway_sees(old_token) is None
    assert _gateway_sees(new_token) is not None
    first, second = book()["removed"][0], book()["members"]["bob"]
    assert first["id"] != second["id"]  # another member under the same name
    _usage({"old": {"member": "bob", "member_id": first["id"], "status": "SUCCEEDED",
                    "cost": 2.0, "start_time": _ms("2026-01-01T01:00:00+00:00"),
                    "end_time": _ms("2026-01-01T04:00:00+00:00")},
            "new": {"member": "bob", "member_id": second["id"], "status": "PENDING",
                    "cost": 0.0}})
    capfd.readouterr()
    commands_sharing.members(None, str(spec), True)
    rows = json.loads(capfd.readouterr().out)["members"]
    # One person, one row: both entries' jobs, the history nested (tests/test_term_record_*).
    assert [(r["name"], r["status"], r["total_jobs"]) for r in rows] == [("bob", "active", 2)]
    assert [e["event"] for e in rows[0]["history"]] == ["added", "removed", "re-added"]
    assert rows[0]["job_hours"] == pytest.approx(3.0) and rows[0]["cost_share_usd"] == 2.0
    # Each entry keeps its own jobs (the gateway's ids): the rows per entry tell them apart.
    entries = sharing_term.rows_of(book(), {}, sharing.job_records(json.loads(
        (sharing.folder("class") / gateway_state.USAGE_FILE).read_text())), None)
    assert [(r["status"], r["total_jobs"]) for r in entries] == [("removed", 1), ("active", 1)]


def test_the_owners_own_entry_and_unknown_fields_are_kept_and_it_is_no_member(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """The gateway's registry may hold the owner's own credential (role owner) and fields or
    sections this version does not know: every member verb keeps them as they are."""
    spec = owner_cluster(tmp_path, monkeypatch)
    owner = {"role": "owner", "token_sha256": "ab" * 32, "id": "o-1", "added": "2026-01-01"}
    own = {"token_sha256": "cd" * 32}  # the owner's own gateway token (sharing.py)
    sharing_term.write_book("class", {"members": {"prof": owner}, "owner": own,
                                      "gateway_notes": {"x": 1}})
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    entry = book()["members"]["alice"]
    entry["id"] = "m-42"
    whole = book()
    whole["members"]["alice"] = entry
    sharing_term.write_book("class", whole)
    commands_term.member_update(None, str(spec), "alice", None, "admin")
    commands_term.member_add_roster(None, str(spec), str(_roster(tmp_path, "name\nalice\ncarl\n")),
                                    None, None, False)
    commands_sharing.member_remove(None, str(spec), "carl", False)
    after = book()
    assert after["members"]["prof"] == owner and after["gateway_notes"] == {"x": 1}
    # All but the owner's own gateway token, which member-remove renews (test_gate_stands_owner_token).
    assert after["owner"] != own and set(after["owner"]) == set(own)
    assert after["members"]["alice"]["id"] == "m-42" and after["members"]["alice"]["role"] == "admin"
    capfd.readouterr()
    commands_sharing.members(None, str(spec), True)
    names = [r["name"] for r in json.loads(capfd.readouterr().out)["members"]]
    assert names == ["alice", "carl"]
    for refused in (lambda: commands_sharing.member_remove(None, str(spec), "prof", False),
                    lambda: commands_term.member_update(None, str(spec), "prof", None, "member"),
                    lambda: commands_sharing.member_add(None, str(spec), "prof", False, None, None)):
        with pytest.raises(UsageError):
            refused()
    assert book()["members"]["prof"] == owner


#: What takes a cluster down at its budget.
AUTODOWN = "autodown: {idle_minutes: 30}\n"


def test_a_cluster_budget_without_autodown_is_refused_naming_both(tmp_path: Path) -> None:
    spec = tmp_path / "term.yaml"
    spec.write_text("provider: local\nsharing:\n  members_run_as_owner: true\n  budget_usd: 5\n")
    with pytest.raises(SpecError) as refused:
        loading.resolve(None, str(spec))
    said = str(refused.value)
    assert "sharing.budget_usd" in said and "add `autodown: {idle_minutes:" in said, said
    assert "\n" not in said
    spec.write_text(AUTODOWN + spec.read_text())
    assert loading.resolve(None, str(spec)).sharing.budget_usd == 5  # type: ignore[union-attr]


@pytest.mark.parametrize(("block", "expected"), [
    ("  member_budget_hours: 0", "sharing.member_budget_hours"),
    ("  member_budget_usd: -5", "sharing.member_budget_usd"),
    ("  budget_usd: lots", "sharing.budget_usd"),
    ("  ends: someday", "is not a date like 2026-12-18"),
    ("  budget_dollars: 5", "did you mean 'budget_usd'"),
])
def test_term_fields_are_validated(tmp_path: Path, block: str, expected: str) -> None:
    spec = tmp_path / "term.yaml"
    spec.write_text(f"provider: local\nsharing:\n  members_run_as_owner: true\n{block}\n")
    with pytest.raises(SpecError) as refused:
        loading.resolve(None, str(spec))
    assert expected in str(refused.value) and "\n" not in str(refused.value), refused.value


def test_budgets_show_in_members_and_status_and_warn_from_80_percent(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    from infra.cli import commands

    spec = owner_cluster(tmp_path, monkeypatch, "  member_budget_hours: 10\n"
                                                "  member_budget_usd: 4\n  budget_usd: 20\n",
                         top=AUTODOWN)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    ids = {name: entry["id"] for name, entry in book()["members"].items()}
    start = _ms(book()["members"]["alice"]["added"]) + 1000
    _usage({"a": {"member": "alice", "member_id": ids["alice"], "status": "SUCCEEDED",
                  "cost": 1.0, "start_time": start, "end_time": start + 8.5 * 3.6e6},
            "b": {"member": "bob", "member_id": ids["bob"], "status": "SUCCEEDED", "cost": 1.0,
                  "start_time": start, "end_time": start + 1 * 3.6e6}}, accrued=17.0)
    capfd.readouterr()
    commands_sharing.members(None, str(spec), True)
    answer = json.loads(capfd.readouterr().out)
    rows = {r["name"]: r for r in answer["members"]}
    assert rows["alice"]["budget_used"] == pytest.approx(0.85)  # hours: the larger share
    assert rows["bob"]["budget_used"] == pytest.approx(0.25)  # dollars: $1 of $4
    assert answer["cluster_budget"] == {"budget_usd": 20.0, "accrued_usd": 17.0, "used": 0.85,
                                        "reached_at": None}
    commands_sharing.members(None, str(spec), False)
    shown = capfd.readouterr()
    assert "85%" in shown.out
    warned = [line for line in shown.err.splitlines() if "budget" in line]
    assert any("member alice has used 85% of their budget (8.50 of 10 job-hours, $1.00 of $4)"
               in line for line in warned), shown.err
    assert not any("bob" in line for line in warned)
    assert any("cluster budget: $17.00 of $20 (85%" in line for line in warned)
    # No Ray here (the state only says a head was started): status says so, after its lines.
    with pytest.raises(commands.RayNotAnsweringError):
        commands.status(None, str(spec), False)
    status = capfd.readouterr()
    assert "cluster budget: $17.00 of $20" in status.err and "member alice has used 85%" in status.err
    assert "bob" not in status.err
    # At 100 % (the gateway recorded the moment and stopped every job): said as such.
    path = sharing.folder("class") / gateway_state.USAGE_FILE
    spent = json.loads(path.read_text())
    spent["cluster"].update(accrued_usd=20.5, budget_reached_at="2026-11-27T10:00:00+00:00")
    path.write_text(json.dumps(spent))
    commands_sharing.members(None, str(spec), False)
    said = capfd.readouterr().err
    assert ("cluster budget: $20.50 of $20 (102%, estimate): spent; the gateway stopped every "
            "job and takes no new one, and autodown takes the idle cluster down") in said, said


def test_the_gateway_config_carries_the_budgets(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch, "  member_budget_hours: 10\n"
                                                "  member_budget_usd: 4\n  budget_usd: 20\n",
                         top=AUTODOWN)
    from infra import providers
    from infra.core import state

    selected = loading.resolve(None, str(spec))
    current = state.read("class")
    assert current is not None
    impl = providers.create(selected)
    config, path = sharing.gateway_settings(selected, impl.head_access(current), current,
                                            "127.0.0.1")
    assert (config.member_budget_hours, config.member_budget_usd, config.budget_usd) == \
        (10.0, 4.0, 20.0)
    gateway_config.write_config(path, config)
    assert gateway_config.read_config(path).budget_usd == 20.0
    # Without budgets: None, the gateway's "no limit".
    plain = gateway_config.Config("c", "h", 1, "u", None, "c", "k", "d")
    assert (plain.member_budget_hours, plain.member_budget_usd, plain.budget_usd) == \
        (None, None, None)


def test_plan_names_the_gateway_and_its_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capfd: pytest.CaptureFixture[str]) -> None:
    from infra.cli import commands

    spec = owner_cluster(tmp_path, monkeypatch, "  ends: 2030-01-31\n  budget_usd: 20\n",
                         top=AUTODOWN)
    commands.plan(None, str(spec), False)
    out = capfd.readouterr().out
    line = next(line for line in out.splitlines() if "sharing:" in line)
    assert "gateway (HTTPS) on the head, port 18443" in line and "https://127.0.0.1:18443" in line
    assert "access ends 2030-01-31 23:59 UTC" in line and "cluster budget ($) 20" in line
    commands.plan(None, str(spec), True)
    assert json.loads(capfd.readouterr().out)["gateway"]["port"] == 18443


def test_entries_from_before_ids_split_one_names_jobs_by_when_they_started() -> None:
    """A registry and usage from before member ids: a name removed and added again is told
    apart by time (the later entry was added after the first one's jobs started)."""
    book_ = {"members": {"bob": {"role": "member", "added": "2026-02-01T00:00:00+00:00"}},
             sharing_term.REMOVED: [{"name": "bob", "role": "member",
                                     "added": "2026-01-01T00:00:00+00:00",
                                     "removed": "2026-01-20T00:00:00+00:00"}]}
    jobs = {"old": {"member": "bob", "status": "SUCCEEDED", "cost": 1.0,
                    "start_time": _ms("2026-01-05T00:00:00+00:00"),
                    "end_time": _ms("2026-01-05T02:00:00+00:00")},
            "new": {"member": "bob", "status": "RUNNING", "cost": 0.5,
                    "start_time": _ms("2026-02-02T00:00:00+00:00")},
            "queued": {"member": "bob", "status": "PENDING", "cost": 0.0}}
    rows = sharing_term.rows_of(book_, {"members": {}}, sharing.job_records({"jobs": jobs}), None)
    assert [(r["status"], r["total_jobs"], r["cost_share_usd"]) for r in rows] == \
        [("removed", 1, 1.0), ("active", 2, 0.5)]
    assert rows[0]["job_hours"] == pytest.approx(2.0) and rows[0]["budget_used"] is None


def test_member_bundles_brings_every_folder_to_the_new_address_with_the_same_tokens(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """After a head came back elsewhere: one command, every member's folder names the new
    address, every token still the same one the gateway accepts."""
    from infra.core import state

    spec = owner_cluster(tmp_path, monkeypatch)
    roster = _roster(tmp_path, "name,role,expires\nalice,,\nbob,,\ncarl,,\n")
    commands_term.member_add_roster(None, str(spec), str(roster), "term", None, False)
    tokens = {n: _token(tmp_path / "term" / f"class-{n}") for n in ("alice", "bob", "carl")}
    (tmp_path / "term" / "class-carl" / "class-carl.rayfleet.json").unlink()  # carl's is lost
    moved = "https://203.0.113.9:18443"
    current = state.read("class")
    assert current is not None
    current.set_info(gateway_url=moved)
    current.save()
    capfd.readouterr()
    commands_term.member_bundles(None, str(spec), str(tmp_path / "term"))
    said = capfd.readouterr()
    assert "2 member bundle(s)" in said.out and "alice, bob" in said.out
    assert "no bundle found" in said.err and "carl" in said.err
    for name in ("alice", "bob"):
        folder = tmp_path / "term" / f"class-{name}"
        bundle = json.loads((folder / f"class-{name}.rayfleet.json").read_text())
        assert bundle["address"] == moved and bundle["token"] == tokens[name]
        assert f"RAY_API_SERVER_ADDRESS={moved}" in (folder / "env.sh").read_text()
        assert _token(folder) == tokens[name]
        found = _gateway_sees(tokens[name])
        assert found is not None and found.name == name
        assert book()["members"][name]["address"] == moved


def test_a_date_the_owner_gave_reads_as_that_day_not_the_next_midnight(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """Access ends at the end of the day given, stored as the next midnight (UTC): what the owner
    reads back names the day they typed (`2026-12-05 23:59 UTC`), not 2026-12-06T00:00:00."""
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "alice", False, None, None)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    capfd.readouterr()
    commands_term.member_update(None, str(spec), "alice", "2026-12-05", None)
    commands_term.member_update(None, str(spec), "bob", "2026-12-05T17:00:00+01:00", None)
    said = capfd.readouterr().out
    assert "access until 2026-12-05 23:59 UTC;" in said, said
    assert "access until 2026-12-05 16:00 UTC;" in said, said  # an instant, to the minute
    assert book()["members"]["alice"]["expires"] == "2026-12-06T00:00:00+00:00"  # as stored
    monkeypatch.setenv("COLUMNS", "250")
    commands_sharing.members(None, str(spec), False)
    table = capfd.readouterr().out
    assert "2026-12-05 23:59 UTC" in table and "2026-12-06T00:00:00" not in table, table


def test_plan_says_a_dollar_budget_is_never_reached_on_a_cluster_that_costs_nothing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """A local (or Slurm) cluster's nodes have no price: the gateway counts $0, so an instructor's
    `member_budget_usd`/`budget_usd` there would silently never refuse anyone."""
    from infra.cli import commands

    spec = owner_cluster(tmp_path, monkeypatch, "  member_budget_hours: 10\n"
                                                "  member_budget_usd: 4\n  budget_usd: 20\n",
                         top=AUTODOWN)
    capfd.readouterr()
    commands.plan(None, str(spec), False)
    said = [line for line in capfd.readouterr().err.splitlines() if "never reached" in line]
    assert len(said) == 1 and "sharing.member_budget_usd and sharing.budget_usd" in said[0], said
    commands.plan(None, str(spec), True)
    assert json.loads(capfd.readouterr().out)["gateway"]["unpriced_budgets"] == [
        "member_budget_usd", "budget_usd"]
    spec.write_text(spec.read_text().replace("  member_budget_usd: 4\n  budget_usd: 20\n", ""))
    commands.plan(None, str(spec), False)
    assert "never reached" not in capfd.readouterr().err
