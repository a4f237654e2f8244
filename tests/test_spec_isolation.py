"""`sharing.isolation` in the spec: where it cannot hold it is refused in one line saying why;
`plan` gives its cost (issue 48)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from infra.cli import loading
from infra.core.errors import SpecError
from infra.core.sharing import isolation, owner

SLURM = {"provider": "slurm", "cpus_per_node": 2}
LAMBDA = {"provider": "lambda", "head": {"choices": [{"instance_type": "gpu_1x_a10",
                                                     "region": "us-east-1"}]},
          "workers": {"count": 0}, "autodown": {"idle_minutes": 10}}
GCP = {"provider": "gcp-tpu", "project": "my-class-project", "zone": "us-central2-b",
       "tpu_workers": {"tpu": {"accelerator_type": "v4-8", "max_workers": 2,
                               "provisioning": "spot"}}}


def parse(data: dict[str, Any], **sharing: Any) -> Any:
    ranges = {"allowed_source_ranges": ["198.51.100.0/24"]} if data["provider"] != "slurm" \
        and data["provider"] != "local" else {}
    return loading.parse_spec(Path("clusters/iso.yaml"),
                              {**data, "sharing": {**ranges, **sharing}})


def one_line(exc: pytest.ExceptionInfo[SpecError]) -> str:
    text = str(exc.value)
    assert "\n" not in text and text.startswith("clusters/iso.yaml: "), text
    return text


def test_slurm_is_refused_saying_members_run_under_the_owners_account() -> None:
    with pytest.raises(SpecError) as exc:
        parse(SLURM, isolation="cluster", members_run_as_owner=True)
    assert "your own Slurm account" in one_line(exc) and "isolation: shared" in str(exc.value)


@pytest.mark.parametrize("data", [LAMBDA, GCP], ids=["lambda", "gcp-tpu"])
def test_cloud_heads_take_member_clusters_without_root_here(
        data: dict[str, Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """Member users are made on the head (its starter, root there), not on this machine; the
    head's services members would not get are still refused in one line."""
    assert parse(data).sharing.isolation == "shared"  # today's behaviour stays the default
    selected = parse({**data, "metrics": "none"}, isolation="cluster")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    owner.check_spec(selected)
    with pytest.raises(SpecError) as exc:
        owner.check_spec(parse({**data, "metrics": "prometheus"}, isolation="cluster"))
    assert "metrics: prometheus is not per member" in one_line(exc)


@pytest.mark.parametrize(("key", "value", "words"), [
    ("isolation", "walls", "'shared' or 'cluster'"),
    ("max_active_members", 0, "greater than or equal to 1"),
    ("member_idle_minutes", 0, "greater than 0")])
def test_bad_values_name_the_field(key: str, value: Any, words: str) -> None:
    with pytest.raises(SpecError) as exc:
        parse({"provider": "local"}, **{key: value})
    assert f"sharing.{key}" in one_line(exc) and words in str(exc.value)


def test_local_without_root_is_refused_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    selected = parse({"provider": "local"}, isolation="cluster")
    monkeypatch.setattr("os.geteuid", lambda: 1000)
    with pytest.raises(SpecError) as exc:
        owner.check_spec(selected)
    assert "needs root to create member users" in one_line(exc)
    monkeypatch.setattr("os.geteuid", lambda: 0)
    owner.check_spec(selected)  # as root; and members_run_as_owner is not asked for


def test_plan_gives_the_choice_and_its_cost() -> None:
    selected = parse({"provider": "local"}, isolation="cluster", max_active_members=3)
    note = owner.plan_note(selected, None) or ""
    assert "isolation: cluster" in note and "one Ray head per active member" in note
    assert "at most 3 at once" in note
    assert f"{isolation.HEAD_MB_PER_MEMBER} MB each" in note
    assert "isolation" not in (owner.plan_note(parse({"provider": "local"},
                                                     members_run_as_owner=True), None) or "")


@pytest.mark.parametrize(("field", "value"), [("tracking", "mlflow"), ("metrics", "prometheus")])
def test_a_head_service_members_would_not_get_is_refused_naming_field_and_fix(
        field: str, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """MLflow and Prometheus are the base cluster's only: with `isolation: cluster` they are
    refused at plan and up, root or not, in one line naming the field and the fix."""
    monkeypatch.setattr("os.geteuid", lambda: 0)
    selected = parse({"provider": "local", field: value}, isolation="cluster")
    with pytest.raises(SpecError) as exc:
        owner.check_spec(selected)
    text = one_line(exc)
    assert f"{field}: {value} is not per member" in text
    assert f"`{field}: none`" in text and "isolation: shared" in text
    owner.check_spec(parse({"provider": "local", field: "none"}, isolation="cluster"))
    # The same service on a shared cluster stays as it was.
    owner.check_spec(parse({"provider": "local", field: value}, members_run_as_owner=True))


def test_the_default_metrics_of_an_isolated_local_cluster_is_none() -> None:
    """Nothing to refuse by default: where member clusters exist (local) no Prometheus starts
    unless the spec asks for it."""
    assert parse({"provider": "local"}, isolation="cluster").metrics == "none"
