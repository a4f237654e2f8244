"""Issue 50: `plan`, `up`, `status` and `teardown` are a library (infra/app/) that returns data and
reports progress through a callback; only infra/cli prints. A local spec, no Ray: the provider's
`up` is replaced by one that answers at once (the local head's start is tests/local's)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest

from infra.app import clusters, lifecycle, planning, reporting
from infra.app.progress import Step, timed
from infra.cli import common, loading
from infra.core import paths, state
from infra.core.endpoint import Endpoint
from infra.providers.local.provider import Provider as LocalProvider
from tests.conftest import ROOT

APP = ROOT / "infra" / "app"


def _spec(tmp_path: Path, extra: str = "") -> Path:
    spec = tmp_path / "lib.yaml"
    spec.write_text("provider: local\nnum_cpus: 1\n" + extra)
    return spec


def test_plan_returns_what_up_would_create_and_prints_nothing(
        rf_home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    steps: list[Step] = []
    found = planning.plan(loading.resolve(None, str(_spec(tmp_path))), steps.append)
    assert isinstance(found, planning.PlanResult) and found.spec.name == "lib"
    assert found.plan.resources and not found.plan.problems
    assert found.rendered == paths.rendered_dir("lib")
    assert sorted(p.name for p in found.rendered.iterdir()) == sorted(found.plan.files)
    assert (found.diff, found.spec_changes, found.applied) == ("", [], False)  # never up
    assert state.read("lib") is None  # a plan creates nothing
    assert capfd.readouterr().out == ""


def test_up_status_teardown_return_data_and_report_progress(
        rf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capfd: pytest.CaptureFixture[str]) -> None:
    endpoint = Endpoint("http://127.0.0.1:26265", "127.0.0.1:26379")
    monkeypatch.setattr(LocalProvider, "up", lambda self, current, result, options: endpoint)
    selected = loading.resolve(None, str(_spec(tmp_path, "auth: none\n")))
    steps: list[Step] = []

    done = lifecycle.up(selected, steps.append)
    assert isinstance(done, lifecycle.UpResult) and done.endpoint is endpoint
    assert (done.pending, done.in_place, done.gateway_url) == ([], None, None)
    assert [s.kind for s in steps if "auth: none" in s.text] == ["warn"]
    recorded = state.read("lib")
    assert recorded is not None and recorded.info.spec_path == str(Path(selected.source).resolve())
    assert paths.applied_dir("lib").is_dir()  # kept for the next plan's diff

    seen = reporting.status(selected, steps.append)
    assert isinstance(seen, reporting.StatusResult) and seen.spec is selected
    assert not seen.provider.running and (seen.ray, seen.ray_error, seen.sharing) == ({}, "", None)

    # A cluster whose head kept a metrics history: teardown says (a warning) why it is not kept.
    recorded.set_info(metrics_since=1.0)
    del steps[:]
    gone = lifecycle.teardown(selected, steps.append)
    assert isinstance(gone, lifecycle.TeardownResult)
    assert (gone.cluster, gone.removed, gone.metrics_kept) == ("lib", True, None)
    assert [s.kind for s in steps if "metrics history NOT kept" in s.text] == ["warn"]
    assert state.read("lib") is None and not paths.applied_dir("lib").exists()
    assert lifecycle.teardown(selected, steps.append).removed is False  # nothing left
    assert capfd.readouterr().out == ""  # results are data; the CLI prints them


@pytest.mark.parametrize("alive", [True, False])
def test_teardown_copies_a_heads_tracking_store_before_the_provider_removes_anything(
        rf_home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, alive: bool) -> None:
    """Written once for every provider whose store lives on a head: the library asks the
    provider's `head_services` (and whether the head still runs), never the provider's
    `teardown`, and copies the store before that removes anything."""
    from infra.core.head_local import LocalHead
    from infra.core.tracking import remote as tracking_remote
    from infra.providers.features import HeadServices

    selected = loading.resolve(None, str(_spec(tmp_path, "auth: none\n")))
    current = state.State.new(state.state_path("lib"), "lib", "local")
    current.set_info(tracking_head_store="/root/rayfleet/tracking")
    head = LocalHead(where="this machine")
    calls: list[str] = []
    monkeypatch.setattr(LocalProvider, "head_services", lambda self, st: HeadServices(
        head=head, alive=lambda: calls.append("alive?") or alive))
    copied = tmp_path / "copy"
    monkeypatch.setattr(tracking_remote, "copy_back",
                        lambda h, st: calls.append("copy") or (h is head and copied))
    monkeypatch.setattr(LocalProvider, "teardown", lambda self, st: calls.append("teardown"))
    steps: list[Step] = []
    gone = lifecycle.teardown(selected, steps.append)
    assert calls == (["alive?", "copy", "teardown"] if alive else ["alive?", "teardown"])
    assert gone.tracking_copied == (copied if alive else None)
    warned = [s.text for s in steps if s.kind == "warn"]
    if alive:
        assert warned == [] and [s.kind for s in steps if "MLflow store" in s.text] == [
            "begin", "done"]
    else:
        assert warned == ["tracking data NOT copied: the head is already gone (autodown, or "
                          "removed by hand); it goes with the cluster"], warned


def test_connect_refuses_a_cluster_without_state(rf_home: Path, tmp_path: Path) -> None:
    from infra.core.errors import ClusterNotRunningError

    with pytest.raises(ClusterNotRunningError, match="has no state; start it with `invoke up"), \
            clusters.connect(loading.resolve(None, str(_spec(tmp_path)))):
        pass


def test_the_cli_renders_progress_as_before(capfd: pytest.CaptureFixture[str]) -> None:
    shown = common.Shown()
    shown(Step("a line"))
    shown(Step("careful", "warn"))
    with timed(shown, "a timed step"):
        pass
    with pytest.raises(ValueError), timed(shown, "a failing step"):
        raise ValueError("no")
    err = capfd.readouterr().err
    assert "a line\n" in err and "warning: careful" in err
    assert "… a timed step" in err and "✓ a timed step (" in err
    assert "✗ a failing step (" in err and "✓ a failing step" not in err


def _printing(source: str) -> list[str]:
    """What in `source` writes to the terminal: print(), rayfleet's ui, rich, sys.stdout/err."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "print":
            found.append(f"print() at line {node.lineno}")
        elif isinstance(node, ast.ImportFrom) and node.module and (
                node.module in ("infra.core.ui", "rich") or node.module.startswith("rich.")
                or (node.module == "infra.core" and any(a.name == "ui" for a in node.names))):
            found.append(f"from {node.module} import at line {node.lineno}")
        elif isinstance(node, ast.Import) and any(
                a.name.split(".")[0] == "rich" or a.name == "infra.core.ui" for a in node.names):
            found.append(f"import at line {node.lineno}")
        elif isinstance(node, ast.Attribute) and node.attr in ("stdout", "stderr") \
                and isinstance(node.value, ast.Name) and node.value.id == "sys":
            found.append(f"sys.{node.attr} at line {node.lineno}")
    return found


def test_only_the_cli_prints() -> None:
    # The check finds each way of printing (else it would pass on anything).
    for sample in ("print('x')\n", "from infra.core import paths, ui\n", "import rich.table\n",
                   "import infra.core.ui\n", "from rich.table import Table\n",
                   "import sys\nsys.stderr.write('x')\n"):
        assert _printing(sample), sample
    modules: dict[str, Any] = {p.name: _printing(p.read_text()) for p in sorted(APP.glob("*.py"))}
    assert {"lifecycle.py", "planning.py", "reporting.py", "progress.py"} <= set(modules)
    assert {name: found for name, found in modules.items() if found} == {}
