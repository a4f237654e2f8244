"""Compute Engine list filters, as far as rayfleet and Ray's GCP provider write them.

Ray sends e.g. `((labels.ray-node-kind = worker)) AND ((status = RUNNING) OR (status = STAGING))
AND (labels.ray-cluster-name = c) AND (NOT labels.tpu_cores:*)`; rayfleet sends
`(labels.k = v) AND ...`. The grammar (AIP-160): AND of ORs of [NOT] terms, parentheses, and the comparisons
`field = value` and `field:*` (has the field). Anything else is Google's 400 "Invalid list filter
expression", so a caller writing a filter the real API would refuse fails here too.
"""

from __future__ import annotations

import re
from typing import Any

_TOKEN = re.compile(r"\s*(\(|\)|=|:\*|[A-Za-z0-9_.\-]+)")


class FilterError(ValueError):
    pass


def _tokens(expression: str) -> list[str]:
    found, pos = [], 0
    text = expression.strip()
    while pos < len(text):
        match = _TOKEN.match(text, pos)
        if not match:
            raise FilterError(expression)
        found.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return found


def _field(resource: dict[str, Any], name: str) -> Any:
    value: Any = resource
    for part in name.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def matches(expression: str, resource: dict[str, Any]) -> bool:
    """Whether `resource` passes `expression`; FilterError for what the API would refuse."""
    if not expression.strip():
        return True
    tokens = _tokens(expression)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise FilterError(expression)
        pos += 1
        return tokens[pos - 1]

    # AIP-160: OR binds tighter than AND (`a AND b OR c` is `a AND (b OR c)`).
    def conjunction() -> bool:
        value = disjunction()
        while peek() == "AND":
            take()
            value = disjunction() and value
        return value

    def disjunction() -> bool:
        value = unary()
        while peek() == "OR":
            take()
            value = unary() or value
        return value

    def unary() -> bool:
        if peek() == "NOT":
            take()
            return not unary()
        if peek() == "(":
            take()
            value = conjunction()
            if take() != ")":
                raise FilterError(expression)
            return value
        name = take()
        operator = take()
        if operator == ":*":
            return _field(resource, name) is not None
        if operator != "=":
            raise FilterError(expression)
        wanted = take()
        actual = _field(resource, name)
        return actual is not None and str(actual) == wanted

    result = conjunction()
    if pos != len(tokens):
        raise FilterError(expression)
    return result
