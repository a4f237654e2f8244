"""Registry of providers: name -> module, imported only when that provider is used.

The core never imports a provider (or its cloud SDK) until a spec names it, so `invoke --list` and
the other providers' users pay nothing for it. Each module exposes `Spec` (its strict section of
the cluster spec) and `Provider` (an implementation of `infra.providers.base.Provider`).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from infra.providers.base import Provider, Sweeper
    from infra.spec import ClusterSpec

_MODULES = {
    "local": "infra.providers.local",
    "gcp-tpu": "infra.providers.gcp_tpu",
    "lambda": "infra.providers.lambda_cloud",
    "slurm": "infra.providers.slurm",
}


def names() -> list[str]:
    return list(_MODULES)


def _module(name: str) -> Any:
    if name not in _MODULES:
        raise KeyError(f"unknown provider {name!r}; choose one of {', '.join(_MODULES)}")
    return importlib.import_module(_MODULES[name])


def spec_class(name: str) -> type[ClusterSpec]:
    cls: type[ClusterSpec] = _module(name).Spec
    return cls


def create(spec: ClusterSpec) -> Provider[Any, Any]:
    provider: Provider[Any, Any] = _module(spec.provider).Provider(spec)
    return provider


def sweeper(name: str) -> Sweeper | None:
    """The provider's leak sweeper (`<its package>.sweep.Sweeper`), or None if it has none."""
    module = _MODULES[name] + ".sweep"
    try:
        found = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # the provider is a single module, not a package
        return None
    if found is None:
        return None
    instance: Sweeper = importlib.import_module(module).Sweeper()
    return instance
