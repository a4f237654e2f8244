"""A `Validator` (tests/fakes/http.py) from an OpenAPI 3.1 document, on jsonschema (Draft 2020-12, the
dialect of OpenAPI 3.1 schemas) and werkzeug's URL routing: no hand-written checker.

Requests: the operation exists (path and method), path and query parameters are declared and match
their schemas, the JSON body matches the operation's request schema. Answers: the status is one the
operation documents and the body matches that status's schema. `close_objects` makes every
component object schema that leaves `additionalProperties` unsaid closed (no unknown fields either
way): the reference's schemas are open, and an unknown field we send is a typo Lambda would
silently ignore (see infra/providers/lambda_cloud/NOTES.md).
"""

from __future__ import annotations

import copy
import ipaddress
import json
import re
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator, FormatChecker
from jsonschema.exceptions import ValidationError, best_match
from referencing import Registry, Resource
from referencing.jsonschema import DRAFT202012
from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule

from tests.fakes.http import NOT_JSON, Violation

_METHODS = ("get", "put", "post", "patch", "delete")
_BASE = "urn:openapi"

FORMATS = FormatChecker()


@FORMATS.checks("ipv4network", raises=ValueError)
def _ipv4network(value: object) -> bool:
    if isinstance(value, str):
        ipaddress.IPv4Network(value, strict=False)
    return True


def _close(schema: Any) -> None:
    if isinstance(schema, dict):
        if schema.get("type") == "object" and "properties" in schema \
                and "additionalProperties" not in schema:
            schema["additionalProperties"] = False
        for value in schema.values():
            _close(value)
    elif isinstance(schema, list):
        for value in schema:
            _close(value)


def _pointer(*parts: str) -> str:
    return "/".join(p.replace("~", "~0").replace("/", "~1") for p in parts)


class OpenApiValidator:
    def __init__(self, document: Path, prefix: str = "", close_objects: bool = True) -> None:
        spec = json.loads(document.read_text())
        if close_objects:
            spec = copy.deepcopy(spec)
            _close(spec.get("components", {}).get("schemas", {}))
        self.spec = spec
        self.prefix = prefix
        self._registry: Registry[Any] = Registry().with_resource(
            _BASE, Resource.from_contents(spec, default_specification=DRAFT202012))
        rules = []
        for template, ops in spec["paths"].items():
            if not template.startswith(prefix):
                continue
            rule = re.sub(r"\{(\w+)\}", r"<\1>", template[len(prefix):])
            methods = [m.upper() for m in ops if m in _METHODS]
            rules.append(Rule(rule, endpoint=template, methods=methods))
        self._urls = Map(rules).bind("fake")
        self._validators: dict[str, Draft202012Validator] = {}

    # --- lookups ---------------------------------------------------------------------------------

    def operation(self, method: str, path: str) -> tuple[str, dict[str, Any], dict[str, str]] | None:
        """(path template, operation object, path arguments), or None if the API has no such call."""
        try:
            template, args = self._urls.match(path, method=method)
        except HTTPException:
            return None
        return str(template), self.spec["paths"][template][method.lower()], dict(args)

    def documented_errors(self, method: str, template: str) -> list[tuple[int, str, dict[str, Any]]]:
        """(status, error code, error schema) of every error response the operation documents."""
        out = []
        for status, response in self.spec["paths"][template][method.lower()]["responses"].items():
            if int(status) < 400:
                continue
            schema = response["content"]["application/json"]["schema"]["properties"]["error"]
            for ref in schema.get("anyOf", [schema]):
                error = self._resolve(ref["$ref"])
                out.append((int(status), str(error["properties"]["code"]["const"]), error))
        return out

    def _resolve(self, ref: str) -> dict[str, Any]:
        node: Any = self.spec
        for part in ref.lstrip("#/").split("/"):
            node = node[part.replace("~1", "/").replace("~0", "~")]
        return dict(node)

    def _validator(self, pointer: str) -> Draft202012Validator:
        if pointer not in self._validators:
            self._validators[pointer] = Draft202012Validator(
                {"$ref": f"{_BASE}#/{pointer}"}, registry=self._registry, format_checker=FORMATS)
        return self._validators[pointer]

    def _errors(self, pointer: str, value: Any, direction: str, method: str,
                path: str, where: str = "$") -> list[Violation]:
        out = []
        for error in self._validator(pointer).iter_errors(value):
            best: ValidationError = best_match([error]) or error
            field = where + best.json_path[1:]
            out.append(Violation(direction, method, path, field, str(best.validator),
                                 best.message[:300]))
        return out

    # --- the Validator protocol ------------------------------------------------------------------

    def check_request(self, method: str, path: str, query: dict[str, str],
                      body: Any) -> list[Violation]:
        found = self.operation(method, path)
        if found is None:
            return [Violation("request", method, path, "$", "operation",
                              "no such operation in the reference")]
        template, op, args = found
        where = _pointer("paths", template, method.lower())
        out: list[Violation] = []
        params = {(p["in"], p["name"]): (i, p) for i, p in enumerate(op.get("parameters", []))}
        for kind, values in (("path", args), ("query", query)):
            for name, value in values.items():
                entry = params.get((kind, name))
                if entry is None:
                    out.append(Violation("request", method, path, f"{kind}:{name}", "parameters",
                                         "not a parameter of this operation"))
                    continue
                if entry[1].get("schema", {}).get("type", "string") == "string":
                    out += self._errors(f"{where}/parameters/{entry[0]}/schema", value,
                                        "request", method, path, f"{kind}:{name}")
        body_spec = op.get("requestBody")
        if body is NOT_JSON:
            out.append(Violation("request", method, path, "$", "type", "the body is not JSON"))
        elif body_spec is None:
            if body is not None:
                out.append(Violation("request", method, path, "$", "requestBody",
                                     "this operation takes no body"))
        elif body is None:
            if body_spec.get("required"):
                out.append(Violation("request", method, path, "$", "required", "a body is required"))
        else:
            out += self._errors(f"{where}/requestBody/content/application~1json/schema", body,
                                "request", method, path)
        return out

    def check_response(self, method: str, path: str, status: int, body: Any) -> list[Violation]:
        found = self.operation(method, path)
        if found is None:
            return [Violation("response", method, path, "$", "operation",
                              f"HTTP {status} sent for an operation the reference lacks")]
        template, op, _ = found
        if str(status) not in op["responses"]:
            return [Violation("response", method, path, "$", "status",
                              f"HTTP {status} is not documented for this operation "
                              f"(documented: {', '.join(op['responses'])})")]
        where = _pointer("paths", template, method.lower(), "responses", str(status), "content",
                         "application/json", "schema")
        return self._errors(where, body, "response", method, path)
