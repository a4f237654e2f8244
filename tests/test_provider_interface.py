"""The provider interface stays small and each feature stays written once (ARCHITECTURE.md, "The
interfaces"): the `Provider` base has few methods a provider may override, none of them a feature
hook; the head's services are started by the base (infra/providers/features.py), not by a
`*_setup.py` module per provider; and only infra/core/head*.py builds an SSH head by hand.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from infra.providers.base import Provider
from tests.conftest import ROOT

#: `restart_ray` (rotate-token's) is the base's, from the provider's `restarts_by_recreating`.
MOST_OVERRIDABLE = 12
#: Hooks of one feature each, which the base now runs from the providers' small answers.
FEATURE_HOOKS = {"copy_tracking", "autodown_fetch", "autodown_left", "autodown_report",
                 "with_autodown", "node_prices"}


def _final(member: object) -> bool:
    target = member.fget if isinstance(member, property) else member
    return bool(getattr(target, "__final__", False))


def overridable() -> list[str]:
    """The public methods and properties of `Provider` that a provider may override (not
    marked `typing.final`)."""
    return [name for name, member in vars(Provider).items()
            if not name.startswith("_") and (inspect.isfunction(member) or isinstance(member, property))
            and not _final(member)]


def test_the_provider_base_has_few_overridable_methods_and_no_feature_hook() -> None:
    names = overridable()
    assert {"plan", "create", "status", "connect", "teardown"} <= set(names), names
    assert len(names) <= MOST_OVERRIDABLE, names
    assert FEATURE_HOOKS.isdisjoint(names), names
    assert not FEATURE_HOOKS & set(dir(Provider)), "a feature hook came back on the base"
    # `up` (create, then the head's services, under the rollback policy) is the base's alone.
    assert "up" not in names and "capabilities" not in names


def test_no_setup_module_and_no_hand_built_ssh_head_outside_core_head() -> None:
    infra = ROOT / "infra"
    assert sorted(p.relative_to(ROOT).as_posix() for p in infra.rglob("*_setup.py")) == []
    calls = re.compile(r"\bssh_head\(")
    outside = [p.relative_to(ROOT).as_posix() for p in infra.rglob("*.py")
               if not (p.parent.name == "core" and p.name.startswith("head"))
               and calls.search(p.read_text())]
    assert outside == []


def test_the_counts_above_can_fail(tmp_path: Path) -> None:
    """The checks see what they look for: a subclass's own methods are not the base's, and the
    pattern finds a call."""
    class Extra(Provider):  # type: ignore[type-arg]
        def copy_tracking(self) -> None: ...

    assert "copy_tracking" in vars(Extra) and "copy_tracking" not in overridable()
    assert re.search(r"\bssh_head\(", "head = ssh_head(target)")
    assert _final(vars(Provider)["up"]) and not _final(vars(Provider)["plan"])
