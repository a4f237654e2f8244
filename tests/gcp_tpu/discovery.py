"""Google's discovery documents as the contract of the fake, checked both ways.

The documents are copies of the ones google-api-python-client ships (tests/data/google-discovery,
README there), the same ones the product builds its clients from. `Contract.request` finds the
method for a path and verb (the document's `flatPath`), checks path parameters against their
patterns, query parameters against the method's and the API's parameters (unknown ones, types,
enums, patterns, minimum/maximum, required), and the body against the method's request schema;
`Contract.response` checks what the fake answers against the method's response schema, and every
error against Google's error envelope (AIP-193, `error_schema.json` beside the documents).

Schemas are converted to JSON Schema once per API and checked with `jsonschema`: objects accept
only the properties the document lists (maps: `additionalProperties`), int64 fields are strings of
digits (or JSON integers, which Google's parser also accepts), enums are closed. Fields a method
requires come from the documents' `annotations.required` (Compute's way of saying it).
"""

from __future__ import annotations

import functools
import json
import re
import urllib.parse
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema

DOCS = Path(__file__).resolve().parents[1] / "data" / "google-discovery"
#: What the fake serves, by URL prefix: (prefix, discovery document).
APIS = [("/compute/v1/", "compute.v1"), ("/v2/", "tpu.v2"), ("/v2alpha1/", "tpu.v2alpha1"),
        ("/v1beta1/", "serviceusage.v1beta1")]
#: google.rpc.Code names and the HTTP status each maps to (AIP-193, google/rpc/code.proto).
GRPC_HTTP = {"INVALID_ARGUMENT": 400, "FAILED_PRECONDITION": 400, "OUT_OF_RANGE": 400,
             "UNAUTHENTICATED": 401, "PERMISSION_DENIED": 403, "NOT_FOUND": 404,
             "ALREADY_EXISTS": 409, "ABORTED": 409, "RESOURCE_EXHAUSTED": 429, "CANCELLED": 499,
             "UNKNOWN": 500, "INTERNAL": 500, "DATA_LOSS": 500, "UNIMPLEMENTED": 501,
             "UNAVAILABLE": 503, "DEADLINE_EXCEEDED": 504}


@dataclass(frozen=True)
class Method:
    id: str
    document: str
    http_method: str
    regex: re.Pattern[str]
    template: str
    spec: dict[str, Any]


class Violation(ValueError):
    """A request or response the reference rejects; the message names the field and the rule."""


def _pattern_regex(template: str) -> str:
    out, pos = "", 0
    for match in re.finditer(r"\{(\+?)([^}]+)\}", template):
        out += re.escape(template[pos:match.start()])
        name = re.sub(r"\W", "_", match.group(2))
        out += f"(?P<{name}>.+)" if match.group(1) else f"(?P<{name}>[^/:]+)"
        pos = match.end()
    return out + re.escape(template[pos:])


def _convert(schema: dict[str, Any]) -> dict[str, Any]:
    """One discovery schema as JSON Schema (refs point into `$defs`)."""
    if "$ref" in schema:
        return {"$ref": f"#/$defs/{schema['$ref']}"}
    kind = schema.get("type")
    out: dict[str, Any] = {}
    if kind == "any" or kind is None:
        return out
    if kind == "object":
        out["type"] = "object"
        if "properties" in schema:
            out["properties"] = {k: _convert(v) for k, v in schema["properties"].items()}
        if "additionalProperties" in schema:
            out["additionalProperties"] = _convert(schema["additionalProperties"])
        elif "properties" in schema:
            out["additionalProperties"] = False
    elif kind == "array":
        out["type"] = "array"
        if "items" in schema:
            out["items"] = _convert(schema["items"])
    elif kind == "string" and schema.get("format") in ("int64", "uint64"):
        out.update(type=["string", "integer"], pattern=r"^-?[0-9]+$")
    elif kind == "integer":
        out["type"] = "integer"
    elif kind in ("string", "number", "boolean"):
        out["type"] = kind
    if "enum" in schema:
        out["enum"] = list(schema["enum"])
    return out


class Document:
    def __init__(self, name: str) -> None:
        self.name = name
        self.raw: dict[str, Any] = json.loads((DOCS / f"{name}.json").read_text())
        self.defs = {k: _convert(v) for k, v in self.raw.get("schemas", {}).items()}
        self.methods: list[Method] = []
        self._walk(self.raw)

    def _walk(self, resource: dict[str, Any]) -> None:
        for spec in resource.get("methods", {}).values():
            template = spec.get("flatPath") or spec["path"]
            self.methods.append(Method(spec["id"], self.name, spec["httpMethod"],
                                       re.compile(_pattern_regex(template)), spec["path"], spec))
        for child in resource.get("resources", {}).values():
            self._walk(child)

    @functools.cache  # noqa: B019 (documents live as long as the process)
    def validator(self, schema: str) -> jsonschema.protocols.Validator:
        root = {"$ref": f"#/$defs/{schema}", "$defs": self.defs}
        return jsonschema.Draft202012Validator(root)


@functools.cache
def document(name: str) -> Document:
    return Document(name)


@functools.lru_cache(maxsize=1)
def error_validator() -> jsonschema.protocols.Validator:
    return jsonschema.Draft202012Validator(json.loads((DOCS / "error_schema.json").read_text()))


def _first_error(validator: jsonschema.protocols.Validator, data: Any, what: str) -> None:
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is not None:
        where = ".".join(str(p) for p in error.absolute_path) or "(top level)"
        raise Violation(f"{what}: field {where}: {error.message} (rule: {error.validator})")


