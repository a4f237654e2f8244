"""The provider interface's own rules, with a toy provider over a real state file: a plan is a
frozen hand-off, and a failed `up` follows the one rollback policy of infra/providers/base.py.

The toy records what it is asked to remove; each real provider's hooks (`created`,
`remove_created`) are exercised against its fakes in tests/gcp_tpu, tests/lambda_cloud, tests/slurm.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from infra.cli import loading
from infra.core import spec, state
from infra.core.errors import RayfleetError, UsageError
from infra.core.progress import Step, ignore
from infra.core.state import Attrs, Resource, State
from infra.providers.base import Endpoint, Plan, PlannedResource, ProviderStatus, UpOptions
from infra.providers.base import Provider as BaseProvider


class Thing(Attrs):
    """A toy resource: shared code reads only its kind, id and name."""

    KIND = "toy-thing"


class Toy(BaseProvider[spec.ClusterSpec, tuple[str, ...]]):
    """`create` records the plan's things one by one, then fails with `failure` (if set)."""

    name = "toy"

    def __init__(self, loaded: spec.ClusterSpec, failure: BaseException | None = None,
                 remove_fails: bool = False) -> None:
        super().__init__(loaded)
        self.failure = failure
        self.remove_fails = remove_fails
        self.removed: list[str] = []
        self.torn_down = False

    def plan(self, state: State | None) -> Plan[tuple[str, ...]]:
        return Plan(resources=[PlannedResource(Thing.KIND, "a")], files={"f": "text"}, extra=("a", "b"))

    def create(self, state: State, plan: Plan[tuple[str, ...]]) -> Endpoint:
        for thing in plan.extra:
            state.add(thing, Thing(name=f"thing-{thing}"))
        if self.failure is not None:
            raise self.failure
        return Endpoint("http://127.0.0.1:1", "127.0.0.1:2")

    def remove_created(self, state: State, created: list[Resource[Attrs]]) -> None:
        if self.remove_fails:
            raise RayfleetError("the API is down")
        for r in created:
            self.removed.append(r.id)
            state.remove(r.kind, r.id)

    def teardown(self, state: State) -> None:
        self.torn_down = True
        for r in state.resources():
            state.remove(r.kind, r.id)

    def status(self, state: State) -> ProviderStatus:
        return ProviderStatus(False, "toy")

    def connect(self, state: State) -> AbstractContextManager[Endpoint]:
        raise NotImplementedError


@pytest.fixture
def loaded(tmp_path: Path) -> spec.ClusterSpec:
    path = tmp_path / "toy.yaml"
    path.write_text("provider: local\n")
    return loading.load_spec(path)


@pytest.fixture
def current(rf_home: Path) -> Iterator[State]:
    with state.locked("toy", "local", "up") as locked:
        locked.add("old", Thing(name="thing-old"))  # there before this run
        yield locked


def ids(current: State) -> list[str]:
    return [r.id for r in current.resources()]


def test_a_plan_is_frozen(loaded: spec.ClusterSpec) -> None:
    plan = Toy(loaded).plan(None)
    with pytest.raises(TypeError):
        plan.files["f"] = "changed"  # type: ignore[index]
    with pytest.raises(AttributeError):
        plan.extra = ("c",)  # type: ignore[misc]
    assert isinstance(plan.resources, tuple) and isinstance(plan.notes, tuple)


def _warned(steps: list[Step]) -> str:
    """The rollback's warnings, as the library reported them (the CLI prints them on stderr)."""
    return "\n".join(s.text for s in steps if s.kind == "warn")


def test_failed_up_removes_what_the_run_created_and_nothing_else(
        loaded: spec.ClusterSpec, current: State) -> None:
    toy, steps = Toy(loaded, failure=RayfleetError("no capacity")), list[Step]()
    with pytest.raises(RayfleetError, match="no capacity"):
        toy.up(current, toy.plan(current), UpOptions(progress=steps.append))
    assert toy.removed == ["a", "b"] and ids(current) == ["old"]
    assert ("the cluster could not be completed (no capacity); terminating what this run "
            "created: thing-a, thing-b (--keep-partial keeps them)") in _warned(steps)


