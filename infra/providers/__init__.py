"""The provider registry: one explicit table, name -> spec class, provider class, sweeper.

Each entry names its classes by import path ("module:Class") and is imported only when that
provider is used, so `invoke --list` and the other providers' users pay nothing for it (Google's
SDK, paramiko). A new provider is one row here and one package (see ARCHITECTURE.md). Spec loading
(infra/cli/loading.py) sits above this table; the core (infra/*.py) never imports it.
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


def names() -> list[str]:
    return list(_TABLE)


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
