"""A spec's validation errors (pydantic's) as one line each: the field's place in the file, the
problem and the fix, with a did-you-mean for typos (infra/core/spec.py raises them as SpecError)."""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Union

from pydantic import BaseModel


def did_you_mean(word: str, choices: typing.Iterable[str]) -> str:
    """`did you mean 'x'?` for the choice closest to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"did you mean {close[0]!r}?" if close else ""


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The nested model class that a pydantic error location points into."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel):
            field = current.model_fields.get(str(part))
            if field is None:
                return None
            # Only Optional is unwrapped here; the next part (index or key) unwraps list/dict.
            current = _unwrap(field.annotation, None)
        else:
            current = _unwrap(current, part)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any, part: Any) -> Any:
    """Step through Optional/list/dict wrappers to the model they hold."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (Union, types.UnionType):
        models = [a for a in args if a is not type(None)]
        return _unwrap(models[0], part) if len(models) == 1 else annotation
    if origin in (list, tuple) and isinstance(part, int):
        return args[0]
    if origin is dict and args and part is not None:
        return args[1]
    return annotation


def _where(loc: tuple[Any, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top level)"


def describe_error(model: type[BaseModel], error: Any) -> str:
    """One pydantic error as 'field: problem; fix'."""
    loc = tuple(error["loc"])
    kind = error["type"]
    where = _where(loc)
    if kind == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        valid = [f for f in (parent.model_fields if parent else {}) if f not in ("name", "source")]
        hint = did_you_mean(str(loc[-1]), valid)
        listed = ", ".join(valid)
        return f"{where}: unknown key; {hint + ' ' if hint else ''}valid keys here: {listed}"
    if kind == "missing":
        return f"{where}: required key is missing; add it"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    message = message[:1].lower() + message[1:]
    if kind == "literal_error":
        expected = typing.get_args(_field_annotation(model, loc)) or ()
        hint = did_you_mean(str(error.get("input")), [str(e) for e in expected])
        message += f" ({hint})" if hint else ""
    if kind != "value_error" and "input" in error and not isinstance(error["input"], dict):
        message += f", got {error['input']!r}"
    return f"{where}: {message}"


def _field_annotation(model: type[BaseModel], loc: tuple[Any, ...]) -> Any:
    parent = _model_at(model, loc[:-1])
    field = parent.model_fields.get(str(loc[-1])) if parent else None
    return field.annotation if field else None



def misspelt_required(errors: list[Any]) -> str | None:
    """A required key reported missing next to an unknown key that looks like it (`idle_minute`
    for idle_minutes, `regon` for region): name the typo, not only the missing key."""
    unknown = [tuple(e["loc"]) for e in errors if e["type"] == "extra_forbidden"]
    for error in errors:
        if error["type"] != "missing":
            continue
        loc = tuple(error["loc"])
        siblings = [str(u[-1]) for u in unknown if u[:-1] == loc[:-1]]
        close = difflib.get_close_matches(str(loc[-1]), siblings, n=1, cutoff=0.6)
        if close:
            return (f"{_where((*loc[:-1], close[0]))}: unknown key; did you mean "
                    f"{str(loc[-1])!r}? (a required key)")
    return None


