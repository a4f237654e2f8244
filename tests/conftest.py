"""Shared test setup: isolation, no calls home, skips that fail in CI, and the two tiers.

`python -m pytest -m "not slow"` is the quick loop; a test is `slow` through its fixtures
(`SLOW_FIXTURES`, `real_daemon` below), so new tests land in the right tier without a mark.

Everything here applies before any test runs: Ray never reports usage, google-auth never probes the
GCE metadata server (pointed at a closed loopback port), and every test gets its own RAYFLEET_HOME.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: What a node's command line that runs Ray's CLI carries: the CLI as infra/node/raycli.py loads it.
STARTS_RAY = "from ray.scripts.scripts import main"


#: What a cloud node's command line that runs Ray's CLI as Ray's user carries (setup/users/ray.sh).
RAY_SCRIPT = "rayfleet/users/ray.sh"


def starts_ray(command: str) -> bool:
    """Whether a node's command line runs `ray start` (through raycli, however it is quoted, or
    through the node's ray.sh)."""
    return (re.search(r"sys\.exit\(main\(\)\)\W* start ", command) is not None
            or re.search(r"/ray\.sh\b.* start --", command) is not None)

# The multi-host test bed (sshd hosts in namespaces, real Slurm): fixtures for every test module.
pytest_plugins = ["tests.testbed.fixtures"]

# Set for this process and inherited by every subprocess (invoke, ray, sbatch) the tests start.
os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
# google-auth compares this with the lowercase string "true"; "True" would not switch the probe off.
os.environ["NO_GCE_CHECK"] = "true"
os.environ["GCE_METADATA_HOST"] = "127.0.0.1:9"
os.environ["GCE_METADATA_IP"] = "127.0.0.1:9"
os.environ.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
os.environ.pop("LAMBDA_API_KEY", None)
os.environ.pop("LAMBDALABS_API_KEY", None)
# Output is checked as a user sees it off a terminal (ui.py: nothing wraps or cuts). A COLUMNS,
# LINES or FORCE_COLOR/TTY_COMPATIBLE from the shell CI runs in (COLUMNS=80 there) would make rich
# wrap table cells at 80 columns; a test that wants a width passes COLUMNS itself.
for _terminal_var in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE"):
    os.environ.pop(_terminal_var, None)


def pytest_configure(config: pytest.Config) -> None:
    # A run started as a background job of a non-interactive shell (`cmd &`, `nohup`) inherits
    # SIGINT ignored, and so would every `invoke` the tests start: the tests that press Ctrl+C
    # (`invoke dashboard`/`mlflow` tunnels, Ctrl+C during `up`) would wait for an exit that never
    # comes. A handler (unlike SIG_IGN) is reset to the default in every program started from here.
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    config.addinivalue_line(
        "markers", "ci_may_skip: this test may skip in CI (e.g. it needs an accelerator)"
    )


#: The two tiers. `python -m pytest -m "not slow"` is the quick loop: no root, no daemon, no
#: namespace, no Slurm or sshd installed needed, in about a minute. Everything else is `slow`, and
#: lands there by its fixtures, not by hand: a test whose fixture closure holds one of these is
#: marked `slow` at collection. The test bed's fixtures are listed by name; any other fixture that
#: starts a real daemon (Ray through `invoke up`, an sshd, an MLflow server) requests
#: `real_daemon`, one that needs root (a mount, a namespace) `needs_root`, and so do tests that do
#: so in their own body. A new test that uses such a fixture needs nothing more.
SLOW_FIXTURES = frozenset({"real_daemon", "needs_root", "testbed", "make_testbed", "slurm_cluster",
                           "slurm_local"})
#: A quick test that hangs fails within three minutes (the slow tier has pyproject's 900 s); the
#: slowest quick tests (install.sh's conda path, `invoke` subprocesses) take ~10-40 s alone and
#: up to ~95 s on a 2-core machine loaded twenty times over.
QUICK_TIMEOUT_S = 180


@pytest.fixture(scope="session")
def real_daemon() -> None:
    """Request this from a fixture (or test) that starts a real daemon: Ray (`invoke up`, `ray
    start`), sshd, Slurm, an MLflow server. It does nothing itself; it puts every test that uses
    it in the slow tier (`SLOW_FIXTURES`)."""


@pytest.fixture(scope="session")
def needs_root() -> None:
    """Request this from a fixture (or test) that needs root (mounting a tmpfs, a network
    namespace): it puts every test that uses it in the slow tier, like `real_daemon`."""


def _group(path: Path) -> str:
    """The pytest-xdist group of a test file (tests/durations.py: a module, or a package sharing
    a bed)."""
    from tests.durations import group_of

    return group_of(path)


def start_order(groups: list[str], seconds: dict[str, float]) -> list[str]:
    """`groups` in the order their first tests go to the workers: those `seconds` (the recorded
    times, tests/durations.json) lacks first (a new module might be long: not left for last),
    then the recorded ones longest first; ties keep the given order."""
    return sorted(groups, key=lambda g: -seconds[g] if g in seconds else float("-inf"))


