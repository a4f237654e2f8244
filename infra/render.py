"""Rendering templates, and checking rendered Ray cluster YAMLs with Ray's own code.

Templates are strict: a missing variable is an error, never an empty string. Values that land in
YAML go through `tojson` (JSON is valid YAML, so a hostile name cannot add keys) and values that
land in a shell command go through `shq` (shlex quoting) first.
"""

from __future__ import annotations

import copy
import functools
import json
import shlex
from typing import Any

from infra import paths
from infra.errors import RayfleetError


class RenderError(RayfleetError):
    """A template failed to render or its output failed Ray's validation."""


def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _shq(value: Any) -> str:
    return shlex.quote(str(value))


def _shjoin(values: list[Any]) -> str:
    return " ".join(_shq(v) for v in values)


@functools.lru_cache(maxsize=1)
def _environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["tojson"] = _tojson
    env.filters["shq"] = _shq
    env.filters["shjoin"] = _shjoin
    return env


def render(template: str, **context: Any) -> str:
    """Render `templates/<template>` with exactly the variables given."""
    import jinja2

    try:
        return str(_environment().get_template(template).render(**context))
    except jinja2.UndefinedError as exc:
        raise RenderError(f"templates/{template}: {exc.message}; pass it from the provider") from None
    except jinja2.TemplateError as exc:
        raise RenderError(f"templates/{template}: {exc}") from None


def validate_ray_cluster_config(text: str, source: str) -> dict[str, Any]:
    """Run Ray's offline checks on a rendered cluster YAML; return the prepared config.

    The same steps `ray up` takes before it contacts anything: prepare_config (defaults, node
    types), the provider class's resource fill-in, then the JSON schema and cross-field checks.
    """
    import logging

    import yaml
    from ray.autoscaler._private.providers import _get_node_provider_cls
    from ray.autoscaler._private.util import prepare_config, validate_config

    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RenderError(f"{source}: rendered YAML does not parse: {exc}") from None
    # Ray logs its default-filling at INFO ("setting max workers..."): noise for our users.
    logging.getLogger("ray.autoscaler").setLevel(logging.WARNING)
    try:
        prepared = prepare_config(copy.deepcopy(config))
        provider_cls = _get_node_provider_cls(prepared["provider"])
        prepared = provider_cls.fillout_available_node_types_resources(prepared)
        validate_config(prepared)
    except Exception as exc:  # Ray raises jsonschema, Value and Runtime errors alike.
        message = getattr(exc, "message", None) or str(exc)
        path = "/".join(str(p) for p in getattr(exc, "absolute_path", []) or [])
        where = f" at {path}" if path else ""
        first_line = message.splitlines()[0] if message else type(exc).__name__
        raise RenderError(f"{source}: Ray rejects the cluster config{where}: {first_line}") from None
    return dict(prepared)
