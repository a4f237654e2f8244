"""Issue 47: the owner's gateway token is not an owner's forever. Where members' jobs run as the
owner's account (local, slurm) a job can copy `.rayfleet/sharing/<cluster>/owner-token`; so
`member-remove` and `rotate-token` renew it, on every provider, and the old one is refused from the
gateway's next request (on this machine the gateway reads the registry these verbs write). `plan`
and `up` say in one line what such a job can read. On files, no Ray: the real-cluster attack is in
the e2e module of issue 47."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from infra.cli import commands
from infra.cli import sharing as commands_sharing
from infra.core.errors import UsageError
from infra.core.sharing import owner as sharing
from infra.node import gateway_state
from infra.providers.base import Provider as BaseProvider
from infra.providers.local.provider import Provider as LocalProvider
from tests.classroom_owner import book, owner_cluster, registry


def _owner_token() -> str:
    return sharing.owner_token_path("class").read_text().strip()


def _renewed(old: str, gateway: gateway_state.Members) -> str:
    """The new owner's token: another one, 0600 in a 0700 folder, the registry's only owner
    hash; the gateway (already running, the registry read before) refuses the old one."""
    new = _owner_token()
    path = sharing.owner_token_path("class")
    assert new != old and len(new) == 64
    assert oct(path.stat().st_mode & 0o777) == "0o600"
    assert oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert book()["owner"] == {"token_sha256": gateway_state.token_hash(new)}
    assert gateway_state.token_hash(old) not in registry().read_text()
    assert gateway.lookup(old) is None
    found = gateway.lookup(new)
    assert found is not None and found.role == "owner"
    return new


def _running_gateway() -> tuple[gateway_state.Members, str]:
    """The registry as `up` leaves it, read by a gateway; the owner's token then."""
    sharing.ensure_owner_token("class")
    old = _owner_token()
    gateway = gateway_state.Members(registry())
    found = gateway.lookup(old)
    assert found is not None and found.role == "owner"
    return gateway, old


def test_member_remove_renews_the_owners_gateway_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    commands_sharing.member_add(None, str(spec), "erin", False, None, None)
    gateway, old = _running_gateway()
    erin = (tmp_path / "class-erin" / "ray-token").read_text()
    commands_sharing.member_remove(None, str(spec), "bob", False)
    _renewed(old, gateway)
    said = capfd.readouterr().out
    assert "removed" in said and "gateway token is renewed" in said
    # The other members' tokens stay.
    assert (gateway.lookup(erin) or gateway_state.OWNER).name == "erin"


def test_member_remove_with_stop_jobs_renews_it_again_once_their_jobs_stopped(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands_sharing.member_add(None, str(spec), "bob", False, None, None)
    gateway, old = _running_gateway()
    during: list[str] = []

    def stopping(*_: Any) -> None:  # the cluster's jobs are stopped here (no Ray in this test)
        during.append(_owner_token())
        raise UsageError("the cluster did not answer")

    monkeypatch.setattr(commands_sharing, "stop_member_jobs", stopping)
    with pytest.raises(UsageError):
        commands_sharing.member_remove(None, str(spec), "bob", True)
    # Renewed with the removal, and again after the stops, even when stopping failed.
    assert during and during[0] != old
    new = _renewed(old, gateway)
    assert new != during[0] and gateway.lookup(during[0]) is None


def test_rotate_token_renews_it_on_a_provider_that_cannot_restart_ray(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The base provider's answer (`teardown` then `up` for Ray's token): the gateway's side
    needs no restart, so the owner's gateway token is renewed all the same."""
    spec = owner_cluster(tmp_path, monkeypatch)
    gateway, old = _running_gateway()
    monkeypatch.setattr(LocalProvider, "restarts_by_recreating",
                        BaseProvider.restarts_by_recreating)
    with pytest.raises(UsageError, match="rotate-token: not available"):
        commands_sharing.rotate_token(None, str(spec), yes=True)
    _renewed(old, gateway)


def test_plan_says_in_one_line_what_a_members_job_can_read(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    spec = owner_cluster(tmp_path, monkeypatch)
    commands.plan(None, str(spec), False)
    err = capfd.readouterr().err
    lines = [line for line in err.splitlines() if "members_run_as_owner" in line]
    assert len(lines) == 1, err
    line = lines[0]
    assert "run as your own account" in line
    for what in ("your files", "SSH keys", "cloud credentials", "members file",
                 str(sharing.owner_token_path("class")), "member-remove", "rotate-token",
                 "a job still running can read the new one"):
        assert what in line, (what, line)
    commands.plan(None, str(spec), True)
    planned = capfd.readouterr()
    assert json.loads(planned.out)["gateway"]["port"] == 18443
    assert sum("members_run_as_owner" in line for line in planned.err.splitlines()) == 1
