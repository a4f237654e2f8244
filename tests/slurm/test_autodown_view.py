"""What the laptop makes of the Slurm head's watcher marker (no Slurm needed; the e2e side is in
test_e2e_autodown.py): the decision is the base provider's, fed by Slurm's listing."""

from __future__ import annotations

import json
from pathlib import Path

from infra.cli import loading
from infra.core.autodown import view as autodown_view
from infra.core.state import State
from infra.providers import features
from infra.providers.slurm.provider import Provider
from infra.providers.slurm.spec import Spec


def _setup(tmp_path: Path, extra: str = "autodown: {idle_minutes: 0.5}\n") -> tuple[Spec, State]:
    path = tmp_path / "hpc.yaml"
    path.write_text("provider: slurm\ncpus_per_node: 1\n" + extra)
    loaded = loading.load_spec(path)
    assert isinstance(loaded, Spec)
    return loaded, State.new(tmp_path / "hpc.json", "hpc", "slurm")


def _cache(state: State, **marker: object) -> None:
    autodown_view.cache_marker(state.cluster, json.dumps(
        {"cluster": "hpc", "idle_minutes": 0.5, "idle_since": "2026-01-01T10:00:00+00:00",
         "idle_s": 30.0, "checked_at": None, **marker}))


def test_removing_is_removed_only_once_slurm_lists_no_job(rf_home: Path, tmp_path: Path) -> None:
    loaded, state = _setup(tmp_path)
    _cache(state, cluster_id=state.cluster_id, phase="removing",
           removing_at="2026-01-01T10:00:30+00:00")
    listed = features.autodown_report(Provider(loaded), state, left=True)
    assert listed is not None and listed.removed_at is None
    assert listed.detail == "removing the cluster now"
    gone = features.autodown_report(Provider(loaded), state, left=False)
    assert gone is not None and gone.removed_at == "2026-01-01T10:00:30+00:00"
    assert autodown_view.describe(gone).startswith("removed itself after 0.5 idle minutes at ")


def test_another_clusters_marker_is_never_taken(rf_home: Path, tmp_path: Path) -> None:
    loaded, state = _setup(tmp_path)
    _cache(state, cluster_id="0badc0de", phase="removing", removing_at="2026-01-01T10:00:30+00:00")
    assert autodown_view.cached(state.cluster, state.cluster_id) is None
    # Nor when read from the head: another cluster's file at our path is not kept.
    assert autodown_view.cache_marker(state.cluster, json.dumps(
        {"cluster_id": "0badc0de", "phase": "removed"}), state.cluster_id) is None
    report = features.autodown_report(Provider(loaded), state, left=False)
    assert report is not None and report.removed_at is None  # "no report from the watcher yet"
    # Without autodown in the spec and no marker of ours: nothing to show, nothing to ask.
    plain, _ = _setup(tmp_path, "")
    assert features.autodown_report(Provider(plain), state, left=False) is None


def test_a_new_head_job_forgets_the_last_watcher(rf_home: Path, tmp_path: Path) -> None:
    _, state = _setup(tmp_path)
    _cache(state, cluster_id=state.cluster_id, phase="watching")
    assert autodown_view.cached(state.cluster, state.cluster_id) is not None
    autodown_view.forget(state.cluster)
    assert autodown_view.cached(state.cluster, state.cluster_id) is None
