"""State files that earlier rayfleet wrote still load, typed, and survive a rewrite unchanged.

tests/state_files/ holds files captured from the code before state was typed (from its quick and
e2e tests, one or more per provider), and `gcp-tpu-e2e-running.json` from the typed code's GCP e2e
test (`test_ray_autoscales_tpu_nodes_against_offline_google` with `--basetemp`, every version of
its state file copied while it ran; this is the last, the running cluster with its tracking copy
recorded, just before teardown forgot it). They are never regenerated, so a model that stops
accepting what earlier code wrote fails here. Keys no model knows are kept, not dropped
(infra/core/state.py).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from infra.core import state
from infra.core.errors import StateError
from infra.providers.gcp_tpu import records as gcp_tpu
from infra.providers.lambda_cloud import records as lambda_cloud
from infra.providers.local import records as local
from infra.providers.slurm import records as slurm

FILES = Path(__file__).parent / "state_files"
CAPTURED = sorted(FILES.glob("*.json"))

#: Every resource kind today's providers record, with its model.
MODELS: dict[str, type[state.Attrs]] = {
    model.KIND: model
    for model in (local.Head, gcp_tpu.SshKey, gcp_tpu.Cluster, gcp_tpu.Firewall, gcp_tpu.Queued,
                  lambda_cloud.SshKey, lambda_cloud.Instance, lambda_cloud.Firewall, slurm.Job)
}


def _copy(source: Path, tmp_path: Path) -> Path:
    target = tmp_path / source.name
    shutil.copyfile(source, target)
    return target


def _without_clock(text: str) -> str:
    """The file's JSON without its write time, as text (so 3 and 3.0 differ)."""
    return json.dumps({k: v for k, v in json.loads(text).items() if k != "updated_at"},
                      sort_keys=True)


def test_every_provider_has_a_captured_file() -> None:
    providers = {json.loads(path.read_text())["provider"] for path in CAPTURED}
    assert providers == {"local", "gcp-tpu", "lambda", "slurm"}


@pytest.mark.parametrize("path", CAPTURED, ids=[p.stem for p in CAPTURED])
def test_a_captured_file_loads_typed_with_nothing_left_untyped(path: Path) -> None:
    loaded = state.State.load(path)
    assert loaded is not None
    raw = json.loads(path.read_text())
    assert loaded.info.model_dump(exclude_unset=True) == raw["info"]
    assert not loaded.info.model_extra  # every info key today's code writes is a field
    for resource in loaded.resources():
        typed = resource.typed(MODELS[resource.kind])
        assert not typed.attrs.model_extra, (resource.kind, typed.attrs.model_extra)
    for kind, model in MODELS.items():
        assert [r.id for r in loaded.resources(model)] == [
            r["id"] for r in raw["resources"] if r["kind"] == kind]


@pytest.mark.parametrize("path", CAPTURED, ids=[p.stem for p in CAPTURED])
def test_a_captured_file_round_trips_through_the_models(path: Path, tmp_path: Path) -> None:
    """Each resource and the info rewritten from their models: the same JSON (but the clock)."""
    copy = _copy(path, tmp_path)
    loaded = state.State.load(copy)
    assert loaded is not None
    for resource in loaded.resources():
        loaded.update(MODELS[resource.kind], resource.id)
    loaded.set_info()
    assert _without_clock(copy.read_text()) == _without_clock(path.read_text())


def test_unknown_keys_of_a_newer_file_are_kept_through_an_update(tmp_path: Path) -> None:
    copy = _copy(FILES / "local-e2e-running.json", tmp_path)
    data = json.loads(copy.read_text())
    data["resources"][0]["attrs"]["from_the_future"] = {"x": 1}
    data["info"]["also_new"] = "kept"
    copy.write_text(json.dumps(data))
    loaded = state.State.load(copy)
    assert loaded is not None
    head = loaded.resources(local.Head)[0]
    assert head.attrs.model_extra == {"from_the_future": {"x": 1}}
    loaded.update(local.Head, head.id, started_at="2026-01-01T00:00:00+00:00")
    loaded.set_info(address="127.0.0.1:1")
    written = json.loads(copy.read_text())
    assert written["resources"][0]["attrs"]["from_the_future"] == {"x": 1}
    assert written["resources"][0]["attrs"]["started_at"] == "2026-01-01T00:00:00+00:00"
    assert written["info"]["also_new"] == "kept" and written["info"]["address"] == "127.0.0.1:1"


def test_this_code_never_writes_a_field_its_model_lacks(tmp_path: Path) -> None:
    current = state.State.load(_copy(FILES / "local-e2e-running.json", tmp_path))
    assert current is not None
    head = current.resources(local.Head)[0]
    with pytest.raises(TypeError, match="ray-head has no field port_bsae"):
        current.update(local.Head, head.id, port_bsae=1)
    with pytest.raises(TypeError, match="has no field adress"):
        current.set_info(adress="x")
    with pytest.raises(TypeError, match="ray-head has no field typo"):
        current.add("/tmp/x", local.Head(port_base=1, typo=2))


def test_a_bad_value_is_one_line_naming_the_field(tmp_path: Path) -> None:
    copy = _copy(FILES / "local-e2e-running.json", tmp_path)
    data = json.loads(copy.read_text())
    data["resources"][0]["attrs"]["port_base"] = "not a port"
    copy.write_text(json.dumps(data))
    loaded = state.State.load(copy)
    assert loaded is not None
    with pytest.raises(StateError) as caught:
        loaded.resources(local.Head)
    message = str(caught.value)
    assert "\n" not in message and "port_base" in message and str(copy) in message
    assert "fix the state file by hand or restore it from a backup" in message


def test_the_captured_files_are_as_captured() -> None:
    """They prove compatibility only while nobody rewrites them: their bytes are pinned."""
    import hashlib

    pinned = dict(line.split()[::-1] for line in (FILES / "SHA256SUMS").read_text().splitlines())
    assert pinned == {path.name: hashlib.sha256(path.read_bytes()).hexdigest()
                      for path in CAPTURED}
