"""Rendering templates, and checking rendered Ray cluster YAMLs with Ray's own code.

Templates are strict: a missing variable is an error, never an empty string. Values that land in
YAML go through `tojson` (JSON is valid YAML, so a hostile name cannot add keys) and values that
land in a shell command go through `shq` (shlex quoting) first.

Shell templates (every one not named *.yaml.j2) quote by default: whatever a `{{ }}` prints is
shell-quoted unless a filter below already made it shell text (`Shell`), so a value someone
forgot to quote is still one word. Where quoting is not what the spot needs, the filter says what
it is and checks it: `varname` (an assignment's name), `integer` (inside `$(( ))`, where bash
would expand a `$(...)` even in quotes), `expand` (our own text inside double quotes, whose only
`$` are variables), `heredoc` (a quoted here-document's body), `sbatch` (one #SBATCH word),
`comment` (one line of a comment), `shpath` (a path, `~/` kept as $HOME), `word` (our own
plain word, `~` and all). In a YAML template no value may span lines: a newline there could end a
block scalar and start a key; only `command` writes one, a folded block that it read back.
tests/test_template_quoting.py renders every template with hostile values and runs what comes
out.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shlex
from typing import Any

from infra.core import paths
from infra.core.errors import RayfleetError
from infra.node import shell
from infra.node.shell import Shell as Shell  # the one mark of shell text (infra/node/shell.py)
from infra.node.where import home_path


class RenderError(RayfleetError):
    """A template failed to render or its output failed Ray's validation."""




def _tojson(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


class _Block(str):
    """A YAML block scalar that `command` built and checked: the one value allowed to span lines."""


#: How long a line `command` leaves as it is (a person reads the rest folded).
FOLD_AT = 100


def _command(value: Any, indent: int = 4) -> str:
    """A one-line shell command as a YAML list item's value: JSON when short, else a folded block
    (`>-`, lines of whole words under FOLD_AT) that reads back as exactly the same string (checked
    here; JSON when it would not)."""
    import yaml

    text = json.dumps(value, ensure_ascii=False)
    line = str(value)
    if len(text) + indent <= FOLD_AT or "\n" in line or "\r" in line:
        return text
    lines: list[str] = []
    for word in line.split(" "):
        if lines and len(lines[-1]) + 1 + len(word) + indent <= FOLD_AT:
            lines[-1] += " " + word
        else:
            lines.append(word)
    pad = " " * indent
    block = ">-\n" + "\n".join(pad + part for part in lines)
    try:
        same = yaml.safe_load(f"k:\n{pad[2:]}- {block}\n") == {"k": [line]}
    except yaml.YAMLError:
        same = False
    return _Block(block) if same else text


def _shq(value: Any) -> Shell:
    return Shell(shlex.quote(str(value)))


def _shjoin(values: list[Any]) -> Shell:
    return Shell(" ".join(_shq(v) for v in values))


def shell_path(path: Any) -> Shell:
    """A path as one shell word: `~/x` becomes "$HOME"/x (quoting would stop `~` expanding)."""
    return Shell(home_path(str(path)))


_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: What `expand` lets through: plain characters, and `$` only as $NAME, ${NAME}, $((NAME + 12)).
_EXPANDABLE = shell.EXPANDABLE


def _varname(value: Any) -> Shell:
    if not isinstance(value, str) or not _NAME.fullmatch(value):
        raise RenderError(f"{value!r} is not a shell variable name")
    return Shell(value)


def _integer(value: Any) -> Shell:
    if isinstance(value, bool) or not isinstance(value, int):
        raise RenderError(f"{value!r} is not an integer (it lands in shell arithmetic)")
    return Shell(str(value))


def _expand(value: Any) -> Shell:
    """Our own text for inside double quotes, where its $NAME parts are meant to expand."""
    if not isinstance(value, str) or not _EXPANDABLE.fullmatch(value):
        raise RenderError(f"{value!r} cannot go inside double quotes (only $NAME, ${{NAME}} and "
                          "$((NAME + N)) may expand there)")
    return Shell(value)


def _heredoc(value: Any, delimiter: str) -> Shell:
    """The body of a `<<'DELIMITER'` here-document: literal, unless a line ends it early."""
    text = str(value)
    if delimiter in text.splitlines():
        raise RenderError(f"a here-document's body contains its end line {delimiter}")
    return Shell(text)


def _sbatch(value: Any) -> Shell:
    """One #SBATCH option: a word sbatch reads whole, and no newline (the next line is bash)."""
    text = str(value)
    if not text or re.search(r"[\s'\"\\\x00-\x1f\x7f]", text):
        raise RenderError(f"#SBATCH option {text!r} must be one word without quotes")
    return Shell(text)


def _comment(value: Any) -> Shell:
    """Text for inside a `#` comment: control characters escaped, so it cannot end the line."""
    return Shell(re.sub(r"[\x00-\x1f\x7f]", lambda m: json.dumps(m.group())[1:-1], str(value)))


def _word(value: Any) -> Shell:
    """Our own one-word path or name, printed as is (a `~` in it still expands): checked, since
    quoting would stop the `~`."""
    text = str(value)
    if not re.fullmatch(r"[A-Za-z0-9_./~:@%+=,-]+", text):
        raise RenderError(f"{text!r} is not one plain shell word")
    return Shell(text)


def _finalize(context: Any, value: Any) -> Any:
    """What every `{{ }}` prints (see the module docstring)."""
    if context.name is None:  # a template from a string (tests): no kind to go by
        return value
    if context.name.endswith(".yaml.j2"):
        if isinstance(value, str) and not isinstance(value, _Block) and (
                "\n" in value or "\r" in value):
            raise RenderError(f"a value spans lines in a YAML template: {value[:60]!r}")
        return value
    if isinstance(value, Shell):
        return value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return shlex.quote(str(value))


@functools.lru_cache(maxsize=1)
def environment() -> Any:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
        finalize=jinja2.pass_context(_finalize),
    )
    env.filters.update(tojson=_tojson, shq=_shq, shjoin=_shjoin, shpath=shell_path, varname=_varname,
                       integer=_integer, expand=_expand, heredoc=_heredoc, sbatch=_sbatch,
                       comment=_comment, word=_word, command=_command)
    return env


def render(template: str, **context: Any) -> str:
    """Render `templates/<template>` with exactly the variables given."""
    import jinja2

    try:
        return str(environment().get_template(template).render(**context))
    except jinja2.UndefinedError as exc:
        raise RenderError(f"templates/{template}: {exc.message}; pass it from the provider") from None
    except RenderError as exc:
        raise RenderError(f"templates/{template}: {exc}") from None
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
