"""A fifth provider touches its own package and the registry row, and nothing else
(ARCHITECTURE.md, "Adding a provider"): the toy in tests/toy_provider/ is registered through the
public registry and runs plan, up, status and teardown through the `rayfleet` command, and no
shared module of infra/ names a provider or imports a provider's package (so neither the toy's
nor a real fifth's needs a change there). The toy starts no Ray: quick tier."""

from __future__ import annotations

import ast
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from infra import providers
from infra.cli import tasks
from infra.core import state
from infra.core.errors import SpecError
from tests.conftest import ROOT
from tests.toy_provider import ENTRY, NAME


@pytest.fixture
def toy() -> Iterator[None]:
    providers.register(NAME, ENTRY)
    yield
    providers.unregister(NAME)


def rayfleet(*args: str) -> int:
    """The `rayfleet` command in this process, as a user runs it; its exit code."""
    try:
        tasks.program.run(["rayfleet", *args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


def test_the_toy_runs_plan_up_status_teardown_through_the_command(
        toy: None, rf_home: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    cloud = tmp_path / "cloud"
    cloud.mkdir()
    spec = tmp_path / "toys.yaml"
    spec.write_text(f"provider: toy\nmachines: 2\ncloud: {cloud}\nusd_per_hour: 0.5\n")
    machines = ["toy-toys-0", "toy-toys-1"]

    assert rayfleet("plan", f"--cluster={spec}") == 0
    planned = capfd.readouterr().out
    assert all(name in planned for name in machines), planned
    assert "$1.00/h" in planned, planned  # its cost_range, as the core describes it
    assert list(cloud.iterdir()) == []  # plan creates nothing

    assert rayfleet("up", f"--cluster={spec}") == 0
    assert "cluster 'toys' (toy) is up" in capfd.readouterr().out
    made = {p.stem: json.loads(p.read_text()) for p in cloud.iterdir()}
    recorded = state.read("toys")
    assert recorded is not None
    assert sorted(made) == machines == [r.id for r in recorded.resources()]
    assert {m["cluster_id"] for m in made.values()} == {recorded.cluster_id}

    assert rayfleet("status", f"--cluster={spec}", "--json") == 0
    shown = json.loads(capfd.readouterr().out)
    assert shown["provider"] == NAME and shown["state"] == "2/2 machines"
    assert [r["machine"] for r in shown["provider_resources"]] == machines
    assert shown["cost"]["hourly_usd"] == 1.0

    (cloud / "toy-toys-1.json").unlink()  # gone behind its back: status reads the cloud
    assert rayfleet("status", f"--cluster={spec}") == 0
    assert "1 of 2 toy machines listed" in capfd.readouterr().out

    assert rayfleet("teardown", f"--cluster={spec}") == 0
    assert "cluster 'toys' is gone" in capfd.readouterr().out
    assert list(cloud.iterdir()) == [] and state.read("toys") is None


def test_without_its_row_rayfleet_knows_no_toy(rf_home: Path, tmp_path: Path) -> None:
    """The registry row is the one tie: unregistered, a toy spec is refused in one line."""
    spec = tmp_path / "toys.yaml"
    spec.write_text(f"provider: toy\ncloud: {tmp_path}\n")
    from infra.cli import loading

    with pytest.raises(SpecError, match="unknown provider 'toy'; choose one of local"):
        loading.load_spec(spec)
    assert NAME not in providers.names()
    with pytest.raises(ValueError, match="built in"):
        providers.unregister("local")


def _provider_packages() -> dict[str, str]:
    """Each registered provider's name by its package (`infra.providers.local`, the toy's
    `tests.toy_provider`), and the node package that goes with it (`infra.node.local`)."""
    found: dict[str, str] = {}
    for name in providers.names():
        package = providers.entry(name).provider.partition(":")[0].rpartition(".")[0]
        found[package] = name
        if package.startswith("infra.providers."):
            found["infra.node." + package.removeprefix("infra.providers.")] = name
    return found


def _docstrings(tree: ast.Module) -> set[int]:
    """The ids of the module's, classes' and functions' docstring nodes (prose may name anything)."""
    owners: list[ast.Module | ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef] = [tree]
    owners += [n for n in ast.walk(tree)
               if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    return {id(first.value) for n in owners
            if n.body and isinstance(first := n.body[0], ast.Expr)
            and isinstance(first.value, ast.Constant)}


def naming(source: str, packages: dict[str, str]) -> list[str]:
    """Where `source` (a shared module) names a provider: an import of a provider's package, a
    comparison or `match` with a provider's name, a table keyed by provider names, or a string
    (docstrings aside) holding a provider package's import path."""
    names = set(packages.values())
    tree = ast.parse(source)
    docs = _docstrings(tree)
    found = []

    def is_package(module: str) -> bool:
        return any(module == p or module.startswith(p + ".") for p in packages)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [f"import {a.name}" for a in node.names if is_package(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found += [f"from {node.module} import {a.name}" for a in node.names
                      if is_package(node.module) or is_package(f"{node.module}.{a.name}")]
        elif isinstance(node, (ast.Compare, ast.match_case)):
            found += [f"compares with {c.value!r}" for c in ast.walk(node)
                      if isinstance(c, ast.Constant) and c.value in names]
        elif isinstance(node, ast.Dict):
            keyed = sorted(names & {k.value for k in node.keys if isinstance(k, ast.Constant)})
            if len(keyed) > 1:
                found.append(f"a table keyed by {keyed}")
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str)
              and id(node) not in docs and any(p in node.value for p in packages)):
            found.append(f"the string {node.value!r}")
    return found


def shared_modules() -> list[Path]:
    """infra/'s modules outside every provider's own packages and the registry's row table."""
    own = [ROOT / Path(*p.split(".")) for p in _provider_packages()]
    registry = ROOT / "infra" / "providers" / "__init__.py"
    return [p for p in sorted((ROOT / "infra").rglob("*.py"))
            if p != registry and not any(p.is_relative_to(d) for d in own)]


def test_shared_code_names_no_provider_so_a_fifth_changes_nothing_there(toy: None) -> None:
    packages = _provider_packages()
    assert packages["tests.toy_provider"] == NAME and packages["infra.node.slurm"] == "slurm"
    modules = shared_modules()
    assert ROOT / "infra" / "providers" / "base.py" in modules and len(modules) > 100
    found = {p.relative_to(ROOT).as_posix(): naming(p.read_text(), packages) for p in modules}
    assert {k: v for k, v in found.items() if v} == {}
    assert not [p for p in (ROOT / "infra").rglob("*.py") if "toy_provider" in p.read_text()]
    # The toy imports only what every provider stands on: no other provider's package.
    toy_sources = (ROOT / "tests" / "toy_provider").glob("*.py")
    others = {k: v for k, v in packages.items() if v != NAME}
    assert [n for p in toy_sources for n in naming(p.read_text(), others)] == []


def test_the_check_sees_what_it_looks_for(toy: None) -> None:
    packages = _provider_packages()
    branching = ('"""Names local in a docstring."""\n'
                 "from infra.providers.local import provider\n"
                 "import infra.node.gcp_tpu.api\n"
                 "from infra.node import slurm\n"
                 "if spec.provider == 'toy':\n    pass\n"
                 "if name in ('lambda', 'x'):\n    pass\n"
                 "ports = {'local': 1, 'slurm': 2}\n"
                 "action = 'infra.node.local.autodown:remove'\n")
    assert naming(branching, packages) == [
        "from infra.providers.local import provider", "import infra.node.gcp_tpu.api",
        "from infra.node import slurm", "compares with 'toy'", "compares with 'lambda'",
        "a table keyed by ['local', 'slurm']", "the string 'infra.node.local.autodown:remove'"]
    assert naming('"""local, slurm and infra.node.local: prose."""\nDEFAULT = "local"\n',
                  packages) == []
