"""Typed files between the laptop and a head (infra/node/wire.py) load what rayfleet 84e0693 wrote.

tests/state_files/wire/ holds one file of each kind as 84e0693's own writers wrote it (its modules,
taken with `git show 84e0693:<path>`, run with fixed inputs; a head's daemon config with the
`node_package` key infra/core/remote_head.py adds there). Their bytes are pinned in SHA256SUMS.
The gateway's members file: 84e0693's `owner.new_member` for alice, bob (30 days) and carol (admin,
ids and tokens fixed: token `a1`*32 is alice's, `c3`*32 carol's, `b2`*32 bob's), `term.apply_ends`
at 2026-12-20, `term.remove` of bob, the owner's token `d4`*32, `term.write_book`. Its usage file:
84e0693's `gateway_state.Usage` (its `now_iso` fixed) given two member jobs noted as its
gateway_jobs noted a submit, a job of the owner's, a tick, an upload, a stop noted as its
gateway_stops did, and the budget reached, then `save`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from infra.core.autodown import view as autodown_view
from infra.core.sharing import term as sharing_term
from infra.node import autodown, autodown_marker, metrics, tracking, wire
from infra.node import gateway_files as gf
from infra.node import gateway_state as gs
from infra.node.gcp_tpu import joiner
from infra.node.slurm.info import Info
from infra.providers.slurm.ours import KEPT

FILES = Path(__file__).parent.parent / "state_files" / "wire"
PACKAGE = "rayfleet-node-3f2a9c1d.zip"
ALICE, BOB, CAROL = "0a1ce0000000000a", "0b0b0000000000bb", "0ca70000000000cc"

#: file -> (its dataclass, fields read back by attribute with the values 84e0693 wrote).
SAMPLES: dict[str, tuple[type[wire.Wire], dict[str, Any]]] = {
    "autodown-config-84e0693.json": (autodown.Config, {
        "cluster": "lam1", "cluster_id": "c-7f3e2a", "idle_minutes": 20.0,
        "action": "infra.node.lambda_cloud.autodown:remove", "token_path": "~/.rayfleet/ray-token",
        "poll_s": None, "extra": {"node_package": PACKAGE}}),
    "slurm-autodown-config-84e0693.json": (autodown.Config, {
        "cluster": "slu1", "marker": "/tmp/rf-4711/autodown-marker.json",
        "dashboard_url": "http://127.0.0.1:41001", "poll_s": None, "extra": {}}),
    "autodown-marker-84e0693.json": (autodown_marker.Marker, {
        "cluster": "lam1", "cluster_id": "c-7f3e2a", "phase": "removed", "idle_minutes": 20.0,
        "detail": "idle", "error": None, "interval_s": 30.0, "watcher_running": None}),
    "slurm-info-84e0693.json": (Info, {
        "phase": "ready", "job_id": "4711", "head_node": "node01", "head_ip": "10.0.0.7",
        "port_base": 41000, "gcs_port": 41000, "dashboard_port": 41001,
        "address": "10.0.0.7:41000", "dashboard_url": "http://127.0.0.1:41001",
        "prometheus": "/usr/bin/prometheus", "ray_version": "2.60.0", "ready_at": 1764370031.5}),
    "joiner-config-84e0693.json": (joiner.Config, {
        "cluster": "tpu1", "project": "my-project", "head_address": "10.128.0.2:6379",
        "ssh_user": "ubuntu", "ssh_key": "~/ray_bootstrap_key.pem", "poll_s": 5,
        "token_path": "~/.rayfleet/ray-token", "tracking_user": "rayfleet", "max_attempts": None,
        "credentials_file": None, "extra": {"node_package": PACKAGE}}),
    "tracking-config-84e0693.json": (tracking.ServerConfig, {
        "host": "10.0.0.5", "port": 5000, "store_dir": "/home/ubuntu/.rayfleet/mlflow",
        "log_path": "/home/ubuntu/.rayfleet/mlflow.log", "extra": {"node_package": PACKAGE}}),
    "metrics-config-84e0693.json": (metrics.PrometheusConfig, {
        "port": 9090, "retention_days": 7, "retention_size_mb": 300, "scrape_interval_s": 10,
        "storage_dir": "/home/ubuntu/.rayfleet/prometheus/tsdb"}),
    "gateway-members-84e0693.json": (gf.MembersFile, {
        "owner": gf.OwnerEntry(token_sha256=gs.token_hash("d4" * 32)), "extra": {}}),
    "gateway-usage-84e0693.json": (gf.UsageFile, {
        "members": {"alice": gf.Seen(last_seen="2026-11-28T12:00:00+00:00")},
        "cluster": gf.ClusterUsage(hourly_usd=2.4, accrued_usd=2.4, owner_usd=1.3333333333333333,
                                   idle_usd=0.0, budget_reached_at="2026-11-28T12:00:00+00:00"),
        "uploads": {ALICE: 4096}, "packages": {}, "extra": {}}),
}


def _raw(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((FILES / name).read_text())
    return data


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_file_84e0693_wrote_loads_as_version_0_with_its_values(name: str) -> None:
    kind, expected = SAMPLES[name]
    loaded = kind.from_json((FILES / name).read_text())
    assert isinstance(loaded, kind)
    assert loaded.version == 0  # written before files had versions
    assert {field: getattr(loaded, field) for field in expected} == expected


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_round_trip_keeps_every_key_and_value(name: str) -> None:
    kind, _ = SAMPLES[name]
    raw = _raw(name)
    loaded = kind.from_dict(raw)
    written = loaded.to_dict()
    assert {key: written[key] for key in raw} == raw  # the unknown `node_package` included
    assert kind.from_json(loaded.to_json()) == loaded


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_a_newer_file_with_a_key_this_version_does_not_know_loads_and_keeps_it(name: str) -> None:
    kind, expected = SAMPLES[name]
    newer = {**_raw(name), "version": 7, "from_a_newer_rayfleet": {"kept": [1, 2]}}
    loaded = kind.from_dict(newer)
    assert loaded.version == 7
    assert {f: getattr(loaded, f) for f in expected if f != "extra"} == {
        f: v for f, v in expected.items() if f != "extra"}
    assert loaded.to_dict()["from_a_newer_rayfleet"] == {"kept": [1, 2]}


def test_a_file_without_a_field_its_kind_needs_is_one_line_naming_it() -> None:
    raw = _raw("slurm-info-84e0693.json")
    del raw["head_ip"]
    with pytest.raises(wire.WireError) as caught:
        Info.from_dict(raw)
    message = str(caught.value)
    assert "\n" not in message and "Slurm's info file" in message and "'head_ip'" in message
    with pytest.raises(wire.WireError, match="expected a JSON object"):
        autodown.Config.from_json("[1, 2]")


def test_what_this_version_writes_says_its_version() -> None:
    config = autodown.Config.from_json((FILES / "autodown-config-84e0693.json").read_text())
    fresh = autodown.Config(cluster="c", cluster_id="i", idle_minutes=5, dashboard_url="u",
                            marker="m", action="a:b")
    assert json.loads(autodown.config_text(fresh))["version"] == wire.VERSION == 1
    assert "extra" not in json.loads(autodown.config_text(config))


def test_the_laptop_reads_84e0693s_marker_and_caches_a_newer_ones_unknown_keys(
        rf_home: Path) -> None:
    text = (FILES / "autodown-marker-84e0693.json").read_text()
    report = autodown_view.decide(autodown_view.cache_marker("lam1", text, "c-7f3e2a"), 20.0,
                                  left=False, last_word_may_be_lost=True)
    assert report is not None and report.removed_at == _raw(
        "autodown-marker-84e0693.json")["removed_at"]
    newer = json.dumps({**json.loads(text), "version": 2, "reason_code": "idle"})
    assert autodown_view.cache_marker("lam1", newer, "c-7f3e2a") is not None
    cached = json.loads(autodown_view.marker_path("lam1").read_text())
    assert cached["reason_code"] == "idle" and cached["version"] == 2
    running = autodown_view.with_watcher_status(newer, {"running": True})
    assert running is not None and json.loads(running)["reason_code"] == "idle"


def test_slurms_info_file_gives_the_job_record_what_84e0693s_did() -> None:
    raw = _raw("slurm-info-84e0693.json")
    facts = Info.from_dict(raw).facts(KEPT)
    assert facts == {k: raw[k] for k in KEPT if k in raw}
    starting = {k: v for k, v in raw.items() if k not in (
        "nodes", "ready_at", "timeline", "ray_version", "python_version", "prometheus")}
    assert Info.from_dict(starting).facts(KEPT) == {k: starting[k] for k in KEPT if k in starting}


def test_the_joiners_config_gives_it_the_slices_84e0693_asked_for() -> None:
    config = joiner.Config.from_json((FILES / "joiner-config-84e0693.json").read_text())
    (name, request), = config.requests().items()
    assert (name, request.accelerator_type, request.config, request.zones, request.count) == (
        "train", "v4-8", ("v4", "2x2x1"), ["us-central2-b", "us-central2-a"], 2)
    assert config.start_commands and "guard.sh" in config.start_commands[0]


def test_the_samples_are_as_captured() -> None:
    """They prove compatibility only while nobody rewrites them: their bytes are pinned."""
    pinned = dict(line.split()[::-1] for line in (FILES / "SHA256SUMS").read_text().splitlines())
    assert pinned == {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                      for path in sorted(FILES.glob("*.json"))}
    assert set(pinned) == set(SAMPLES)


def test_the_gateway_admits_by_84e0693s_members_file(tmp_path: Path) -> None:
    """Who the gateway lets in, from the registry 84e0693's `member-*` verbs wrote: the members
    with their ids and roles, the owner's own token, a removed member named; nothing else."""
    path = tmp_path / gs.MEMBERS_FILE
    path.write_bytes((FILES / "gateway-members-84e0693.json").read_bytes())
    members = gs.Members(path)
    assert members.lookup("a1" * 32) == gs.Member("alice", "member",
                                                   "2026-12-20T00:00:00+00:00", ALICE)
    assert members.lookup("c3" * 32) == gs.Member("carol", "admin",
                                                   "2026-12-20T00:00:00+00:00", CAROL)
    assert members.lookup("d4" * 32) == gs.OWNER
    assert members.lookup("b2" * 32) is None  # removed (84e0693 dropped the hash)
    assert [(g.name, g.id, g.removed) for g in members.gone().entries] == [
        ("bob", BOB, "2026-11-27T09:30:00+00:00")]
    assert members.named("carol") == members.lookup("c3" * 32) and members.named("bob") is None
    assert members.ids() == {ALICE, CAROL, gs.OWNER_ID}