# tryfirst: pytest-xdist turns the `xdist_group` mark into the node id's `@group` suffix in its own
# pytest_collection_modifyitems, registered after this conftest and so called before it; a mark
# added later is never seen, and every test became its own group (a module's cluster built on each
# worker its tests landed on).
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tier by fixtures, and run the suite's independent groups side by side (`-n`
    in pyproject's addopts).

    A test whose fixtures (directly or through other fixtures) include one of `SLOW_FIXTURES`
    gets the `slow` mark here, before `-m "not slow"` deselects (see `real_daemon`).

    Each group (a module, or a package sharing a bed) runs whole on one worker, so module- and
    package-scoped clusters are built once. The slowest groups are handed out first (`start_order`
    on the times pytest recorded, tests/durations.json): with groups sent in collection order, a
    long group started last would decide the whole run's length.
    """
    from tests.durations import load

    groups = {item: _group(Path(str(item.path))) for item in items}
    order = start_order(list(dict.fromkeys(groups.values())), load())
    rank = {group: n for n, group in enumerate(order)}
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
        if item.get_closest_marker("slow") is None and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(QUICK_TIMEOUT_S))
        item.add_marker(pytest.mark.xdist_group(groups[item]))
    items.sort(key=lambda item: rank[groups[item]])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: Any, ids: list[str]) -> None:
    """Stop a run whose groups did not reach pytest-xdist, instead of splitting modules.

    A module's tests share one module-scoped cluster; spread over workers, each worker would build
    its own (CI's time multiplied). A worker hands back a grouped test's node id suffixed with
    `@group`.
    """
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [nodeid for nodeid in ids if "@" not in nodeid]
    if ungrouped:
        pytest.exit(
            f"pytest-xdist did not group {ungrouped[0]}: install pytest<9 "
            "(pip install -e '.[dev]'), or run with -n 0",
            returncode=4,
        )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    """Under CI=true a skip is a failure: CI must run everything the machine is built for."""
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if (
        os.environ.get("CI") == "true"
        and report.skipped
        and not hasattr(report, "wasxfail")
        and item.get_closest_marker("ci_may_skip") is None
    ):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"skipped in CI, which must run this test: {reason}"


@pytest.fixture(autouse=True)
def fake_api_contract() -> Iterator[None]:
    """Fail the test during which any HTTP fake received a request, or sent an answer, that its
    API's published definition rejects (tests/fakes/http.py), naming the field and the rule."""
    from tests.fakes.http import FakeHttpServer

    yield
    found = list(dict.fromkeys(str(v) for server in list(FakeHttpServer.live)
                               for v in server.take_violations()))
    if found:
        pytest.fail("the fake API's reference was broken:\n  " + "\n  ".join(found[:20]),
                    pytrace=False)


@pytest.fixture
def rf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private RAYFLEET_HOME (state, rendered files, keys) for one test."""
    home = tmp_path / "rayfleet-home"
    monkeypatch.setenv("RAYFLEET_HOME", str(home))
    return home


@contextlib.contextmanager
def held_url(*args: str, env: dict[str, str] | None = None) -> Iterator[str]:
    """`invoke ARGS` that prints a URL and holds its tunnel until Ctrl+C (`dashboard`, `mlflow`):
    the URL, while the command runs; Ctrl+C at the end, as a user would."""
    held = subprocess.Popen([sys.executable, "-m", "invoke", *args], cwd=ROOT,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert held.stdout is not None
        url = held.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:"), (url, held.stderr and held.stderr.read())
        yield url
    finally:
        held.send_signal(signal.SIGINT)
        held.wait(timeout=30)


def run_invoke(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
               cwd: Path = ROOT, input: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run `invoke ARGS` as a user would (a real subprocess), capturing its output."""
    return subprocess.run(
        [sys.executable, "-m", "invoke", *args],
        cwd=cwd, env={**os.environ, **(env or {})}, capture_output=True, text=True,
        timeout=timeout, input=input, check=False,
    )


def run_rayfleet(*args: str, env: dict[str, str] | None = None, timeout: float = 300,
                 cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run `rayfleet ARGS` (`python -m infra`, the installed command) as a user would."""
    return subprocess.run(
        [sys.executable, "-m", "infra", *args],
        cwd=cwd, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, capture_output=True,
        text=True, timeout=timeout, check=False,
    )


def assert_spec_keeps_the_file(spec: Any, path: Path) -> None:
    """`spec` (a loaded spec model) says what the YAML file at `path` says, key for key: its name
    is the file's, and no value of the file was dropped, renamed or replaced by a default."""
    import yaml

    def given(value: Any) -> Any:
        if hasattr(value, "model_dump"):
            return value.model_dump(exclude_unset=True)
        if isinstance(value, list):
            return [given(v) for v in value]
        if isinstance(value, dict):
            return {k: given(v) for k, v in value.items()}
        return value

    assert spec.name == path.stem
    written = yaml.safe_load(path.read_text())
    differ = {key: (value, given(getattr(spec, key, None))) for key, value in written.items()
              if given(getattr(spec, key, None)) != value}
    assert differ == {}, f"{path.name}: (file, loaded) differ: {differ}"
