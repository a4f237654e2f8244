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
- A section inside a file (an entry of the gateway's members file) is a `Wire` dataclass too,
  without a version of its own (its file has one).
- A dataclass with an `absent` field (ABSENT) writes back an optional field the file did not have
  only once it no longer holds its default: files that code elsewhere reads as dicts, where a
  missing key and a null are not the same (`entry.get("id", fallback)`), keep their keys as read.

Standard library only: this ships to heads in the node package.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from infra.node.errors import RayfleetError
from infra.node.files import atomic_write

VERSION = 1
#: The field that holds unknown keys (not itself a key in the file).
EXTRA = "extra"
#: The field that names the optional fields a file did not have (not itself a key in the file).
ABSENT = "absent"

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
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        names = {f.name for f in fields} - {EXTRA, ABSENT}
        known = {k: v for k, v in data.items() if k in names}
        if "version" in names:
            known.setdefault("version", 0)
        missing = [f.name for f in fields
                   if f.name not in known and f.name not in (EXTRA, ABSENT)
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise WireError(f"{cls.KIND}: field {missing[0]!r} is missing; the file is damaged or "
                            "was not written by rayfleet: write it again (`invoke up`)")
        if ABSENT in {f.name for f in fields}:
            known[ABSENT] = frozenset(names - set(data) - {"version"})
        return cls(**known, **{EXTRA: {k: v for k, v in data.items() if k not in names}})

    @classmethod
    def from_json(cls: type[W], text: str) -> W:
        """`from_dict` of a file's text; ValueError (json's) when it is no JSON at all."""
        return cls.from_dict(json.loads(text))

    def to_dict(self) -> dict[str, Any]:
        """The file's JSON object: every field, then the unknown keys it was read with."""
        absent: frozenset[str] = getattr(self, ABSENT, frozenset())
        data = {f.name: getattr(self, f.name)
                for f in dataclasses.fields(self)  # type: ignore[arg-type]
                if f.name not in (EXTRA, ABSENT)
                and not (f.name in absent and getattr(self, f.name) == _default(f))}
        extra: dict[str, Any] = getattr(self, EXTRA)
        return {**data, **{k: v for k, v in extra.items() if k not in data}}

    def to_json(self, indent: int | None = 2) -> str:
        """The file's text as its writers always wrote it (`json.dumps`, no trailing newline)."""
        return json.dumps(self.to_dict(), indent=indent)

    def write(self, path: Path | str, mode: int | None = None) -> None:
        """The file (`to_json`) replaced all or nothing (infra/node/files.py `atomic_write`)."""
        atomic_write(path, self.to_json(), mode)


def _default(field: Any) -> Any:
    """A dataclass field's default value (a fresh one from its factory)."""
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return field.default