def test_the_gateway_goes_on_with_84e0693s_usage_file(tmp_path: Path) -> None:
    """A gateway started on a usage file 84e0693 saved: what each member spent, the budget already
    reached, the uploads; saved again, every key and value it had is still there."""
    path = tmp_path / gs.USAGE_FILE
    path.write_bytes((FILES / "gateway-usage-84e0693.json").read_bytes())
    raw = _raw("gateway-usage-84e0693.json")
    usage = gs.Usage(path)
    hours, usd = usage.spent(ALICE)
    assert (hours, usd) == (pytest.approx(2400 / 3600), raw["jobs"]["raysubmit_alice1"]["cost"])
    assert usage.member_id_of("raysubmit_bob1") == BOB and usage.uploaded(ALICE) == 4096
    assert {key for record in usage.jobs.values() for key in record.to_dict()} <= set(gf.JOB_FIELDS)
    assert [(key, record.to_dict()) for key, record in usage.pending_stops()] == [
        ("raysubmit_bob1", raw["jobs"]["raysubmit_bob1"])]
    assert usage.reach_budget() is False  # reached under 84e0693: not a second time
    usage.add_upload(BOB, 10)
    usage.save()
    saved = json.loads(path.read_text())
    assert {key: saved[key] for key in raw if key != "uploads"} == {
        key: value for key, value in raw.items() if key != "uploads"}
    assert saved["uploads"] == {**raw["uploads"], BOB: 10} and saved["version"] == wire.VERSION


