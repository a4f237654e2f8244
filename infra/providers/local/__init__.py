"""The `local` provider: a real Ray cluster on this machine, no account needed.

`Provider` and `Spec` (what the registry in infra/providers/__init__.py asks for) load on first
use, like every provider package. provider.py holds the verbs; the autodown action is
infra/node/local/autodown.py (it runs in the watcher beside the head, on this machine).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Provider", "Spec"]


def __getattr__(name: str) -> Any:
    if name in ("Provider", "Spec"):
        return getattr(importlib.import_module(f"{__name__}.provider"), name)
    raise AttributeError(name)
