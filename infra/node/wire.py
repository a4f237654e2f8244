"""Typed files between the laptop and a head: the rules every such file's dataclass shares.

Each file kind (the autodown watcher's config and marker, Slurm's info file, the queued-slice
joiner's config, the tracking and metrics daemons' configs) is a standard-library dataclass next
to the code that writes it, subclassing `Wire`: readers use attributes, never string keys.

- `version`: `VERSION` in what this code writes. A file without one was written before files had
  versions (rayfleet 84e0693 and earlier) and loads as version 0, with the same meaning.
- Keys this code does not know (a newer rayfleet on the other side, or a key a launcher adds, such
  as the node package a head's daemon config names) are kept in `extra` and written back by
  `to_dict`, never refused or dropped: the laptop caches and rewrites what a head wrote (the
  autodown marker), and a newer reader must find there what its writer put in (as the state
  files do, infra/core/state.py).
- A field the file must have and lacks is one `WireError` line naming the file kind and field.

Standard library only: this ships to heads in the node package.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, TypeVar

from infra.node.errors import RayfleetError

VERSION = 1
#: The field that holds unknown keys (not itself a key in the file).
EXTRA = "extra"

W = TypeVar("W", bound="Wire")


class WireError(RayfleetError):
    """A file between the laptop and a head is not what its kind needs (a field missing)."""


class Wire:
    """Mixin of the typed files' dataclasses; each declares `version: int = VERSION` and
    `extra: dict[str, Any] = field(default_factory=dict)` (see the module's docstring)."""

    #: What the file is, for error lines ("Slurm's info file").
    KIND = "a rayfleet file"
    # Declared by every subclass as dataclass fields (this mixin is no dataclass).
    version: int
    extra: dict[str, Any]

    @classmethod
    def from_dict(cls: type[W], data: Any) -> W:
        """The dataclass of a file's JSON object; unknown keys go to `extra`."""
        if not isinstance(data, Mapping):
            raise WireError(f"{cls.KIND}: expected a JSON object, found {type(data).__name__}; "
                            "the file is damaged: write it again (`invoke up`)")
        names = {f.name for f in dataclasses.fields(cls)} - {EXTRA}  # type: ignore[arg-type]
        known = {k: v for k, v in data.items() if k in names}
        known.setdefault("version", 0)
        missing = [f.name for f in dataclasses.fields(cls)  # type: ignore[arg-type]
                   if f.name not in known and f.name != EXTRA
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise WireError(f"{cls.KIND}: field {missing[0]!r} is missing; the file is damaged or "
                            "was not written by rayfleet: write it again (`invoke up`)")
        return cls(**known, **{EXTRA: {k: v for k, v in data.items() if k not in names}})

    @classmethod
    def from_json(cls: type[W], text: str) -> W:
        """`from_dict` of a file's text; ValueError (json's) when it is no JSON at all."""
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object: every field, then the unknown keys it was read with."""
        data = {f.name: getattr(self, f.name)
                for f in dataclasses.fields(self) if f.name != EXTRA}  # type: ignore[arg-type]
        extra: dict[str, Any] = getattr(self, EXTRA)
        return {**data, **{k: v for k, v in extra.items() if k not in data}}

    def to_json(self, indent: int | None = 2) -> str:
        """The file's text as its writers always wrote it (`json.dumps`, no trailing newline)."""
        return json.dumps(self.to_dict(), indent=indent)