def _scalar(name: str, value: str, spec: dict[str, Any], what: str) -> None:
    kind = spec.get("type", "string")
    if kind == "integer":
        if not re.fullmatch(r"-?[0-9]+", value):
            raise Violation(f"{what}: parameter {name}={value!r}: not an integer (rule: type)")
        number = int(value)
        if "minimum" in spec and number < int(spec["minimum"]):
            raise Violation(f"{what}: parameter {name}={value}: below {spec['minimum']} "
                            "(rule: minimum)")
        if "maximum" in spec and number > int(spec["maximum"]):
            raise Violation(f"{what}: parameter {name}={value}: above {spec['maximum']} "
                            "(rule: maximum)")
    elif kind == "boolean" and value not in ("true", "false", "True", "False"):
        raise Violation(f"{what}: parameter {name}={value!r}: not a boolean (rule: type)")
    if "enum" in spec and value not in spec["enum"]:
        raise Violation(f"{what}: parameter {name}={value!r}: not one of {spec['enum']} "
                        "(rule: enum)")
    pattern = spec.get("pattern")
    if pattern and not re.fullmatch(f"(?:{pattern.removeprefix('^').removesuffix('$')})", value):
        raise Violation(f"{what}: parameter {name}={value!r}: does not match {pattern!r} "
                        "(rule: pattern)")


def _required_fields(doc: Document, schema: dict[str, Any], data: Any, method: str,
                     where: str) -> None:
    """Compute marks fields a method needs with `annotations.required: [method id]`."""
    if "$ref" in schema:
        schema = doc.raw["schemas"][schema["$ref"]]
    if isinstance(data, list):
        for item in data:
            _required_fields(doc, schema.get("items", {}), item, method, where)
        return
    if not isinstance(data, dict):
        return
    for key, prop in (schema.get("properties") or {}).items():
        if method in (prop.get("annotations") or {}).get("required", []) and key not in data:
            raise Violation(f"{method}: field {where}{key} is required (rule: required)")
        if key in data:
            _required_fields(doc, prop, data[key], method, f"{where}{key}.")


class Contract:
    """Finds and checks methods; `Violation` for anything the reference rejects."""

    def find(self, http_method: str, path: str) -> tuple[Method, dict[str, str]]:
        for prefix, name in APIS:
            if not path.startswith(prefix):
                continue
            doc = document(name)
            rest = path.removeprefix("/compute/v1/") if name == "compute.v1" else path[1:]
            found = [m for m in doc.methods if m.regex.fullmatch(rest)]
            verb = [m for m in found if m.http_method == http_method]
            if not verb:
                raise Violation(f"{http_method} {path}: no method of {name} has this path and verb "
                                f"(rule: method; paths match {[m.id for m in found] or 'nothing'})")
            method = min(verb, key=lambda m: -len(m.regex.pattern))
            values = re.fullmatch(_pattern_regex(method.template), rest)
            params = ({k: urllib.parse.unquote(v) for k, v in values.groupdict().items()}
                      if values else {})
            return method, params
        raise Violation(f"{http_method} {path}: not a path of any API the fake serves (rule: method)")

    def request(self, http_method: str, path: str, query: dict[str, str],
                body: Any) -> Method:
        method, path_values = self.find(http_method, path)
        doc = document(method.document)
        params = method.spec.get("parameters", {})
        for name, value in path_values.items():
            spec = params.get(name)
            if spec is not None:
                _scalar(name, value, spec, method.id)
        known = {**doc.raw.get("parameters", {}),
                 **{k: v for k, v in params.items() if v.get("location") == "query"}}
        for name, value in query.items():
            if name not in known:
                raise Violation(f"{method.id}: unknown query parameter {name!r} (rule: parameters)")
            _scalar(name, value, known[name], method.id)
        for name, spec in params.items():
            if spec.get("required") and spec.get("location") == "query" and name not in query:
                raise Violation(f"{method.id}: query parameter {name} is required (rule: required)")
        request = (method.spec.get("request") or {}).get("$ref")
        if request is None and body is not None:
            raise Violation(f"{method.id}: takes no request body (rule: request)")
        if request is not None:
            if body is None:
                raise Violation(f"{method.id}: needs a {request} body (rule: request)")
            _first_error(doc.validator(request), body, f"{method.id} request {request}")
            _required_fields(doc, {"$ref": request}, body, method.id, "")
        return method

    def response(self, method: Method | None, status: int, payload: Any) -> None:
        if status >= 400 or method is None:
            self.error(status, payload)
            return
        schema = (method.spec.get("response") or {}).get("$ref")
        doc = document(method.document)
        if schema is None:
            return
        _first_error(doc.validator(schema), payload, f"{method.id} response {schema}")
        if schema == "Operation" and method.document.startswith("tpu"):
            self._tpu_any(doc, payload, method.id)

    def _tpu_any(self, doc: Document, operation: dict[str, Any], what: str) -> None:
        """A TPU operation's `response`/`metadata` are `Any`: checked against the type they name."""
        for key in ("response", "metadata"):
            value = operation.get(key)
            if not isinstance(value, dict):
                continue
            kind = str(value.get("@type", "")).rsplit(".", 1)[-1]
            if kind in doc.defs:
                inner = {k: v for k, v in value.items() if k != "@type"}
                _first_error(doc.validator(kind), inner, f"{what} {key} ({kind})")

    def error(self, status: int, payload: Any) -> None:
        _first_error(error_validator(), payload, f"HTTP {status} error body")
        body = payload["error"]
        if body["code"] != status:
            raise Violation(f"HTTP {status} error body: field error.code is {body['code']} "
                            "(rule: code equals the HTTP status)")
        name = body.get("status")
        if name is not None and GRPC_HTTP.get(name) != status:
            raise Violation(f"HTTP {status} error body: field error.status {name} maps to HTTP "
                            f"{GRPC_HTTP.get(name)} (rule: google.rpc.Code mapping)")
