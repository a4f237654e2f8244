"""What `up`, `status` and `teardown` make of a GCP cluster whose head may have removed itself
(`features.autodown_report`), against the loopback fake: "removed itself" only when the APIs list
nothing with the cluster's labels *and* the last marker this machine kept showed the watcher
counting down; the time is when that idle period ran out. The real thing, end to end, is
test_e2e_autodown.py."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from infra.cli import loading
from infra.core.autodown import view as autodown_view
from infra.core.state import State
from infra.node import identity
from infra.node.gcp_tpu.api import ApiOptions
from infra.providers import features
from infra.providers.gcp_tpu import config
from infra.providers.gcp_tpu.provider import Provider
from infra.providers.gcp_tpu.records import Cluster
from tests.gcp_tpu.conftest import ZONE, write_spec
from tests.gcp_tpu.fake_gcp import FakeGcp

IDLE_SINCE = "2026-11-22T13:05:00+00:00"


def _setup(tmp_path: Path, rf_home: Path, options: ApiOptions,
           marker: dict[str, object] | None) -> tuple[Provider, State]:
    spec = loading.load_spec(write_spec(tmp_path, name="gone", autodown={"idle_minutes": 5}))
    provider = Provider(spec, api_options=options)  # type: ignore[arg-type]
    state = State.new(rf_home / "state" / "gone.json", "gone", "gcp-tpu")
    state.add("gone", Cluster(project="test-project", zone=ZONE, label_id=state.cluster_id,
                              ssh_user="root", dashboard_port=8265, head="ray-gone-head"))
    if marker is not None:
        path = autodown_view.marker_path("gone")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"cluster": "gone", "cluster_id": state.cluster_id,
                                    "idle_minutes": 5, "phase": "watching", **marker}))
    return provider, state


def test_removed_itself_only_when_nothing_is_listed_and_it_was_counting_down(
        tmp_path: Path, rf_home: Path, fake: FakeGcp, options: ApiOptions, key_file: Path) -> None:
    provider, state = _setup(tmp_path, rf_home, options, {
        "idle_since": IDLE_SINCE, "idle_s": 120.0, "checked_at": IDLE_SINCE})
    labels = {**config.sweep_labels(state.cluster_id, "gone"), "ray-node-type": "head",
              identity.TAG_NAME: "gone"}
    fake.add_instance(ZONE, "ray-gone-head", labels)
    report = features.autodown_report(provider, state)
    assert report is not None and report.removed_at is None, report  # its head is still listed

    with fake.lock:
        fake.instances.clear()
    report = features.autodown_report(provider, state)
    assert report is not None and report.removed_at and report.silent_since is None, report
    ended = dt.datetime.fromisoformat(IDLE_SINCE) + dt.timedelta(minutes=5)
    assert dt.datetime.fromisoformat(report.removed_at) == ended
    assert autodown_view.describe(report) == (
        f"removed itself after 5 idle minutes at {autodown_view.local_time(ended.isoformat())}")
    status = provider.status(state)
    assert status.state == "removed itself" and status.autodown == report, status
    assert "`invoke teardown` verifies and clears its state" in status.summary


def test_gone_while_busy_is_not_a_self_removal(tmp_path: Path, rf_home: Path, fake: FakeGcp,
                                              options: ApiOptions, key_file: Path) -> None:
    provider, state = _setup(tmp_path, rf_home, options, {
        "idle_since": None, "detail": "1 job(s) running", "checked_at": IDLE_SINCE})
    report = features.autodown_report(provider, state)
    assert report is not None and report.removed_at is None, report
    assert provider.status(state).state != "removed itself"
