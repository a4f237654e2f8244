"""Loading a cluster spec: the file, then the provider's strict section from the registry.

Commands layer: it sits above the provider registry (infra/providers/__init__.py), which names each
provider's spec class; infra/core/spec.py (core) holds the common model and checks, and never asks the
registry itself.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from infra import providers
from infra.core import spec
from infra.core.spec import ClusterSpec


def parse_spec(path: Path, data: Any) -> ClusterSpec:
    """Validate already-loaded YAML `data` as the spec of the cluster named by the file."""
    return spec.parse_spec(path, data, providers.names(), providers.spec_class)


def load_spec(path: Path) -> ClusterSpec:
    """The validated spec in `path`; one SpecError line on anything wrong."""
    return parse_spec(path, spec.read_spec(path))


def resolve(provider: str | None, cluster: str | None) -> ClusterSpec:
    """The spec `--provider`/`--cluster` select (see `spec.selected_path`)."""
    path = spec.selected_path(provider, cluster, providers.names())
    return spec.check_provider(load_spec(path), provider)
