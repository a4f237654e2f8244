"""The provider registry: one explicit table, name -> spec class, provider class, sweeper.

Each entry names its classes by import path ("module:Class") and is imported only when that
provider is used, so `invoke --list` and the other providers' users pay nothing for it (Google's
SDK, paramiko). A new provider is one row here and one package (see ARCHITECTURE.md), or a row
`register` adds at run time. Spec loading (infra/cli/loading.py) sits above this table; the core
(infra/core, infra/node) never imports it.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.core.spec import ClusterSpec
    from infra.providers.base import Provider, Sweeper


@dataclass(frozen=True)
class Entry:
    """One provider: where its spec class, provider class and leak sweeper (if any) live."""

    spec: str
    provider: str
    sweeper: str | None = None


_TABLE: dict[str, Entry] = {
    "local": Entry("infra.providers.local.spec:Spec",
                   "infra.providers.local.provider:Provider"),
    "gcp-tpu": Entry("infra.providers.gcp_tpu.spec:Spec",
                     "infra.providers.gcp_tpu.provider:Provider",
                     "infra.providers.gcp_tpu.sweep:Sweeper"),
    "lambda": Entry("infra.providers.lambda_cloud.spec:Spec",
                    "infra.providers.lambda_cloud.provider:Provider",
                    "infra.providers.lambda_cloud.sweep:Sweeper"),
    "slurm": Entry("infra.providers.slurm.spec:Spec",
                   "infra.providers.slurm.provider:Provider"),
}
_BUILT_IN = frozenset(_TABLE)


def names() -> list[str]:
    return list(_TABLE)


def register(name: str, row: Entry) -> None:
    """Add a provider that lives outside this table (a plugin of one's own, the tests' toy):
    from here on specs may say `provider: <name>` and every verb reaches its classes. The core
    asks this table, never a provider's name, so nothing else changes."""
    if name in _TABLE and _TABLE[name] != row:
        raise ValueError(f"provider {name!r} is registered already ({_TABLE[name].provider}); "
                         "choose another name or unregister it first")
    _TABLE[name] = row


def unregister(name: str) -> None:
    """Remove a provider `register` added (the built-in rows stay)."""
    if name in _BUILT_IN:
        raise ValueError(f"provider {name!r} is built in; it cannot be unregistered")
    _TABLE.pop(name, None)


def entry(name: str) -> Entry:
    if name not in _TABLE:
        raise KeyError(f"unknown provider {name!r}; choose one of {', '.join(_TABLE)}")
    return _TABLE[name]


def _load(path: str) -> Any:
    module, _, attribute = path.partition(":")
    return getattr(importlib.import_module(module), attribute)


def spec_class(name: str) -> type[ClusterSpec]:
    cls: type[ClusterSpec] = _load(entry(name).spec)
    return cls


def create(spec: ClusterSpec) -> Provider[Any, Any]:
    provider: Provider[Any, Any] = _load(entry(spec.provider).provider)(spec)
    return provider


def sweeper(name: str) -> Sweeper | None:
    """The provider's leak sweeper, or None if it has none."""
    path = entry(name).sweeper
    if path is None:
        return None
    instance: Sweeper = _load(path)()
    return instance
