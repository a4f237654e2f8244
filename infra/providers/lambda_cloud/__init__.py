"""The `lambda` provider: Lambda Cloud instances running one Ray cluster.

`Provider` and `Spec` (what infra/providers/__init__.py asks every provider for) are imported on
first use, so that `infra.node.lambda_cloud.node_provider` imports on a cluster's head with
only Ray, requests and our small core modules (no pydantic, paramiko, rich or invoke there).
See provider.py for the verbs (with planning.py: what `plan` works out; provisioning.py: the
instances at `up`) and NOTES.md for what surprises newcomers.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Provider", "Spec"]


def __getattr__(name: str) -> Any:
    if name == "Provider":
        return importlib.import_module(f"{__name__}.provider").Provider
    if name == "Spec":
        return importlib.import_module(f"{__name__}.spec").Spec
    raise AttributeError(name)
