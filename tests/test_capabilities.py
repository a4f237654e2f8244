"""One capability table per provider (infra/core/capabilities.py): on its spec class, read through the
provider too, holding every "does this provider do X", and one check that refuses a spec asking
for what its provider lacks, at `plan` as at `up`."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from infra import providers
from infra.cli import commands
from infra.cli.loading import load_spec
from infra.core.capabilities import Capabilities
from infra.core.errors import SpecError
from tests.conftest import ROOT

EXAMPLES = {"local": "local.yaml", "lambda": "lambda-minimal.yaml",
            "gcp-tpu": "gcp-tpu-minimal.yaml", "slurm": "slurm-minimal.yaml"}


def test_every_provider_has_its_table_and_the_provider_reads_that_one() -> None:
    assert sorted(providers.names()) == sorted(EXAMPLES)
    for name, example in EXAMPLES.items():
        spec_class = providers.spec_class(name)
        table = spec_class.CAPABILITIES
        assert isinstance(table, Capabilities) and table != Capabilities()  # each says something
        with pytest.raises(dataclasses.FrozenInstanceError):
            table.ssh = not table.ssh  # type: ignore[misc]
        spec = load_spec(ROOT / "clusters" / example)
        assert providers.create(spec).capabilities is table


def test_no_capability_lives_outside_the_table() -> None:
    """Upper-case class constants on spec classes and capability flags on providers were the two
    places of before; neither may come back."""
    for name in EXAMPLES:
        spec_class = providers.spec_class(name)
        for klass in spec_class.__mro__:
            constants = [k for k in vars(klass) if k.isupper() and k != "CAPABILITIES"]
            assert constants == [], f"{klass.__qualname__}: {constants}"
        provider_class = type(providers.create(load_spec(ROOT / "clusters" / EXAMPLES[name])))
        flags = [k for klass in provider_class.__mro__ for k in vars(klass)
                 if k.startswith(("supports_", "uses_")) or k.endswith("_may_be_lost")]
        assert flags == [], f"{provider_class.__qualname__}: {flags}"


def test_plan_refuses_what_the_provider_lacks_as_up_does(
        tmp_path: Path, rf_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec_class = providers.spec_class("slurm")
    monkeypatch.setattr(spec_class, "CAPABILITIES",
                        dataclasses.replace(spec_class.CAPABILITIES, tracking=False))
    path = tmp_path / "trk.yaml"
    path.write_text((ROOT / "clusters/slurm-minimal.yaml").read_text() + "\ntracking: mlflow\n")
    for verb in (lambda: commands.plan(None, str(path), as_json=False),
                 lambda: commands.up(None, str(path), keep_partial=False)):
        with pytest.raises(SpecError, match=r"tracking: mlflow is not available on the slurm "
                                            r"provider yet; remove the key"):
            verb()
    assert not (rf_home / "state").exists() or not list((rf_home / "state").glob("*.json"))
    assert not (rf_home / "rendered").exists()
