"""`metrics:` and `metrics_history:` in specs: the defaults per provider, strict validation with one
line naming the field and the fix, and what the rendered files of each provider carry."""

from __future__ import annotations

from pathlib import Path

import pytest

from infra.cli import loading
from infra.core.errors import SpecError
from tests.conftest import ROOT
from tests.forked_cli import run_invoke


@pytest.mark.parametrize(("example", "expected"), [
    ("local.yaml", "none"), ("lambda.yaml", "prometheus"), ("gcp-tpu.yaml", "prometheus"),
    ("slurm.yaml", "prometheus"),
])
def test_default_per_provider(example: str, expected: str) -> None:
    spec = loading.load_spec(ROOT / "clusters" / example)
    assert spec.metrics == expected
    assert (spec.metrics_history.days, spec.metrics_history.size_mb) == (30, 1024)


@pytest.mark.parametrize(("text", "message"), [
    ("metrics: promethus\n", "metrics: input should be 'prometheus' or 'none' (did you mean "
                             "'prometheus'?)"),
    ("metrics: none\nmetrics_history: {days: 3}\n",
     "metrics_history: set while metrics is none; remove metrics_history or set `metrics: "
     "prometheus`"),
    ("metrics: prometheus\nmetrics_history: {dayz: 3}\n",
     "metrics_history.dayz: unknown key; did you mean 'days'?"),
    ("metrics: prometheus\nmetrics_history: {days: 0}\n",
     "metrics_history.days: input should be greater than or equal to 1"),
    ("metrics: prometheus\nmetrics_history: {size_mb: 10}\n",
     "metrics_history.size_mb: input should be greater than or equal to 64"),
    ("metrics: prometheus\nmetrics_history: {scrape_interval_s: 1000}\n",
     "metrics_history.scrape_interval_s: input should be less than or equal to 300"),
])
def test_bad_metrics_keys_give_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("provider: local\n" + text)
    with pytest.raises(SpecError) as caught:
        loading.load_spec(path)
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_plan_refuses_a_bad_history_and_creates_nothing(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("provider: local\nmetrics: none\nmetrics_history: {days: 3}\n")
    home = tmp_path / "home"
    done = run_invoke("up", "--cluster", str(path), env={"RAYFLEET_HOME": str(home)})
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (home / "state").exists() or not list((home / "state").iterdir())