def test_ctrl_c_removes_too(loaded: spec.ClusterSpec, current: State) -> None:
    toy, steps = Toy(loaded, failure=KeyboardInterrupt()), list[Step]()
    with pytest.raises(KeyboardInterrupt):
        toy.up(current, toy.plan(current), UpOptions(progress=steps.append))
    assert toy.removed == ["a", "b"] and ids(current) == ["old"]
    assert "interrupted; removing what this run created: thing-a, thing-b" in _warned(steps)


def test_keep_partial_keeps_everything_in_state(loaded: spec.ClusterSpec, current: State) -> None:
    toy, steps = Toy(loaded, failure=RayfleetError("boom")), list[Step]()
    with pytest.raises(RayfleetError, match="boom"):
        toy.up(current, toy.plan(current), UpOptions(keep_partial=True, progress=steps.append))
    assert toy.removed == [] and ids(current) == ["old", "a", "b"]
    assert "kept thing-a, thing-b (--keep-partial)" in _warned(steps)


def test_a_removal_that_fails_keeps_state_and_names_teardown(
        loaded: spec.ClusterSpec, current: State) -> None:
    toy, steps = Toy(loaded, failure=RayfleetError("boom"), remove_fails=True), list[Step]()
    with pytest.raises(RayfleetError, match="boom"):  # the first failure, not the cleanup's
        toy.up(current, toy.plan(current), UpOptions(progress=steps.append))
    assert ids(current) == ["old", "a", "b"]
    err = _warned(steps)
    assert "the API is down" in err and "`invoke teardown` removes it" in err


def test_a_run_that_created_everything_is_torn_down_whole_by_default(
        loaded: spec.ClusterSpec, rf_home: Path) -> None:
    class Plain(Toy):
        remove_created = BaseProvider.remove_created  # type: ignore[assignment]

    toy = Plain(loaded, failure=RayfleetError("boom"))
    with state.locked("plain", "local", "up") as fresh, pytest.raises(RayfleetError):
        toy.up(fresh, toy.plan(fresh))
    assert toy.torn_down
    # With something from before in state, the default refuses rather than touch it.
    toy = Plain(loaded, failure=RayfleetError("boom"))
    with state.locked("plain", "local", "up") as fresh, pytest.raises(RayfleetError):
        fresh.add("old", Thing())
        toy.up(fresh, toy.plan(fresh))
    assert not toy.torn_down and ids(fresh) == ["old", "a", "b"]


def test_success_removes_nothing(loaded: spec.ClusterSpec, current: State) -> None:
    toy = Toy(loaded)
    assert toy.up(current, toy.plan(current)).address == "127.0.0.1:2"
    assert toy.removed == [] and ids(current) == ["old", "a", "b"]


def test_restart_ray_recreates_only_where_the_provider_says_so(
        loaded: spec.ClusterSpec, current: State) -> None:
    """rotate-token's restart is the base's: `teardown` then `up` where that restarts Ray alone
    (`restarts_by_recreating`), else one line naming the way to a new token."""
    toy = Toy(loaded)
    with pytest.raises(UsageError, match=r"rotate-token: not available on the toy provider.*"
                                         r"`invoke teardown` then `invoke up`"):
        toy.restart_ray(current, ignore)
    assert not toy.torn_down and ids(current) == ["old"]

    class Recreating(Toy):
        restarts_by_recreating = True

    toy = Recreating(loaded)
    assert toy.restart_ray(current, ignore).address == "127.0.0.1:2"
    # Everything went (the old thing too), then the plan's things were made again.
    assert toy.torn_down and ids(current) == ["a", "b"]
