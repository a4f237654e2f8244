"""What every use case needs of a cluster: how a hint names it again, its state when it must be
running, the one check of a spec against its provider's capabilities, and its endpoint."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from infra import providers
from infra.core import paths, spec, state
from infra.core.errors import ClusterNotRunningError, RayfleetError, SpecError
from infra.core.sharing import owner as sharing
from infra.core.state import State
from infra.providers.base import Endpoint, Provider


def cluster_flag(selected: spec.ClusterSpec) -> str:
    """The options that name this cluster again in a hint (`invoke up{flag}`)."""
    default = paths.clusters_dir() / f"{selected.provider}.yaml"
    if spec.spec_path(selected.name) == default and selected.provider == spec.DEFAULT_PROVIDER:
        return ""
    if spec.spec_path(selected.name) == default:
        return f" --provider={selected.provider}"
    return f" --cluster={selected.source}"


def running(selected: spec.ClusterSpec) -> State:
    current = state.read(selected.name)
    if current is None or current.empty:
        raise ClusterNotRunningError(
            f"cluster {selected.name!r} has no state; start it with "
            f"`invoke up{cluster_flag(selected)}`"
        )
    return current


def refuse_what_the_provider_lacks(selected: spec.ClusterSpec) -> None:
    """The one check of a spec against its provider's table (infra/core/capabilities.py), before
    `plan` or `up` does anything: a key the provider cannot honour is a SpecError in one line
    naming it (sharing's own part, its gateway and its users, is `sharing.check_spec`). Metrics
    alone are not refused: `up` warns and the cluster runs without them."""
    sharing.check_spec(selected)
    if selected.tracking != "none" and not type(selected).CAPABILITIES.tracking:
        raise SpecError(f"{selected.source}: tracking: {selected.tracking} is not available on the "
                        f"{selected.provider} provider yet; remove the key (see "
                        "docs/train-track-serve.md)")


def head_or_none(impl: Provider[Any, Any], current: State) -> Any:
    """How to reach the head, or None once it is gone (teardown goes on without it)."""
    try:
        return impl.head_access(current)
    except RayfleetError:
        return None


@contextmanager
def connect(selected: spec.ClusterSpec) -> Iterator[Endpoint]:
    """The running cluster's endpoint for the length of a `with` block (a tunnel if remote);
    ClusterNotRunningError when it has no state."""
    impl = providers.create(selected)
    with impl.connect(running(selected)) as endpoint:
        yield endpoint
