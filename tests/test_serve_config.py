"""`tracking:` in specs and Serve configs/import paths, checked before anything is contacted.

The end-to-end side (real MLflow, real Serve) is in tests/test_examples.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra.cli import loading
from infra.core import serve
from infra.core.errors import SpecError, UsageError
from tests.conftest import ROOT


def test_tracking_is_validated_strictly_with_a_did_you_mean(tmp_path: Path) -> None:
    path = tmp_path / "c1.yaml"
    path.write_text("provider: local\ntracking: mlfow\n")
    expected = r"tracking: input should be 'none' or 'mlflow' \(did you mean 'mlflow'\?\)"
    with pytest.raises(SpecError, match=expected):
        loading.load_spec(path)
    path.write_text("provider: local\ntracking: mlflow\n")
    assert loading.load_spec(path).tracking == "mlflow"
    path.write_text("provider: local\n")
    assert loading.load_spec(path).tracking == "none"


def test_an_import_path_becomes_a_one_app_config() -> None:
    config = serve.load("examples.serve_model:app", ROOT)
    assert config == {"applications": [{"name": "serve-model", "route_prefix": "/",
                                        "import_path": "examples.serve_model:app"}]}


def test_the_example_config_passes_rays_own_schema() -> None:
    config = serve.load(str(ROOT / "examples/serve.yaml"), ROOT)
    [app] = config["applications"]
    assert app["deployments"][0]["autoscaling_config"]["max_replicas"] == 2


@pytest.mark.parametrize(("text", "message"), [
    ("applications:\n  - name: [x\n", r"line 3, column 1\): .*; fix the YAML syntax"),
    ("- just a list\n", r"expected a Serve config with `applications:`"),
    ("applications:\n  - name: x\n    import_path: 3\n",
     r"applications\.0\.import_path: .*; fix the Serve config"),
    ("applications:\n  - name: x\n    import_path: examples.serve_model:app\n    deployments: 3\n",
     r"applications\.0\.deployments: .*; fix the Serve config"),
    ("applications:\n  - name: x\n    import_path: examples.nothing_here:app\n",
     r"no module 'examples.nothing_here' in .*; fix the import path"),
    ("applications:\n  - name: x\n    import_path: examples.serve_model:apq\n",
     r"examples/serve_model.py defines no 'apq'; fix the import path"),
])
def test_a_bad_serve_config_is_one_line_naming_the_fix(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as caught:
        serve.load(str(path), ROOT)
    assert "\n" not in str(caught.value)


def test_a_target_that_is_neither_file_nor_import_path_is_refused() -> None:
    with pytest.raises(UsageError, match=r"expected a Serve config file \(\.yaml\) or an import path"):
        serve.load("examples/serve_model.py", ROOT)


def test_up_refuses_tracking_where_the_provider_has_none_and_creates_nothing(
        tmp_path: Path, rf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from infra.cli import commands
    from infra.core.errors import SpecError
    from infra.providers.slurm.spec import Spec

    # Every provider of the test bed may start a server by now: take it away from one.
    monkeypatch.setattr(Spec, "CAPABILITIES", dataclasses.replace(Spec.CAPABILITIES, tracking=False))
    path = tmp_path / "trk.yaml"
    path.write_text((ROOT / "clusters/slurm-minimal.yaml").read_text() + "\ntracking: mlflow\n")
    with pytest.raises(SpecError) as caught:
        commands.up(None, str(path), keep_partial=False)
    assert str(caught.value) == (
        f"{path}: tracking: mlflow is not available on the slurm provider yet; "
        "remove the key (see docs/train-track-serve.md)")
    assert not (rf_home / "state").exists() or not list((rf_home / "state").iterdir())
