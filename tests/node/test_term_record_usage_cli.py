"""A member's own view from their machine (issue 49, defect 14): `rayfleet usage` (and `--json`)
reads the gateway's `/rayfleet/usage` with the member's token, verifying the gateway against the
cluster's CA; `rayfleet submit` warns a member at 80 % of their budget before the job goes. A
folder as `rayfleet join` leaves it, in front of the real gateway over TLS (gateway_bed)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infra.cli import commands
from infra.cli import term as commands_term
from infra.core.errors import UsageError
from infra.core.sharing import certs as sharing_certs
from infra.core.sharing import membership
from infra.node.files import atomic_write
from tests.node.gateway_bed import ANN, Bed, gateway_bed


@pytest.fixture
def bed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Bed]:
    for name in ("REQUESTS_CA_BUNDLE", "SSL_CERT_FILE"):  # set by the member's endpoint
        monkeypatch.setenv(name, "")
    with gateway_bed(tmp_path, monkeypatch, member_budget_hours=2.0) as started:
        end = time.time() * 1000
        started.gateway.usage.note("raysubmit_ann1", start_time=end - 1.7 * 3.6e6,
                                   end_time=end, cost=0.5, status="SUCCEEDED")
        target = membership.folder("class")
        membership.write_credentials(target, sharing_certs.ca_cert_path("class").read_text(), ANN)
        atomic_write(target / membership.INFO_FILE, json.dumps(
            {"cluster": "class", "address": f"https://127.0.0.1:{started.port}", "member": "ann"}))
        yield started


def test_term_record_rayfleet_usage_shows_a_members_own_figures(
        bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    commands_term.usage("class", True)
    found = json.loads(capsys.readouterr().out)
    assert (found["member"], found["job_hours"], found["left"]["job_hours"]) == ("ann", 1.7, 0.3)
    commands_term.usage("class", False)
    said = capsys.readouterr()
    assert "used: 1.70 job-hours, $0.50" in said.out
    assert "budget: 2 job-hours; left: 0.30 job-hours (85% used)" in said.out
    assert "member ann has used 85% of their budget" in said.out + said.err


def test_term_record_usage_is_a_members_verb(bed: Bed) -> None:
    with pytest.raises(UsageError, match="owner sees everyone's with `invoke members`"):
        commands_term.usage("clusters/class.yaml", False)


def test_term_record_rayfleet_submit_warns_a_member_near_their_budget(
        bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    sent: list[Any] = []
    monkeypatch.setattr(commands.jobs, "submit", lambda *args: sent.append(args) or 0)
    script = tmp_path / "work" / "train.py"
    script.parent.mkdir()
    script.write_text("print(1)\n")
    assert commands.submit(None, "class", str(script), [], None, False) == 0
    said = capsys.readouterr()
    assert "member ann has used 85% of their budget" in said.out + said.err and len(sent) == 1