def test_the_owner_rewrites_84e0693s_registry_with_every_key_and_a_version(
        rf_home: Path) -> None:
    """The owner's verbs read the registry through its typed form and write it back: a key
    written as null stays null, a missing one stays missing, and the file says its version."""
    raw = _raw("gateway-members-84e0693.json")
    target = sharing_term.registry_path("cls1")
    target.parent.mkdir(parents=True)
    target.write_bytes((FILES / "gateway-members-84e0693.json").read_bytes())
    book = sharing_term.read_book("cls1")
    assert book == {**raw, "version": 0}
    sharing_term.write_book("cls1", book)
    assert json.loads(target.read_text()) == {**raw, "version": wire.VERSION}
    assert "token_sha256" not in book["removed"][0] and book["members"]["alice"][
        "member_expires"] is None
    sharing_term.write_book("new", {"members": {"dan": {"role": "member"}}})
    assert json.loads(sharing_term.registry_path("new").read_text()) == {
        "members": {"dan": {"role": "member"}}, "version": wire.VERSION}


def test_a_job_record_writes_the_keys_it_was_read_with_and_those_set_since() -> None:
    """84e0693's records are dicts the owner reads by key: a key they lack stays missing (a
    record without `member_id` is one from before ids), one set since is written, a null too,
    and a key this version does not know is kept."""
    raw = _raw("gateway-usage-84e0693.json")["jobs"]
    for name, sample in raw.items():
        assert gf.JobRecord.from_dict(sample).to_dict() == sample, name
    record = gf.JobRecord.from_dict({"member": "ann", "cost": 1.5, "newer": {"x": 1}})
    assert (record.member, record.cost, record.member_id) == ("ann", 1.5, None)
    record.stop_confirmed = None
    record.update(status="RUNNING", later="kept")
    assert record.to_dict() == {"member": "ann", "cost": 1.5, "newer": {"x": 1},
                                "stop_confirmed": None, "status": "RUNNING", "later": "kept"}
    assert gf.JobRecord.new(cost=0.0).to_dict() == {"cost": 0.0}
