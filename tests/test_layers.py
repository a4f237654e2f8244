"""The import graph of infra/ is layers (see ARCHITECTURE.md), lazy imports included:

    infra/cli/tasks.py (the front door; tasks.py re-exports it) -> commands -> app -> providers
    -> core -> node

No module imports one above its layer, none of them import each other round, and a provider
imports no other provider. Imports under `if TYPE_CHECKING:` count as any other: they do not run,
but a circle of types is a circle of layers all the same.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest

from tests.import_graph import cycles, graph

#: The front door: the tasks of `invoke` and `rayfleet` (and what they share, door.py); nothing
#: below it imports it. It sits in the cli folder with the verbs it calls.
FRONT = {"infra.cli.tasks", "infra.cli.tasks_sharing", "infra.cli.door", "infra.__main__"}

#: Each layer is a folder of infra/ (the package's own `__init__` ships with the node code).
FOLDERS = {"infra.cli": "commands", "infra.app": "app", "infra.providers": "providers",
           "infra.core": "core", "infra.node": "node"}


def _layer(module: str) -> str:
    if module in FRONT:
        return "front"
    if module == "infra":
        return "node"
    for folder, layer in FOLDERS.items():
        if module == folder or module.startswith(folder + "."):
            return layer
    return "outside"


#: Which layers each layer may import.
ALLOWED = {
    "front": {"front", "commands", "app", "providers", "core", "node"},
    "node": {"node"},
    "core": {"core", "node"},
    "providers": {"providers", "core", "node"},
    "commands": {"commands", "app", "providers", "core", "node"},
    # The use cases (plan, up, status, teardown, connect) under the CLI: they return data.
    "app": {"app", "providers", "core", "node"},
}

@cache
def edges() -> dict[str, set[str]]:
    """infra/'s import graph, read when a test first needs it: at module level every xdist
    worker read it while collecting (all of infra/ parsed, ~0.5 CPU-s each)."""
    return graph()


def test_the_graph_is_read() -> None:
    # The check below would pass on an empty graph: make sure it sees the imports it must.
    assert "infra.providers" in edges()["infra.cli.loading"]
    assert "infra.node.autodown" in edges()["infra.core.autodown.remote"]
    assert "infra.node.files" in edges()["infra.node.autodown"]  # a lazy or top-level import
    assert len(edges()) > 60


def test_every_module_is_in_a_layers_folder() -> None:
    outside = sorted(m for m in edges() if _layer(m) == "outside")
    assert outside == [], f"modules outside infra/cli, app, core, providers, node: {outside}"
    assert _layer("infra.cli.commands") == "commands" and _layer("infra.core.spec") == "core"
    assert _layer("infra.app.lifecycle") == "app" and "infra.app.lifecycle" in edges()


def test_no_import_cycle() -> None:
    assert cycles(edges()) == []


def test_imports_for_the_type_checker_count(tmp_path: Path) -> None:
    package = tmp_path / "infra"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from infra import b\n")
    (package / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                  "    from infra.a import A\n")
    edges = graph(package)
    assert edges["infra.b"] == {"infra.a"}
    assert cycles(edges) == [["infra.a", "infra.b"]]


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layers_import_only_downward(layer: str) -> None:
    wrong = sorted(f"{source} -> {target}" for source, targets in edges().items()
                   if _layer(source) == layer for target in targets
                   if _layer(target) not in ALLOWED[layer])
    assert wrong == [], f"{layer} imports above itself: {wrong}"


def test_core_imports_no_provider_module() -> None:
    core = [m for m in edges() if _layer(m) == "core"]
    assert "infra.core.spec" in core and "infra.core.jobs" in core and "infra.core.autodown.view" in core
    wrong = sorted(f"{m} -> {t}" for m in core for t in edges()[m] if t.startswith("infra.providers"))
    assert wrong == []


def test_providers_import_no_other_provider() -> None:
    def package(module: str) -> str | None:
        parts = module.split(".")
        # base.py and features.py (the base's services, written once) are every provider's.
        return parts[2] if len(parts) > 2 and parts[1] == "providers" \
            and parts[2] not in ("base", "features") else None

    wrong = sorted(f"{m} -> {t}" for m, targets in edges().items() if package(m) for t in targets
                   if package(t) and package(t) != package(m))
    assert wrong == []
